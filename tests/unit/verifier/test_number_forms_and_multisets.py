"""Number forms and collections (from review fixes): decimal commas, multisets,
`#### 18`, full-width digits, |z| bands, and grouped assignments (each with its near
misses)."""

from __future__ import annotations

import pytest

from workers.models import ExtractionMethod, Status
from workers.verifier import grade, grade_answer


@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        ("1000,99", "1000.99", True),  # decimal comma in the answer
        ("1.22", "1,22", True),  # ... or in the gold
        ("0.111", "0,111", True),  # a leading 0 is never a thousands group
        ("111", "0,111", False),
        ("0,111", "111", False),
        ("-2,5", "-2.5", True),
        ("2,74", "2.75", False),
        ("1,234", "1234", True),  # three digits after the comma: thousands
        ("1,234", "1.234", False),
        ("1, 22", "1.22", False),  # with a space it is a list only
        ("1,22", "1, 22", True),  # the list reading still works
        ("1,5", r"\{1, 5\}", True),
        ("1,5", r"\{1.5\}", False),  # against a collection only the list counts
        ("(0,1)", "0.1", False),  # a pair is never a decimal
        ("(0,1)", "(0, 1)", True),
    ],
)
def test_review_decimal_comma(answer: str, gold: str, correct: bool) -> None:
    assert grade_answer(answer, gold).correct is correct


@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        ("1, 2", "1, 1, 2", False),  # the gold counts a double root twice
        ("1, 2, 2", "1, 1, 2", False),
        ("2, 1, 1", "1, 1, 2", True),
        (r"\{1, 2\}", "1, 1, 2", False),
        ("1, 1, 2", "1, 2", True),  # a solution written twice is one solution
        ("1, 1, 2", r"\{1, 2\}", True),
        ("5, 5", "5", True),  # one answer restated
        (r"2\frac{1}{2}, \frac{5}{2}", r"\frac52", True),
        ("5, 7", "5", False),
        ("5, 7", "7", False),
    ],
)
def test_review_lists_and_repeats(answer: str, gold: str, correct: bool) -> None:
    assert grade_answer(answer, gold).correct is correct


@pytest.mark.parametrize(
    ("response", "answer", "method"),
    [
        ("Natalia sold 48/2 = 24 clips.\n#### 18", "18", ExtractionMethod.ANSWER_LINE),
        ("#### 18", "18", ExtractionMethod.ANSWER_LINE),
        ("so\n#### $18.", "18", ExtractionMethod.ANSWER_LINE),
        ("we get 2\n#### Step 2", "2", ExtractionMethod.LAST_NUMBER),  # a heading
    ],
)
def test_review_gsm8k_hashes_in_response(
    response: str, answer: str, method: ExtractionMethod
) -> None:
    verdict = grade(response, answer)
    assert verdict.correct
    assert verdict.extracted == answer
    assert verdict.extraction_method is method
    assert verdict.format_valid is (method is ExtractionMethod.ANSWER_LINE)


@pytest.mark.parametrize(
    "response",
    ["１２３", "so we get １２３", "答案是１２３", "所以答案是１２３。", "x = 𝟏𝟐𝟑"],
)
def test_review_full_width_digits_unmarked(response: str) -> None:
    verdict = grade(response, "123")
    assert verdict.correct, verdict.reason
    assert not verdict.format_valid


def test_review_full_width_digits_not_glued_to_ascii_words() -> None:
    assert grade("AZYUK２A", "2").status is Status.NO_ANSWER


@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        (r"z \in [-3/2,-1] \cup [1,3/2]", r"1\leq|z|\leq \frac{3}{2}", True),
        (r"[-3/2,-1] \cup [1,3/2]", r"1 < |z| \leq 3/2", False),
        (r"(-3/2,-1] \cup [1,3/2)", r"1 \le |z| < 3/2", True),
        (r"[-2,2]", r"|x| \le 2", True),
        (r"(-2,2)", r"|x| \le 2", False),
        (r"[-2,0) \cup (0,2]", r"0 < |x| \le 2", True),
        (r"[-2,2]", r"0 < |x| \le 2", False),
        (r"[1, 2]", r"1 \le |x| \le 2", False),
    ],
)
def test_review_absolute_value_bands(answer: str, gold: str, correct: bool) -> None:
    assert grade_answer(answer, gold).correct is correct


@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        ("(5,2),(7,2)", "p=5,q=2;p=7,q=2", True),
        ("(7,2),(5,2)", "p=5,q=2;p=7,q=2", True),
        ("(2,5),(2,7)", "p=5,q=2;p=7,q=2", False),  # labels fix the order
        ("p=5,q=2;p=7,q=2", "(5,2),(7,2)", True),
        ("5,2,7,2", "p=5,q=2;p=7,q=2", False),  # the pairing is part of the answer
        ("(5,2)", "p=5,q=2", True),
    ],
)
def test_review_grouped_assignments(answer: str, gold: str, correct: bool) -> None:
    assert grade_answer(answer, gold).correct is correct
