"""The reward every adapter and the HTTP service give a verdict (pure, stdlib only).

One mapping for all front ends, so a verl run, a TRL run and the service agree on
what a verdict is worth: a score per status (default 1 for `correct`, 0 otherwise)
plus an optional small format reward (DeepSeek-R1 style: a bonus when the answer came
with an explicit final-answer marker, `format_valid`), and for code rollouts, when
asked, partial credit: the fraction of tests passed between the wrong and correct
scores (verl's `continuous`; the HTTP service's `score` is this reward, so without it
a code verdict's own fraction is there only as `tests_passed / tests_total`).
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
        code_partial_credit: a graded code rollout scores `wrong` + (`correct` -
            `wrong`) x the fraction of its tests passed, not all-or-nothing.
    """

    status_scores: Mapping[str, float] = field(default_factory=_default_scores)
    format_reward: float = 0.0
    code_partial_credit: bool = False

    def score(self, verdict: Verdict) -> float:
        base = float(self.status_scores.get(verdict.status.value, 0.0))
        if (
            self.code_partial_credit
            and verdict.kind == "code"
            and verdict.status in (Status.CORRECT, Status.WRONG)
            and verdict.tests_total
        ):
            low = float(self.status_scores.get(Status.WRONG.value, 0.0))
            high = float(self.status_scores.get(Status.CORRECT.value, 1.0))
            passed = (verdict.tests_passed or 0) / verdict.tests_total
            base = low + (high - low) * passed
        return base + (self.format_reward if verdict.format_valid else 0.0)

    def updated(self, overrides: Mapping[str, Any]) -> RewardConfig:
        """A copy with `correct_score`/`wrong_score`/.../`format_reward`/
        `code_partial_credit` overrides (the keyword names adapters accept from a
        framework's reward kwargs)."""
        scores = dict(self.status_scores)
        format_reward = self.format_reward
        partial = self.code_partial_credit
        for name, value in overrides.items():
            if name == "format_reward":
                format_reward = float(value)
            elif name == "code_partial_credit":
                partial = _flag(value)
            elif name.endswith("_score") and name[: -len("_score")] in scores:
                scores[name[: -len("_score")]] = float(value)
        return RewardConfig(
            status_scores=scores,
            format_reward=format_reward,
            code_partial_credit=partial,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RewardConfig:
        """`GRADEFLEET_FORMAT_REWARD`, `GRADEFLEET_<STATUS>_SCORE` and
        `GRADEFLEET_CODE_PARTIAL_CREDIT` (entry points)."""
        env = os.environ if environ is None else environ
        overrides: dict[str, str] = {}
        if "GRADEFLEET_FORMAT_REWARD" in env:
            overrides["format_reward"] = env["GRADEFLEET_FORMAT_REWARD"]
        if "GRADEFLEET_CODE_PARTIAL_CREDIT" in env:
            overrides["code_partial_credit"] = env["GRADEFLEET_CODE_PARTIAL_CREDIT"]
        for status in Status:
            name = f"GRADEFLEET_{status.value.upper()}_SCORE"
            if name in env:
                overrides[f"{status.value}_score"] = env[name]
        return cls().updated(overrides)


def _flag(value: Any) -> bool:
    """A bool from a kwarg or an environment string ("1", "true", "yes", "on")."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


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
