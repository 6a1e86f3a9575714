"""The pure math verifier: extract, canonicalize, compare, grade (stdlib + SymPy only).

PLACEHOLDER implementation (compares the last \\boxed{} as a string) so the fleet can be
built in parallel; the verifier work replaces every function body, keeping the names.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.models import ExtractionMethod, GradeOptions, Status, Verdict, VerifyMethod

__all__ = [
    "GRADER_VERSION",
    "Prepared",
    "decide",
    "grade",
    "grade_answer",
    "prepare",
]

GRADER_VERSION = "gradefleet-0.1.0+sympy-1.14.0"


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """Extraction and canonical forms of one (response, gold) pair, before deciding.

    `decision_key` fully determines every answer-dependent verdict field (all but
    `extracted`, `extraction_method`, `format_valid`, `cached`): two pairs with equal
    keys get equal decisions. None means "do not cache".
    """

    extracted: str | None
    extraction_method: ExtractionMethod
    format_valid: bool
    canonical_pred: str | None
    canonical_gold: str | None
    decision_key: str | None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def prepare(response: str, gold: str, *, options: GradeOptions | None = None) -> Prepared:
    pred = _last_boxed(response)
    g = _last_boxed(gold) or gold.strip()
    method = ExtractionMethod.BOXED if pred is not None else ExtractionMethod.NONE
    key = None if pred is None else f"{pred}\x00{g}"
    return Prepared(
        extracted=pred,
        extraction_method=method,
        format_valid=pred is not None,
        canonical_pred=pred,
        canonical_gold=g,
        decision_key=key,
    )


def decide(prepared: Prepared, *, options: GradeOptions | None = None) -> Verdict:
    if prepared.extracted is None:
        status = Status.NO_ANSWER
    else:
        status = Status.CORRECT if prepared.extracted == prepared.canonical_gold else Status.WRONG
    return Verdict(
        correct=status is Status.CORRECT,
        status=status,
        format_valid=prepared.format_valid,
        extracted=prepared.extracted,
        extraction_method=prepared.extraction_method,
        canonical_pred=prepared.canonical_pred,
        canonical_gold=prepared.canonical_gold,
        verify_method=VerifyMethod.EXACT,
        reason="placeholder",
        grader_version=GRADER_VERSION,
    )


def grade(response: str, gold: str, *, options: GradeOptions | None = None) -> Verdict:
    return decide(prepare(response, gold, options=options), options=options)


def grade_answer(answer: str, gold: str, *, options: GradeOptions | None = None) -> Verdict:
    return grade(f"\\boxed{{{answer}}}", gold, options=options)
