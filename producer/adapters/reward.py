"""The reward every adapter and the HTTP service give a verdict (pure, stdlib only).

One mapping for all front ends, so a verl run, a TRL run and the service agree on
what a verdict is worth: a score per status (default 1 for `correct`, 0 otherwise)
plus an optional small format reward (DeepSeek-R1 style: a bonus when the answer came
with an explicit final-answer marker, `format_valid`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.models import Status, Verdict

__all__ = ["RESULT_KEYS", "RewardConfig", "result_dict"]

# Every adapter's dict result has exactly these keys, on every call: verl collects
# each key per sample into `reward_extra_info` and breaks when samples disagree.
RESULT_KEYS = (
    "score",
    "acc",
    "pred",
    "status",
    "format_valid",
    "reason",
    "grader_version",
)


def _default_scores() -> dict[str, float]:
    return {status.value: 1.0 if status is Status.CORRECT else 0.0 for status in Status}


@dataclass(frozen=True, slots=True, kw_only=True)
class RewardConfig:
    """How a verdict becomes a number.

    Attributes:
        status_scores: score per status value; statuses left out score 0.
        format_reward: added when the answer carried an explicit final-answer marker
            (`format_valid`), whatever the status; 0 turns it off.
    """

    status_scores: Mapping[str, float] = field(default_factory=_default_scores)
    format_reward: float = 0.0

    def score(self, verdict: Verdict) -> float:
        base = float(self.status_scores.get(verdict.status.value, 0.0))
        return base + (self.format_reward if verdict.format_valid else 0.0)

    def updated(self, overrides: Mapping[str, Any]) -> RewardConfig:
        """A copy with `correct_score`/`wrong_score`/.../`format_reward` overrides
        (the keyword names adapters accept from a framework's reward kwargs)."""
        scores = dict(self.status_scores)
        format_reward = self.format_reward
        for name, value in overrides.items():
            if name == "format_reward":
                format_reward = float(value)
            elif name.endswith("_score") and name[: -len("_score")] in scores:
                scores[name[: -len("_score")]] = float(value)
        return RewardConfig(status_scores=scores, format_reward=format_reward)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RewardConfig:
        """`GRADEFLEET_FORMAT_REWARD` and `GRADEFLEET_<STATUS>_SCORE` (entry points)."""
        env = os.environ if environ is None else environ
        overrides: dict[str, str] = {}
        if "GRADEFLEET_FORMAT_REWARD" in env:
            overrides["format_reward"] = env["GRADEFLEET_FORMAT_REWARD"]
        for status in Status:
            name = f"GRADEFLEET_{status.value.upper()}_SCORE"
            if name in env:
                overrides[f"{status.value}_score"] = env[name]
        return cls().updated(overrides)


def result_dict(verdict: Verdict, reward: RewardConfig) -> dict[str, Any]:
    """The fixed-key result (`RESULT_KEYS`) adapters return for one rollout."""
    return {
        "score": reward.score(verdict),
        "acc": verdict.correct,
        "pred": verdict.extracted or "",
        "status": verdict.status.value,
        "format_valid": verdict.format_valid,
        "reason": verdict.reason,
        "grader_version": verdict.grader_version,
    }
