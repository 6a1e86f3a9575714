"""Every assert of the cookbook seed (seeds/000), expressed through our API.

The seed's functions map onto ours: extract_boxed/extract_candidate -> `grade` (its
`extracted` field), canonicalize -> canonical forms compared by `grade_answer`,
symbolic_equal and grade -> `grade_answer(...).correct`.
"""

from __future__ import annotations

import time

from workers.models import ExtractionMethod, Status
from workers.verifier import grade, grade_answer


# --- 01_extract.py -------------------------------------------------------------
def test_cookbook_nested_braces_do_not_truncate_the_box() -> None:
    verdict = grade(r"blah \boxed{\frac{1}{2}} trailing", "1/2")
    assert verdict.extracted == r"\frac{1}{2}"
    assert verdict.correct


def test_cookbook_no_box_and_no_number_is_no_answer() -> None:
    verdict = grade("no box here", "1")
    assert verdict.status is Status.NO_ANSWER
    assert verdict.extracted is None


def test_cookbook_unbalanced_box_is_not_a_box() -> None:
    verdict = grade(r"\boxed{unterminated", "1")
    assert not verdict.correct
    assert not verdict.format_valid
    assert verdict.extraction_method is not ExtractionMethod.BOXED


def test_cookbook_fallback_takes_a_stated_number() -> None:
    # The seed takes the last number ("41"); our extraction prefers the stated
    # answer phrase ("the answer is 42"). Both are fallbacks: format_valid is false.
    verdict = grade("the answer is 42, not 41", "42")
    assert verdict.correct
    assert not verdict.format_valid
    last = grade("we get 40, then 41", "41")
    assert last.correct
    assert last.extraction_method is ExtractionMethod.LAST_NUMBER


def test_cookbook_no_numbers_is_no_answer() -> None:
    assert grade("no numbers here", "7").status is Status.NO_ANSWER


# --- 02_canonicalize.py ----------------------------------------------------------
def test_cookbook_equivalent_latex_forms_collapse() -> None:
    assert grade_answer(r"\dfrac{14}{3}", "(14)/(3)").correct
    assert grade_answer(r"\text{\frac{14}{3}}", "(14)/(3)").correct
    assert grade_answer("1,234", "1234").correct
    assert grade_answer(r"90^\circ", "90").correct
    assert grade_answer(r"2^{3}", "2**3".replace("**", "^")).correct
    assert grade_answer(r"\dfrac{14}{3}", "14/3").canonical_pred == "(div 14 3)"


def test_cookbook_percent_divides_by_100() -> None:
    # The naive canonicalizer turns "50%" into "50" and misses gold 1/2.
    assert grade_answer("50%", r"\frac{1}{2}").correct
    assert grade_answer("50%", "0.5").correct
    assert grade_answer("50%", "(50/100)").correct
    assert grade_answer("50%", "50%").canonical_pred == "(pct 50)"


# --- 03_equivalence_and_grading.py ------------------------------------------------
def test_cookbook_symbolic_equal() -> None:
    assert grade_answer("(14)/(3)", "(14)/(3)").correct
    assert grade_answer("14/3", "28/6").correct
    assert grade_answer("0.5", "(1)/(2)").correct
    assert not grade_answer("14/3", "15/3").correct


def test_cookbook_multi_part_grading() -> None:
    assert grade_answer("(14/3, 2/3)", "(14/3, 4/6)").correct
    assert not grade_answer("(2, 1)", "(1, 2)").correct
    assert not grade_answer("(1, 2, 3)", "(1, 2)").correct


def test_cookbook_malformed_and_hostile_inputs_never_crash() -> None:
    assert grade_answer("", "1/2").status is Status.NO_ANSWER
    assert not grade_answer("not a number at all", "1/2").correct
    assert not grade_answer("1/0", "1/2").correct
    start = time.perf_counter()
    long_input = grade_answer("x" * 5000, "1/2")
    assert long_input.status is Status.UNSUPPORTED
    assert time.perf_counter() - start < 0.1


def test_cookbook_reward_function_wiring() -> None:
    completions = [r"so \boxed{14/3}", r"\boxed{\frac{28}{6}}", r"\boxed{5}", "none"]
    rewards = [1.0 if grade(c, r"\frac{14}{3}").correct else 0.0 for c in completions]
    assert rewards == [1.0, 1.0, 0.0, 0.0]
