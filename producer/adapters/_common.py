"""What every adapter shares: where to grade, one-rollout calls, gold texts (a math
answer's, or a code row's tests encoded as its gold)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from producer.adapters.compat import code_gold, spec_gold
from producer.adapters.reward import RewardConfig
from producer.client.grading import BlockingGrader, grader_for
from workers.code.item import is_code_gold
from workers.models import GradeOptions, Status, Verdict, ungraded_verdict
from workers.wire.contract import MAX_TEXT_CHARS, text_error

__all__ = [
    "DEFAULT_DEADLINE_S",
    "code_gold",
    "gold_text",
    "grade_pairs_async",
    "grade_pairs_blocking",
    "reward_config",
    "spec_gold",
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


def _oversized(gold: str) -> Verdict | None:
    """The verdict of a code gold over the text limit (its tests cannot be cut
    without breaking them): `invalid_gold` here, so the batch it came with is
    graded as usual. None for a gold within the limit (a math gold is cut)."""
    if not is_code_gold(gold) or (error := text_error("", gold)) is None:
        return None
    reason = f"code tests: {error}"  # as the CLI says it of such a line
    return ungraded_verdict(Status.INVALID_GOLD, reason).replace(kind="code")


def _split(
    pairs: Sequence[tuple[str, str]],
) -> tuple[list[Verdict | None], list[tuple[str, str]]]:
    """(a verdict or None per pair, the pairs to grade with their texts cut)."""
    known = [_oversized(gold) for _, gold in pairs]
    todo = [
        (r[:MAX_TEXT_CHARS], g if is_code_gold(g) else g[:MAX_TEXT_CHARS])
        for (r, g), verdict in zip(pairs, known, strict=True)
        if verdict is None
    ]
    return known, todo


def _merge(known: list[Verdict | None], graded: list[Verdict]) -> list[Verdict]:
    found = iter(graded)
    return [verdict or next(found) for verdict in known]


async def grade_pairs_async(
    pairs: Sequence[tuple[str, str]], kwargs: Mapping[str, Any]
) -> list[Verdict]:
    """Grade on this process's shared coalescing grader (see `grader_for`)."""
    url, options, deadline_s = _settings(kwargs)
    grader = grader_for(url)
    known, todo = _split(pairs)
    graded = await grader.grade_pairs(todo, options=options, deadline_s=deadline_s)
    return _merge(known, graded)


def grade_pairs_blocking(
    pairs: Sequence[tuple[str, str]], kwargs: Mapping[str, Any]
) -> list[Verdict]:
    """The same from sync code: calls from all threads share one event loop."""
    url, options, deadline_s = _settings(kwargs)
    known, todo = _split(pairs)
    graded = BlockingGrader(url).grade_pairs(
        todo, options=options, deadline_s=deadline_s
    )
    return _merge(known, graded)
