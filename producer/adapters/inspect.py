"""Inspect AI scorer: `scorer=math_verdict()` in a task, or
`inspect score LOG.eval --scorer gradefleet/math_verdict` (registered through the
`inspect_ai` entry point in pyproject.toml).

The score mirrors Inspect's built-in `math` scorer so logs look native:
`Score(value=C|I, answer=<extracted>, explanation="<status>: <reason>",
metadata={"math_scorer_status": ..., "gradefleet_status": ..., ...})`. A sample whose
gold cannot be used (`invalid_gold`) is unscored, not wrong. With several targets the
sample is correct when any of them matches.

Inspect's call site (UKGovernmentBEIS/inspect_ai@499e615): a scorer is awaited per
sample as `await score(state, target)`; the completion is `state.output.completion`.
This module imports Inspect (its decorators register the scorer), so it is the one
adapter that needs its framework installed: `pip install inspect-ai`.
"""

from __future__ import annotations

from typing import Any

from inspect_ai.scorer import (
    CORRECT,
    INCORRECT,
    Score,
    Scorer,
    Target,
    accuracy,
    scorer,
    stderr,
)
from inspect_ai.solver import TaskState

from producer.adapters._common import grade_pairs_async
from workers.models import Status, Verdict

__all__ = ["math_verdict"]


def _best(verdicts: list[Verdict]) -> Verdict:
    for verdict in verdicts:
        if verdict.correct:
            return verdict
    usable = [v for v in verdicts if v.status is not Status.INVALID_GOLD]
    return (usable or verdicts)[0]


# Named with its namespace: Inspect finds "gradefleet/..." by loading the
# `gradefleet` entry point (the module's own package, `producer`, is not a
# distribution name, so Inspect would not namespace it by itself).
@scorer(metrics=[accuracy(), stderr()], name="gradefleet/math_verdict")
def math_verdict(
    grader_url: str | None = None,
    allow_fallback: bool = True,
    deadline_s: float | None = None,
) -> Scorer:
    """Grade the completion against the target(s) with gradefleet.

    Args:
        grader_url: `http(s)://` service or `redis://` fleet; default
            `GRADEFLEET_URL`, else an embedded pool.
        allow_fallback: let answers without an explicit marker count.
        deadline_s: longest wait per sample (default 300 s).
    """
    kwargs: dict[str, Any] = {"allow_fallback": allow_fallback}
    if grader_url:
        kwargs["grader_url"] = grader_url
    if deadline_s:
        kwargs["deadline_s"] = deadline_s

    async def score(state: TaskState, target: Target) -> Score:
        completion = state.output.completion
        golds = [gold for gold in target.target if isinstance(gold, str)] or [""]
        verdict = _best(
            await grade_pairs_async([(completion, g) for g in golds], kwargs)
        )
        explanation = f"{verdict.status.value}: {verdict.reason}"
        metadata = {
            "math_scorer_status": verdict.status.value,
            "gradefleet_status": verdict.status.value,
            "extraction_method": verdict.extraction_method.value,
            "verify_method": verdict.verify_method.value,
            "grader_version": verdict.grader_version,
        }
        if verdict.status is Status.INVALID_GOLD:
            return Score.unscored(
                reason="invalid_gold",
                answer=verdict.extracted,
                explanation=explanation,
                metadata=metadata,
            )
        return Score(
            value=CORRECT if verdict.correct else INCORRECT,
            answer=verdict.extracted,
            explanation=explanation,
            metadata=metadata,
        )

    return score
