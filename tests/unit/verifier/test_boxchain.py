"""Boxes joined only by connectors are one list answer; any word breaks the chain."""

from __future__ import annotations

import time

import pytest

from workers.models import ExtractionMethod, Status
from workers.verifier import grade
from workers.verifier.extract import extract_answer


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        (r"\boxed{1} and \boxed{2} and \boxed{3}", "1, 2, 3"),
        (r"\boxed{1},\boxed{2},\boxed{3}", "1, 2, 3"),
        (r"$$\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}$$", "(2, 2), (6, 2)"),
        (r"\( \boxed{1} \) or \( \boxed{-2} \).", "1, -2"),
        (r"So \boxed{5}, \boxed{7}", "5, 7"),
        (r"\boxed{5} \text{ and } \fbox{7}", "5, 7"),
        # any word between the boxes breaks the chain: the last box wins
        (r"Draft \boxed{5}; corrected \boxed{7}.", "7"),
        (r"\boxed{5} wait, no: \boxed{7}", "7"),
        (r"\boxed{5}. Actually \boxed{7}", "7"),
        (r"\boxed{5} \text{ corrected } \boxed{7}", "7"),
        (r"\boxed{5} \text{ or rather } \boxed{7}", "7"),
        (r"\boxed{5}} \boxed{7}", "7"),  # a stray brace is not a connector
        (r"\boxed{5}; \boxed{7}", "7"),  # a semicolon is not a connector
        (r"\boxed{\boxed{5}} \boxed{7}", "7"),  # a nested box is not chained
        # a part label is not a correction
        (
            r"\boxed{(3, 3)} \text{ for part (a) and } \boxed{(1, 1)}",
            "(3, 3), (1, 1)",
        ),
        # labelled boxes keep their labels; they must all differ
        (
            r"\( y_1 = \boxed{2x} \) and \( y_2 = \boxed{3x} \)",
            "y_1 = 2x, y_2 = 3x",
        ),
        (r"$a = \boxed{1}$, $b = \boxed{2}$", "a = 1, b = 2"),
        (r"x = \boxed{1} and x = \boxed{2}", "2"),  # a repeated label: last box
        (r"\boxed{1} and y = \boxed{2}", "2"),  # a label missing: last box
        (r"x = \boxed{1} and \boxed{2}", "1, 2"),  # the first label names both
        (r"so xy = \boxed{1} and z = \boxed{2}", "2"),  # `xy` is no label
        # the same answer boxed twice is one answer
        (r"\boxed{5} and \boxed{5}", "5"),
        # a truncated earlier box is not part of a list
        (r"\boxed{5 and \boxed{7}", "7"),
    ],
)
def test_boxchain_extraction(response: str, answer: str) -> None:
    found = extract_answer(response)
    assert found.answer == answer
    assert found.method in {ExtractionMethod.BOXED, ExtractionMethod.FBOX}


def test_boxchain_format_valid_and_boxed() -> None:
    found = extract_answer(r"\boxed{1} and \boxed{2}")
    assert found.format_valid
    assert found.method is ExtractionMethod.BOXED
    assert "list" in found.reason


@pytest.mark.parametrize("gold", ["7", "5", "12", r"\{7\}"])
def test_boxchain_merged_list_never_matches_one_value(gold: str) -> None:
    verdict = grade(r"\boxed{5}, \boxed{7}", gold)
    assert verdict.status is Status.WRONG, verdict.reason
    assert verdict.format_valid


@pytest.mark.parametrize(
    "gold", ["5, 7", "7, 5", r"\{5, 7\}", r"x = 5 \text{ or } x = 7"]
)
def test_boxchain_merged_list_matches_a_list_gold(gold: str) -> None:
    assert grade(r"\boxed{5} \quad \text{and} \quad \boxed{7}", gold).correct


def test_boxchain_corrected_answer_still_wins() -> None:
    assert grade(r"Draft \boxed{5}; corrected \boxed{7}.", "7").correct
    assert not grade(r"Draft \boxed{5}; corrected \boxed{7}.", "5").correct


def test_boxchain_many_boxes_are_bounded_and_fast() -> None:
    start = time.perf_counter()
    found = extract_answer(r"\boxed{1}, " * 2_000 + r"\boxed{2}")
    assert time.perf_counter() - start < 1.0
    assert found.answer == "2"  # a chain longer than the bound is not merged


def test_boxchain_one_answer_in_two_forms_is_still_right() -> None:
    # MATH-500's own solution: the same value boxed in two forms, joined by "or".
    response = r"$d = \boxed{15\frac{39}{40}},$ or $\boxed{\frac{639}{40}}$ inches."
    assert grade(response, r"\frac{639}{40}").correct
    assert not grade(response, r"\frac{639}{41}").correct


def test_boxchain_labelled_boxes_against_labelled_gold() -> None:
    response = r"\( y_1 = \boxed{(x+1)^2} \) and \( y_2 = \boxed{2x} \)"
    assert grade(response, r"y_{1}=x^2+2x+1, y_{2}=2x").correct
    assert not grade(response, r"y_{1}=2x, y_{2}=x^2+2x+1").correct
