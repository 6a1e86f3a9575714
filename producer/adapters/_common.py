"""What every adapter shares: where to grade, one-rollout calls, gold texts."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from producer.adapters.reward import RewardConfig
from producer.client.grading import BlockingGrader, grader_for
from workers.models import GradeOptions, Verdict
from workers.wire.contract import MAX_TEXT_CHARS

__all__ = [
    "DEFAULT_DEADLINE_S",
    "gold_text",
    "grade_pairs_async",
    "grade_pairs_blocking",
    "reward_config",
]

# verl's rate-limited reward manager gives a sample 300 s (`reward_model.timeout`);
# a reward call never waits longer, and an item still ungraded then is `timeout`.
DEFAULT_DEADLINE_S = 300.0
DEADLINE_ENV = "GRADEFLEET_DEADLINE_S"
# Keyword arguments an adapter takes for itself; everything else a framework passes
# (reward_router_address, trainer_state, ...) is ignored.
_OWN_KWARGS = ("grader_url", "deadline_s", "allow_fallback")


def gold_text(value: object) -> str | None:
    """A gold answer as text (numbers are common in datasets); None if unusable."""
    if isinstance(value, str):
        return value[:MAX_TEXT_CHARS]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def reward_config(kwargs: Mapping[str, Any]) -> RewardConfig:
    """The env's reward mapping with per-call overrides (`format_reward`,
    `correct_score`, ...) from a framework's reward kwargs."""
    return RewardConfig.from_env().updated(kwargs)


def _settings(kwargs: Mapping[str, Any]) -> tuple[str | None, GradeOptions, float]:
    url = kwargs.get("grader_url")
    deadline_s = float(
        kwargs.get("deadline_s") or os.environ.get(DEADLINE_ENV) or DEFAULT_DEADLINE_S
    )
    options = GradeOptions(allow_fallback=bool(kwargs.get("allow_fallback", True)))
    return (str(url) if url else None), options, deadline_s


async def grade_pairs_async(
    pairs: Sequence[tuple[str, str]], kwargs: Mapping[str, Any]
) -> list[Verdict]:
    """Grade on this process's shared coalescing grader (see `grader_for`)."""
    url, options, deadline_s = _settings(kwargs)
    grader = grader_for(url)
    return await grader.grade_pairs(
        [(r[:MAX_TEXT_CHARS], g) for r, g in pairs],
        options=options,
        deadline_s=deadline_s,
    )


def grade_pairs_blocking(
    pairs: Sequence[tuple[str, str]], kwargs: Mapping[str, Any]
) -> list[Verdict]:
    """The same from sync code: calls from all threads share one event loop."""
    url, options, deadline_s = _settings(kwargs)
    return BlockingGrader(url).grade_pairs(
        [(r[:MAX_TEXT_CHARS], g) for r, g in pairs],
        options=options,
        deadline_s=deadline_s,
    )
