"""Inspect AI scorers: `scorer=math_verdict()` / `scorer=unit_tests()` in a task, or
`inspect score LOG.eval --scorer gradefleet/math_verdict` (or `gradefleet/unit_tests`),
registered through the `inspect_ai` entry point in pyproject.toml.

The score mirrors Inspect's built-in `math` scorer so logs look native:
`Score(value=C|I, answer=<extracted>, explanation="<status>: <reason>",
metadata={"math_scorer_status": ..., "gradefleet_status": ..., ...})`. A sample whose
gold cannot be used (`invalid_gold`) is unscored, not wrong. With several targets the
sample is correct when any of them matches.

`unit_tests` is the seed's `unit_test_scorer` shape without Docker: the code is
extracted from the completion and run against the sample's tests in gradefleet's own
sandbox (wherever the grader runs it: embedded, fleet or service). Where the tests
come from, first found wins:
1. the sample's metadata, when it holds a dataset row's test fields (any field
   `gradefleet grade` reads a code row by: `test` + `entry_point` + `prompt` as
   HumanEval keeps them, `test_list` as MBPP does, `input_output`,
   `verifier_metadata.unit_tests`, ...);
2. the target, when it is a JSON object of those fields
   (`{"input_output": {"inputs": [...], "outputs": [...]}}`);
3. the target as test code: with an `entry_point` in the metadata it is HumanEval's
   `check(candidate)` (`test`), else one assert script run after the program.
Score: value C/I (C only when every test passed), answer = the program extracted,
explanation = the counts and the first failing test, metadata = `gradefleet_status`,
`tests_passed`, `tests_total`, `score` (fraction passed), `failure`,
`grader_version`. Unusable tests (none, malformed) leave the sample unscored.

Inspect's call site (UKGovernmentBEIS/inspect_ai@499e615): a scorer is awaited per
sample as `await score(state, target)`; the completion is `state.output.completion`.
This module imports Inspect (its decorators register the scorer), so it is the one
adapter that needs its framework installed: `pip install inspect-ai`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
from workers.code.item import encode_code_gold, is_code_row
from workers.models import Status, Verdict

__all__ = ["code_tests_row", "math_verdict", "unit_tests"]


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


def code_tests_row(
    metadata: Mapping[str, Any] | None, target: str
) -> dict[str, Any] | None:
    """The test fields of a sample (the module docstring's order), or None."""
    meta = dict(metadata or {})
    if is_code_row(meta):
        return meta
    text = target.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except ValueError:
            spec = None
        if isinstance(spec, dict) and is_code_row(spec):
            return spec
    if not text:
        return None
    extras: dict[str, Any] = {
        k: meta[k] for k in ("prompt", "entry_point") if k in meta
    }
    if "entry_point" in extras:
        return {"test": target, **extras}
    return {"test_list": [target], **extras}


def _program(completion: str, row: Mapping[str, Any]) -> str | None:
    from workers.code.program import extract_program

    prompt, entry = row.get("prompt"), row.get("entry_point")
    return extract_program(
        completion,
        prompt if isinstance(prompt, str) else None,
        entry if isinstance(entry, str) else None,
    )


def _tests_explanation(verdict: Verdict, row: Mapping[str, Any]) -> str:
    from workers.code.describe import describe_failure

    first = describe_failure(row, verdict.failure)
    if first is None or verdict.tests_total is None:
        return f"{verdict.status.value}: {verdict.reason}"
    counts = f"{verdict.tests_passed}/{verdict.tests_total} tests passed"
    return f"{verdict.status.value}: {counts}; first failing {first}"


@scorer(metrics=[accuracy(), stderr()], name="gradefleet/unit_tests")
def unit_tests(
    grader_url: str | None = None,
    deadline_s: float | None = None,
) -> Scorer:
    """Run the completion's code against the sample's unit tests in gradefleet's
    sandbox (no Docker); see the module docstring for where the tests come from.

    Args:
        grader_url: `http(s)://` service or `redis://` fleet; default
            `GRADEFLEET_URL`, else an embedded pool.
        deadline_s: longest wait per sample (default 300 s).
    """
    kwargs: dict[str, Any] = {}
    if grader_url:
        kwargs["grader_url"] = grader_url
    if deadline_s:
        kwargs["deadline_s"] = deadline_s

    async def score(state: TaskState, target: Target) -> Score:
        completion = state.output.completion
        row = code_tests_row(state.metadata, target.text)
        if row is None:
            return Score.unscored(
                reason="invalid_gold",
                explanation="invalid_gold: the sample has no unit tests",
                metadata={"gradefleet_status": "invalid_gold"},
            )
        (verdict,) = await grade_pairs_async(
            [(completion, encode_code_gold(row))], kwargs
        )
        answer = _program(completion, row)
        metadata = {
            "gradefleet_status": verdict.status.value,
            "tests_passed": verdict.tests_passed,
            "tests_total": verdict.tests_total,
            "score": verdict.score,
            "failure": verdict.failure,
            "grader_version": verdict.grader_version,
        }
        explanation = _tests_explanation(verdict, row)
        if verdict.status is Status.INVALID_GOLD:
            return Score.unscored(
                reason="invalid_gold",
                answer=answer,
                explanation=explanation,
                metadata=metadata,
            )
        return Score(
            value=CORRECT if verdict.correct else INCORRECT,
            answer=answer,
            explanation=explanation,
            metadata=metadata,
        )

    return score
