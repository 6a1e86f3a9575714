"""Decision boundaries of equivalence (seed 002's checklist for a verifier)."""

from __future__ import annotations

import time

import pytest

from workers.models import Status
from workers.verifier import grade, grade_answer


# --- a canonical correct answer ----------------------------------------------------
def test_boundary_canonical_correct() -> None:
    verdict = grade(r"The answer is $\boxed{42}$.", "42")
    assert verdict.correct
    assert verdict.format_valid


# --- valid alternative representations ------------------------------------------
@pytest.mark.parametrize(
    "response",
    [r"\boxed{42.0}", r"\boxed{\frac{84}{2}}", r"\boxed{4.2\times 10^{1}}",
     "Answer: 42",
     r"\boxed{42\text{ apples}}", r"\boxed{x = 42}", r"\boxed{\left(42\right)}"],
)  # fmt: skip
def test_boundary_alternative_forms(response: str) -> None:
    assert grade(response, "42").correct


# --- near misses stay incorrect -------------------------------------------------
@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (r"\boxed{41}", "42"),
        (r"\boxed{42.1}", "42"),
        (r"\boxed{420}", "42"),
        (r"\boxed{-42}", "42"),
        (r"\boxed{\frac{1}{2^{99}}}", r"\frac{1}{2^{98}}"),
        (r"\boxed{2^{100}}", "2^{100}+1"),
        (r"\boxed{(1,2)}", "[1,2]"),
        (r"\boxed{3 = 3}", "3"),
        (r"\boxed{1,2}", "1,2,3"),
    ],
)
def test_boundary_near_misses(response: str, gold: str) -> None:
    verdict = grade(response, gold)
    assert verdict.status is Status.WRONG, verdict.reason


# --- missing, malformed, ambiguous -------------------------------------------------
def test_boundary_missing_answer() -> None:
    assert grade("Let me think about this problem.", "42").status is Status.NO_ANSWER
    assert grade(r"so the answer is \boxed{}", "42").status is Status.NO_ANSWER


@pytest.mark.parametrize(
    "response",
    [r"\boxed{\frac{42}}", r"\boxed{(42}", r"\boxed{4 2 +}", r"\boxed{\mathcal{Q}}"],
)
def test_boundary_malformed_answer_is_unsupported(response: str) -> None:
    verdict = grade(response, "42")
    assert verdict.status is Status.UNSUPPORTED, verdict.reason
    assert not verdict.correct


def test_boundary_ambiguous_answers_are_not_credited() -> None:
    assert not grade(r"\boxed{41 or 42}", "42").correct  # two answers to one question
    assert not grade(r"\boxed{42 \pm 1}", "42").correct
    assert grade(r"\boxed{41 or 42}", "41, 42").correct  # ... unless both are asked


# --- multiple final-answer markers -----------------------------------------------
def test_boundary_multiple_markers_last_box_wins() -> None:
    assert grade(r"\boxed{41} wait, no: \boxed{42}", "42").correct
    assert not grade(r"\boxed{42} wait, no: \boxed{41}", "42").correct
    assert grade(r"<answer>\boxed{42}</answer>", "42").correct


# --- extreme values and deep nesting ---------------------------------------------
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("1e308", "10^{308}", Status.CORRECT),
        ("10^{400}", "10^{400}+1", Status.WRONG),
        ("1" * 401, "1", Status.UNSUPPORTED),  # 401 digits: over the literal cap
        ("10^{300}", "1" + "0" * 300, Status.CORRECT),
        ("-10^{300}", "-1" + "0" * 300, Status.CORRECT),
        (r"\frac{1}{10^{300}}", "10^{-300}", Status.CORRECT),
        (r"\frac{1}{10^{300}}", "0", Status.WRONG),
        ("9^{9^{9^9}}", "1", Status.UNSUPPORTED),
        ("(" * 5000 + "1" + ")" * 5000, "1", Status.UNSUPPORTED),
        ("(" * 30 + "1" + ")" * 30, "1", Status.CORRECT),
        ("1" * 100_000, "1", Status.UNSUPPORTED),
    ],
    ids=lambda v: repr(v)[:24],
)
def test_boundary_extreme_values(answer: str, gold: str, status: Status) -> None:
    start = time.perf_counter()
    verdict = grade_answer(answer, gold)
    assert time.perf_counter() - start < 0.5
    assert verdict.status is status, verdict.reason


def test_boundary_deeply_nested_response_is_fast() -> None:
    start = time.perf_counter()
    verdict = grade(r"\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "1")
    assert time.perf_counter() - start < 1.0
    assert verdict.status is Status.UNSUPPORTED


# --- empty output and unexpected content ---------------------------------------
@pytest.mark.parametrize(
    "response",
    ["", "   ", "\n\n", "\x00\x01\x02", "\ud800", "🙂" * 100, "$$", r"\boxed"],
)
def test_boundary_empty_or_odd_output(response: str) -> None:
    verdict = grade(response, "42")
    assert verdict.status in {Status.NO_ANSWER, Status.UNSUPPORTED}
    assert not verdict.correct
