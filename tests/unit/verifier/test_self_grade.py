"""Identical text never grades wrong: `grade(x, x)` is correct or a refusal.

A property test (hypothesis; derandomized under the CI profile, bounded examples) over
answer-like text: numbers, LaTeX, units, answer markers and the shapes fuzzing found
(issue 13: `#### |-329|\\text{ cm}` against itself was graded wrong).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.models import Status
from workers.verifier import grade, grade_answer

# Verdicts that say "we cannot tell", never "these differ".
REFUSALS = {Status.UNSUPPORTED, Status.NO_ANSWER, Status.INVALID_GOLD}

_ATOMS = st.sampled_from(
    [
        "1", "-329", "0.5", "3/4", "10^{2}", "x", "y", "\\pi", "\\sqrt{2}",
        "\\frac{1}{3}", "|-329|", "\\text{ cm}", " cm", "%", "\\%", "!", "(", ")",
        "[", "]", "{", "}", "+", "-", "=", ",", " ", "\\le", "\\infty", "e", "i",
        "\\$", "$", "apples", "The answer is ", "#### ", "Answer: ", "\\boxed{",
        "<answer>", "</answer>", "\\binom{5}{2}", "2.0000000000000004", "\n",
        # issue 37 (r6) shapes
        "\\text{ or }", "65-6", "</think>", "<|im_end|>", "^\\circ", "\\mid", "\\{",
        "\\}", "\\lceil", "\\rceil", ":", "'", " 1/2", "P.M.", "^{\\text{th}}",
        "\\text{for }", "E_{\\widetilde{1}}", "\\tan^{-1}", "\\approx", "f(x)",
        "\\text{ m/s}^{-2}", "the answer: ", "**Final Answer**\n", "is:\n$$",
    ]
)  # fmt: skip
_TEXTS = st.lists(_ATOMS, min_size=1, max_size=8).map("".join)
_CHARS = st.text(alphabet="0123456789-+*/^_=.,()[]{}|$%! \\abcxyzAB#:", max_size=30)


def _never_wrong(text: str) -> None:
    for verdict in (grade(text, text), grade_answer(text, text)):
        assert verdict.status is Status.CORRECT or verdict.status in REFUSALS, (
            text,
            verdict,
        )


@settings(max_examples=300, deadline=None)
@given(text=_TEXTS)
def test_identical_answer_text_is_never_wrong(text: str) -> None:
    _never_wrong(text)


@settings(max_examples=300, deadline=None)
@given(text=_CHARS)
def test_identical_character_soup_is_never_wrong(text: str) -> None:
    _never_wrong(text)


def test_issue_13_absolute_value_line_grades_against_itself() -> None:
    text = r"#### |-329|\text{ cm}"
    assert grade(text, text).status is Status.CORRECT


def test_identical_text_with_or_in_text_is_never_wrong() -> None:
    # issue 37: found by fuzzing, `e \text{ or } 65-6` against itself
    _never_wrong(r"e \text{ or } 65-6")
