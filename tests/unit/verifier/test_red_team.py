"""Red-team table: near misses, reward hacks through extraction, common correct forms,
and the deliberate policy decisions, each row pinned to the verdict status it must get.

The verifier is an RL reward: a false positive teaches a policy to cheat, a false
negative punishes correct work. Each row is (pred, gold, status); `grade_answer` rows
take an already extracted answer, `grade` rows a whole response. The last test perturbs
every MATH-500 gold (sign, last digit, x10, reciprocal, +1, swapped tuples, flipped
interval ends) and requires that no perturbation grades correct.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.models import GradeOptions, Status
from workers.verifier import grade, grade_answer
from workers.verifier.pipeline import parse_answer
from workers.verifier.values import exact_value

DATA = Path(__file__).resolve().parents[2] / "data"
OK, NO, UNS = Status.CORRECT, Status.WRONG, Status.UNSUPPORTED

Row = tuple[str, str, str, Status]


def _params(rows: list[Row]) -> list[object]:
    return [
        pytest.param(pred, gold, status, id=name) for name, pred, gold, status in rows
    ]


# --- near misses that must never be correct, by category ----------------------------
NEAR_MISSES: list[Row] = [
    # numbers: sign, off-by-one, scale, reciprocal, huge and tiny
    ("sign", "-5", "5", NO),
    ("off-by-one", "6", "5", NO),
    ("x100", "50", "5000", NO),
    ("reciprocal", r"\frac{3}{4}", r"\frac{4}{3}", NO),
    ("huge-plus-one", "10^{100}", "10^{100}+1", NO),
    ("power-plus-one", "2^{100}", "2^{100}+1", NO),
    ("tiny-double", r"10^{-50}", r"2\cdot10^{-50}", NO),
    ("tiny-power", "1/2^{99}", "1/2^{98}", NO),
    ("float-noise-too-coarse", "0.30000000000001", "0.3", NO),
    # strict default: a rounded decimal is not the exact value (issue 10)
    ("strict-pi", "3.14", r"\pi", NO),
    ("strict-third", "0.333", r"\frac13", NO),
    ("repeating-vs-terminating", r"0.\overline{35625}", ".35625", NO),
    ("float-for-irrational-coarse", "1.41421356237", r"\sqrt2", NO),
    ("float-noise-wrong-irrational", "1.4142135623730951", r"\sqrt3", NO),
    # sentence answers: the asserted number, never another one in the sentence
    ("sentence-wrong-number", "The bakery sold 13 loaves.", "14", NO),
    ("sentence-two-numbers", "Five vans will carry 60 boxes.", "60", UNS),
    ("sentence-two-numbers-first", "Five vans will carry 60 boxes.", "5", UNS),
    ("sentence-label-number", "42 students joined after week #3.", "3", NO),
    ("sentence-step-label", "Step 2 gives 42 apples.", "2", NO),
    ("sentence-negated", "The bakery did not sell 14 loaves.", "14", UNS),
    ("sentence-hedged", "She sold about 14 loaves.", "14", UNS),
    ("sentence-comparison", "It took more than 14 minutes.", "14", UNS),
    ("sentence-dangling", "so we get 14 +", "14", UNS),
    ("sentence-after-copula", "The 14 bakers sold 20 loaves in total.", "14", UNS),
    ("sentence-copula-wrong", "The total number of apples is 15", "14", NO),
    # closed chains: a false chain is wrong whatever its last side
    ("chain-false", "2+2 = 5", "5", NO),
    ("chain-false-first", "2+2=5", "4", NO),
    ("chain-wrong-final", "4+7+2 = 13", "12", NO),
    ("chain-approx-false", r"2\pi \approx 6.5", "6.5", NO),
    ("chain-approx-other", r"6.28318 \approx 6.3", "6.28", NO),
    ("float-gold-vs-exact", r"\frac13", "0.333333333333333314829616256247", NO),
    ("infinity-sign", r"\infty", r"-\infty", NO),
    ("factorial-off", "4!", "120", NO),
    ("scientific-x10", "5e1", "5", NO),
    # irrational forms
    ("sqrt2-over-2", r"\sqrt{2}/2", r"\sqrt{2}", NO),
    ("pi-over-2", r"\frac{\pi}{2}", r"\pi", NO),
    ("conjugate", "3-4i", "3+4i", NO),
    ("i-vs-minus-i", "i", "-i", NO),
    ("imaginary-sqrt", r"\sqrt{-2}", r"\sqrt{2}", NO),
    ("sqrt-of-square", r"\sqrt{x^2}", "x", NO),
    # rounded decimals too coarse or wrongly rounded (workers/verifier/rounding.py)
    ("one-digit-third", "0.3", r"\frac13", NO),
    ("pi-to-tenths", "3.1", r"\pi", NO),
    ("pi-truncated", "3.141", r"\pi", NO),
    ("sqrt3-to-tenths", "1.7", r"\sqrt3", NO),
    ("two-thirds-truncated", "0.66", r"\frac23", NO),
    ("nearly-one", "0.99999999999", "1", NO),
    # structures
    ("tuple-swapped", "(2,1)", "(1,2)", NO),
    ("tuple-extra", "(1,2,3)", "(1,2)", NO),
    ("point-vs-closed", "(1,2)", "[1,2]", NO),
    ("half-open", "[1,2)", "[1,2]", NO),
    ("union-vs-one", r"[1,2]\cup[3,4]", "[1,2]", NO),
    ("hull-vs-union", "[1,4]", r"[1,2]\cup[3,4]", NO),
    ("reversed-interval", "[2,1]", "[1,2]", NO),
    ("set-extra", r"\{1,2,3\}", r"\{1,2\}", NO),
    ("set-missing", r"\{1\}", r"\{1,2\}", NO),
    ("list-superset", "1,2,3,4,5", r"\{2,5\}", NO),
    ("ordered-list-swapped", "2,1", "(1,2)", NO),
    ("empty-vs-zero", r"\emptyset", r"\{0\}", NO),
    ("zero-vs-empty", r"\{0\}", r"\emptyset", NO),
    (
        "transposed",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
        r"\begin{pmatrix}1&3\\2&4\end{pmatrix}",
        NO,
    ),
    (
        "matrix-extra-row",
        r"\begin{pmatrix}1&2\\3&4\\5&6\end{pmatrix}",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
        NO,
    ),
    ("all-reals-vs-interval", r"\mathbb{R}", "[1,2]", NO),
    (
        "determinant-vs-matrix",
        r"\begin{vmatrix}1&2\\3&4\end{vmatrix}",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
        NO,
    ),
    ("inequalities-vs-union", r"x<1 \text{ or } x>2", r"(-\infty,1]\cup(2,\infty)", NO),
    # relations
    ("strictness", "x>2", r"x\ge 2", NO),
    ("direction", "x<2", "x>2", NO),
    ("flipped-by-negation", "-x>-2", "x>2", NO),
    ("open-ray", "x<3", r"(-\infty,3]", NO),
    ("ray-vs-strict", r"[3,\infty)", "x>3", NO),
    ("other-line", "y=2x+1", "y=2x-1", NO),
    ("other-label", "x=5", "y=5", NO),
    ("inequality-for-value", "x > 5", "5", NO),
    ("not-equal", r"x \ne 5", "5", NO),
    ("equation-for-root", "x^2=4", "2", NO),
    ("both-conditions", r"x=5 \text{ and } y=3", "x=5", NO),
    # trivial relations prove nothing
    ("three-eq-three", "3 = 3", "5", NO),
    ("one-eq-one", "1=1", "1", NO),
    ("zero-eq-zero", "0=0", "0", NO),
    ("two-eq-two", "2 = 2", "2", NO),
    ("x-eq-x", "x=x", "5", NO),
    ("zero-eq-zero-vs-line", "0=0", "y=2x+1", NO),
    ("one-eq-one-vs-label", "1=1", "x=5", NO),
    ("x-minus-x", "x-x=0", "x=5", NO),
    # free variables for numbers
    ("restated-variable", "x", "5", NO),
    ("free-n", "n", "5", NO),
    ("imaginary-unit", "5i", "5", NO),
    # hedges: several candidates in one answer
    ("or-text", r"12 \text{ or } 13", "12", NO),
    ("comma-pair", "12, 13", "12", NO),
    ("label-or", r"x = 12 \text{ or } 13", "12", NO),
    ("plus-minus-vs-value", r"\pm 2", "2", NO),
    ("value-vs-plus-minus", "2", r"\pm 2", NO),
    ("plus-minus-superset", r"\pm 1, \pm 2", "1,2", NO),
    ("sqrt-vs-pm", r"\sqrt{25}", r"\pm5", NO),
    ("set-of-two", r"\{5,6\}", "5", NO),
    ("juxtaposed-numbers", "12 13", "12", UNS),
    ("text-but-also", r"5 \text{ but also } 6", "5", UNS),
    # words that change a value's meaning are not units
    ("trailing-not", r"12 \text{ not}", "12", UNS),
    ("trailing-maybe", r"12 \text{ maybe}", "12", UNS),
    ("trailing-excluded", r"12 \text{ excluded}", "12", UNS),
    ("below-zero", r"12 \text{ degrees below zero}", "12", UNS),
    ("leading-not", r"\text{not } 12", "12", UNS),
    # text and choices
    ("not-odd", r"\text{not odd}", "odd", NO),
    ("not-odd-text", r"\text{not odd}", r"\text{odd}", NO),
    ("odd-or-even", r"\text{odd or even}", "odd", NO),
    ("two-words", r"\text{odd}\text{even}", "odd", NO),
    ("negated-text", r"-\text{Evelyn}", r"\text{Evelyn}", UNS),
    ("negated-paren-text", r"-(\text{Evelyn})", r"\text{Evelyn}", UNS),
    ("factorial-text", r"\text{Evelyn}!", r"\text{Evelyn}", UNS),
    ("other-choice", "B", "(C)", NO),
    ("two-choices-text", r"\text{B and C}", "B", NO),
    ("two-choices-list", "B, C", "B", NO),
    ("two-choices-glued", "BC", "B", NO),
    ("choice-text-or", r"\text{A or B}", "A", NO),
    # look-alikes and invisible characters are refused, never read as digits
    ("zero-width-space", "1\u200b2", "12", UNS),
    ("rtl-override", "\u202e21", "12", UNS),
    ("cyrillic-be", "\u0411", "B", UNS),
    ("cyrillic-ze", "\u0417", "3", UNS),
    ("script-ell", "\u2113", "1", NO),
    # undefined forms
    ("zero-over-zero", r"\frac{0}{0}", "0", UNS),
    ("inf-minus-inf", r"5+\infty-\infty", "5", UNS),
    ("one-over-zero", r"\frac{1}{0}", r"\infty", NO),
]


@pytest.mark.parametrize(("pred", "gold", "status"), _params(NEAR_MISSES))
def test_red_team_near_miss_is_never_correct(
    pred: str, gold: str, status: Status
) -> None:
    verdict = grade_answer(pred, gold)
    assert not verdict.correct
    assert verdict.status is status, verdict.reason


# --- reward hacking through extraction (whole responses through `grade`) -----------
def _boxes(values: range, sep: str = "") -> str:
    return sep.join(f"\\boxed{{{value}}}" for value in values)


EXTRACTION_HACKS: list[Row] = [
    ("chain-vs-first", _boxes(range(1, 4)), "1", NO),
    ("chain-vs-last", _boxes(range(1, 4)), "3", NO),
    ("comma-chain-vs-last", _boxes(range(1, 4), ", "), "3", NO),
    ("chain-spam-vs-list", _boxes(range(1, 11)), "2, 5", NO),
    ("comma-chain-spam", _boxes(range(1, 11), ", "), "5", NO),
    ("or-chain", r"\boxed{3}\text{ or }\boxed{4}", "3", NO),
    ("or-chain-last", r"\boxed{3} or \boxed{4}", "4", NO),
    ("labelled-chain", r"\boxed{x=1}, \boxed{x=2}", "1", NO),
    ("choice-chain", r"\boxed{B}\boxed{C}", "C", NO),
    ("space-chain", r"\boxed{2}\quad\boxed{2}\quad\boxed{3}", "2", NO),
    ("candidates-in-box", r"\boxed{1, 2, 3, 4, 5}", "3", NO),
    ("or-in-box", r"\boxed{3 \text{ or } 4}", "3", NO),
    ("range-in-box", r"\boxed{\text{any of } 1..10}", "3", UNS),
    ("tag-with-list", "<answer>1, 2, 3</answer>", "2", NO),
    ("tag-with-chain", r"<answer>\boxed{1}\boxed{2}</answer>", "1", NO),
    (
        "tag-spam-first",
        "<answer>1</answer><answer>2</answer><answer>3</answer>",
        "1",
        NO,
    ),
    ("answer-line-list", "Answer: 1, 2, 3", "2", NO),
    ("answer-line-or", "Answer: 5 or 6", "5", NO),
    ("phrase-comma-list", "Final Answer: The final answer is 5, 6", "5", NO),
    ("phrase-math-or", "the answer is $5$ or $6$.", "5", NO),
    ("phrase-spans-comma", "The answer is $5$, $6$.", "5", NO),
    ("phrase-last-wins", "The answer is 5.\n\nThe answer is 6.", "5", NO),
    ("reasoning-box", r"<think>\boxed{5}</think>\boxed{6}", "5", NO),
    ("after-end-of-turn", r"\boxed{5}<|im_end|>\boxed{6}", "6", NO),
    ("empty-last-box", r"\boxed{5}\boxed{}", "5", Status.NO_ANSWER),
    ("pm-in-box", r"\boxed{\pm5}", "5", NO),
    ("zero-width-in-box", "\\boxed{1\u200b2}", "12", UNS),
    ("answer-line-negated", "Answer: not 12", "12", UNS),
    ("answer-line-hedged", "Answer: maybe 12", "12", UNS),
    ("phrase-negated", "The answer is not 12.", "12", UNS),
    ("last-number-denied", "It can't be 12.", "12", Status.NO_ANSWER),
    ("closing-math-denied", "It is not equal to $12$", "12", Status.NO_ANSWER),
    ("denied-then-other", "I got 13, not 12", "12", NO),
    # sentence answers, run-ons, program outputs, stray fragments (issue 10)
    ("tag-sentence-wrong", "<answer> The bakery sold 13 loaves. </answer>", "14", NO),
    (
        "tag-sentence-then-phrase",
        "<answer> The bakery sold 14 loaves. The answer is: 10 </answer>",
        "14",
        NO,
    ),
    (
        "runon-later-turn",
        "<answer> 5 </answer>\nUser: And next?\nAssistant: <answer> 7 </answer>",
        "7",
        NO,
    ),
    ("text-after-close", "<answer> 7 boxes </answer> 7 * 2 = 14 </answer>", "14", NO),
    ("program-label", "```output\n42\n```\n42 students joined after week #3.", "3", NO),
    ("stray-backslash-wrong", "<answer> 24 \\</answer>", "25", NO),
    ("tag-false-chain", "<answer> 2 + 2 = 5 </answer>", "5", NO),
    (
        "line-then-later-phrase",
        "Answer: The bakery sold 14 loaves.\nThe answer is: 10",
        "14",
        NO,
    ),
]


@pytest.mark.parametrize(("response", "gold", "status"), _params(EXTRACTION_HACKS))
def test_red_team_extraction_hack_is_never_correct(
    response: str, gold: str, status: Status
) -> None:
    verdict = grade(response, gold)
    assert not verdict.correct
    assert verdict.status is status, (verdict.extracted, verdict.reason)


EXTRACTION_KEEPS: list[Row] = [
    # sentence answers, chains, stray fragments, program outputs (issue 10)
    ("tag-sentence", "<answer> The bakery sold 14 loaves. </answer>", "14", OK),
    (
        "tag-sentence-phrase-wins",
        "<answer> The bakery sold 14 loaves. The answer is: 10 </answer>",
        "10",
        OK,
    ),
    ("tag-number-word", "<answer> Five vans. </answer>", "5", OK),
    ("tag-chain", "<answer> 4+7+2 = 13 </answer>", "13", OK),
    ("tag-approx-chain", r"<answer> 6.28318 \approx 6.3 </answer>", "6.3", OK),
    ("tag-stray-backslash", "<answer> 25 \\</answer>", "25", OK),
    ("tag-stray-paren", "<answer>\\( 7 \\ </answer>", "7", OK),
    ("tag-stray-end", "<answer> 120 \\end{answer} \\</answer>", "120", OK),
    (
        "runon-first-turn",
        "<answer> 5 </answer>\nUser: And next?\nAssistant: <answer> 7 </answer>",
        "5",
        OK,
    ),
    (
        "program-final-sentence",
        "```output\n42\n```\n42 students joined after week #3.",
        "42",
        OK,
    ),
    (
        "program-output-block",
        "```output\n42\n```\nThat is 5 vans and 60 boxes.",
        "42",
        OK,
    ),
    ("answer-line-sentence", "Answer: The bakery sold 14 loaves.", "14", OK),
    (
        "line-later-phrase-wins",
        "Answer: The bakery sold 14 loaves.\nThe answer is: 10",
        "10",
        OK,
    ),
    (
        "tag-later-phrase-wins",
        "<answer> The bakery sold 14 loaves. </answer>\nThe answer is: 10",
        "10",
        OK,
    ),
    ("phrase-sentence", "The answer is 276 wheels will be left.", "276", OK),
    ("repeated-box", r"\boxed{4}\boxed{4}\boxed{4}", "4", OK),
    ("chain-is-the-list", _boxes(range(1, 4), ", "), "1,2,3", OK),
    ("chain-is-the-set", r"\boxed{1}\boxed{2}", r"\{1,2\}", OK),
    ("nested-box", r"\boxed{\boxed{5}}", "5", OK),
    ("phrase-then-prose", "The answer is 5, which is odd.", "5", OK),
    ("phrase-span-then-prose", "the answer is $5$, since", "5", OK),
    ("phrase-span-and-prose", "The answer is $5$ and it is odd", "5", OK),
    ("phrase-list-and", "The answer is 5, 6, and 7.", "5, 6, 7", OK),
    ("last-number-before-denied", "we got 42, not 41", "42", OK),
    ("number-with-prose", "Answer: Jane started 3 hours ago.", "3", OK),
    # Policy (extract.py): an answer line after the last box is the final word.
    ("answer-line-after-box", "The answer is \\boxed{4}.\nAnswer: 5", "5", OK),
    ("box-overridden-by-line", "The answer is \\boxed{4}.\nAnswer: 5", "4", NO),
]


@pytest.mark.parametrize(("response", "gold", "status"), _params(EXTRACTION_KEEPS))
def test_red_team_extraction_keeps_real_answers(
    response: str, gold: str, status: Status
) -> None:
    verdict = grade(response, gold)
    assert verdict.status is status, (verdict.extracted, verdict.reason)


# --- common correct forms that must not be false negatives -------------------------
CORRECT_FORMS: list[Row] = [
    ("dfrac-sqrt3", r"\frac{\sqrt{3}}{2}", r"\dfrac{\sqrt3}{2}", OK),
    ("two-root-two", r"2\sqrt{2}", r"\sqrt{8}", OK),
    ("rationalized", r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", OK),
    ("membership", r"x \in (-\infty, 3]", r"(-\infty,3]", OK),
    ("set-vs-list", r"\{1,2\}", "1,2", OK),
    ("left-right", r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)", OK),
    ("text-choice", r"\text{(C)}", "C", OK),
    ("paren-choice", "(B)", "B", OK),
    ("percent-number", r"10\%", "10", OK),
    ("dollars", r"\$5.00", "5", OK),
    ("dollars-word", r"5\text{ dollars}", "5", OK),
    ("pi-placement", r"\frac{9}{4}\pi", r"\frac{9\pi}{4}", OK),
    ("reordered-sum", r"6 - 2\sqrt{5}", r"-2\sqrt{5}+6", OK),
    ("commuted", "a^2+b^2", "b^2+a^2", OK),
    ("neg-numerator", r"\dfrac{-1}{2}", r"-\frac12", OK),
    ("leading-point", ".5", "0.5", OK),
    ("trailing-point", "1.", "1", OK),
    ("plus-sign", "+5", "5", OK),
    ("leading-zero", "05", "5", OK),
    ("e-notation", "1e-3", "0.001", OK),
    ("labelled", r"x=\frac{1}{2}", r"\frac12", OK),
    ("same-line", "y = -x + 3", "x + y = 3", OK),
    ("scaled-line", "y=2x+1", "2y=4x+2", OK),
    ("scaled-inequality", "2x>4", "x>2", OK),
    ("log-base", r"\log_{2}{8}", "3", OK),
    ("sin-degrees", r"\sin 30^\circ", r"\frac12", OK),
    ("sin-degrees-paren", r"\sin(30^\circ)", r"\frac12", OK),
    ("cos-degree-sign", "cos 60°", r"\frac12", OK),
    ("cos-sin-degrees", r"\cos 10^\circ", r"\sin 80^\circ", OK),
    (
        "matrix-spacing",
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
        OK,
    ),
    (
        "bmatrix-pmatrix",
        r"\begin{bmatrix}1&2\\3&4\end{bmatrix}",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
        OK,
    ),
    ("power", "2^{10}", "1024", OK),
    ("cube-root", r"\sqrt[3]{27}", "3", OK),
    ("imaginary-root", r"i\sqrt{2}", r"\sqrt{-2}", OK),
    ("euler", r"e^{i\pi}", "-1", OK),
    ("repeating-nine", r"0.\overline{9}", "1", OK),
    ("all-reals", r"\mathbb{R}", r"(-\infty,\infty)", OK),
    ("all-reals-gold", r"(-\infty,\infty)", r"\mathbb R", OK),
    ("member-of-reals", "x \\in \u211d", r"(-\infty, \infty)", OK),
    ("text-in-parens", r"(\text{Evelyn})", r"\text{Evelyn}", OK),
    ("hyphenated-text", r"\text{non-negative}", "non-negative", OK),
    ("pm-vs-list", r"\pm 2", "-2,2", OK),
    ("label-or-label", r"x=2 \text{ or } x=-2", r"\pm 2", OK),
    ("arabic-indic-digits", "\u0661\u0662", "12", OK),
    ("vulgar-half", "\u00bd", "1/2", OK),
    ("vulgar-mixed", "2\u00bd", "5/2", OK),
    ("unit-more", r"5 \text{ more}", "5", OK),
    ("unit-words", r"18 \text{ more dollars}", "18", OK),
]


@pytest.mark.parametrize(("pred", "gold", "status"), _params(CORRECT_FORMS))
def test_red_team_correct_form_is_correct(pred: str, gold: str, status: Status) -> None:
    verdict = grade_answer(pred, gold)
    assert verdict.status is status, verdict.reason


# --- deliberate policy decisions (documented where the code decides) ---------------
POLICIES: list[Row] = [
    # rounding.py, strict default: exact values only, float noise aside
    ("pi-hundredths-strict", "3.14", r"\pi", NO),
    # r6: a rounded gold accepts the exact value that rounds to it (issue 37)
    ("rounded-gold-strict", r"\frac{1}{3}", "0.333", OK),
    ("rounded-gold-other-value", r"\frac{1}{3}", "0.334", NO),
    ("rounded-gold-too-short", r"\frac{1}{3}", "0.33", NO),  # exact or rounded?
    ("rounded-gold-short-irrational", r"\sqrt{156}", "12.5", NO),
    ("float-for-irrational", "1.4142135623730951", r"\sqrt2", OK),
    ("float-noise", "0.30000000000000004", "0.3", OK),
    ("float-noise-third", "0.3333333333333333", r"\frac13", OK),
    # relations.py: a true closed chain answers with its final side; a false one is
    # wrong; `\binom{n}{n}` names a quantity like `f(3)`
    ("closed-chain", "1200+800=2000", "2000", OK),
    ("approx-chain-exact-side", r"\frac13 \approx 0.33", r"\frac13", OK),
    ("false-closed-chain", "2+2=5", "5", NO),
    ("binom-label", r"\binom{n}{n} = 1", "1", OK),
    # sentences.py: one number in a sentence is its answer; several need an assertion
    ("sentence-one-number", "The bakery sold 14 loaves.", "14", OK),
    ("sentence-after-equals", "Kylie collects 20 + 5 = 25 shells", "25", OK),
    (
        "sentence-after-copula",
        "The cost for the 36-minute call would be $8.00",
        "8",
        OK,
    ),
    ("sentence-number-word", "twenty-one loaves", "21", OK),
    # compare.py (r6): an angle in degrees reads as its number or as its radians
    ("degrees-vs-number", r"90^\circ", "90", OK),
    ("degrees-vs-radians", r"90^\circ", r"\frac{\pi}{2}", OK),
    ("radians-vs-degrees", r"\frac{\pi}{2}", r"90^\circ", OK),
    ("degrees-vs-other-radians", r"150^\circ", r"\frac{\pi}{6}", NO),
    ("radians-vs-other-degrees", r"\frac{\pi}{6}", r"150^\circ", NO),
    ("degrees-vs-other-number", r"30^\circ", "0.5", NO),
    ("degree-sum-vs-number", r"180^\circ - 30^\circ", "150", OK),
    # parse.py: units are dropped, so a different unit with the same number counts
    ("units-differ", r"5\text{ m}", r"5\text{ cm}", OK),
    ("unit-power-differs", r"15\mbox{ cm}^3", r"15\mbox{ cm}^2", OK),
    # compare.py percent policy: `x%` matches gold `x` or `x/100`
    ("percent-value", r"50\%", "0.5", OK),
    ("percent-wrong-scale", r"50\%", "0.05", NO),
    # compare.py: labels must agree when both sides have one; `x = 5` answers `5`
    ("label-vs-value", "x=5", "5", OK),
    ("value-vs-label", "12", "x=12", OK),
    ("label-restated", "x = 5, y = 5", "5", OK),
    ("approx-label", r"x \approx 5", "5", OK),
    ("reversed-label", "5 = x", "5", NO),
    # structures: a 1-D vector's orientation is notation; [a, b, c] is a vector
    (
        "row-vs-column",
        r"\begin{pmatrix}1&2\end{pmatrix}",
        r"\begin{pmatrix}1\\2\end{pmatrix}",
        OK,
    ),
    ("bracket-triple", "[6, 31, -1]", "(6,31,-1)", OK),
    ("tuple-vs-set-gold", "(1,2)", r"\{1,2\}", OK),
    ("singleton-set", r"\{5\}", "5", NO),
    ("choice-vs-variable", "A", "a", NO),
    ("repeated-interval", r"[1,2]\cup[1,2]", "[1,2]", OK),
    ("zero-power-zero", "0^0", "1", OK),
    # parse.py: only what follows the last "is" counts (`The largest n is 34`)
    # structures.py: a label chain keeps its last value even when false (Math-Verify
    # cases 98-115 expect it); only the last term is credited, so it hedges nothing
    ("false-chain-last", "x = 12 = 13", "13", OK),
    ("false-chain-first", "x = 12 = 13", "12", NO),
    ("function-value-label", "f(3) = 12", "12", OK),
    ("copula-restates", r"12 \text{ or } 13 \text{ is } 12", "12", OK),
]


@pytest.mark.parametrize(("pred", "gold", "status"), _params(POLICIES))
def test_red_team_policy_decisions(pred: str, gold: str, status: Status) -> None:
    verdict = grade_answer(pred, gold)
    assert verdict.status is status, verdict.reason


# rounding.py with GradeOptions(approximate=True): >= 3 significant digits, or 2 with
# >= 2 decimals, correctly rounded
APPROXIMATE_POLICIES: list[Row] = [
    ("pi-hundredths", "3.14", r"\pi", OK),
    ("third-hundredths", "0.33", r"\frac13", OK),
    ("third-thousandths", "0.333", r"\frac13", OK),
    ("ten-pi-tenths", "31.4", r"10\pi", OK),
    ("root3-hundredths", "1.73", r"\sqrt3", OK),
    ("twentyfourth-3dp", "0.042", r"\frac1{24}", OK),
    ("twentyfourth-2dp", "0.04", r"\frac1{24}", NO),
    ("sqrt2-tenths", "1.4", r"\sqrt2", NO),
    ("rounded-gold", r"\frac{1}{3}", "0.33", OK),
    ("coarse-gold", r"\pi", "3.1", NO),
]


@pytest.mark.parametrize(("pred", "gold", "status"), _params(APPROXIMATE_POLICIES))
def test_red_team_approximate_option(pred: str, gold: str, status: Status) -> None:
    verdict = grade_answer(pred, gold, options=GradeOptions(approximate=True))
    assert verdict.status is status, verdict.reason


# --- MATH-500 golds, perturbed automatically ---------------------------------------
def _last_digit_moves(gold: str) -> Iterator[str]:
    numbers = list(re.finditer(r"\d+", gold))
    if not numbers:
        return
    end = numbers[-1].end()
    last = int(gold[end - 1])
    for digit in (last + 1, last - 1):
        if 0 <= digit <= 9:
            yield gold[: end - 1] + str(digit) + gold[end:]


def _tuple_moves(gold: str) -> Iterator[str]:
    match = re.fullmatch(r"\\left\s*\((.*)\\right\s*\)|\((.*)\)", gold.strip())
    body = (match.group(1) or match.group(2)) if match else None
    parts = [part.strip() for part in body.split(",")] if body else []
    if len(parts) >= 2 and len(set(parts)) > 1:
        yield "(" + ", ".join(parts[::-1]) + ")"
        yield "(" + ", ".join(parts[:-1]) + ")"


def _bracket_moves(gold: str) -> Iterator[str]:
    for old, new in (("(", "["), ("[", "("), (")", "]"), ("]", ")")):
        index = gold.find(old)
        if index >= 0:
            yield gold[:index] + new + gold[index + 1 :]


def _perturbations(gold: str) -> Iterator[str]:
    """Near misses of one gold (text golds get none: a sign on a word is refused)."""
    parsed = parse_answer(gold)
    if parsed.node is None or parsed.node.kind == "text" or r"\mbox" in gold:
        return  # units are dropped by policy, so `cm^3` vs `cm^2` is no near miss
    yield from _last_digit_moves(gold)
    kind = parsed.node.kind
    if kind in {"pair", "tuple"}:
        yield from _tuple_moves(gold)
    if kind in {"interval", "union"}:
        yield from _bracket_moves(gold)
    if kind in {"pair", "tuple", "interval", "union", "matrix", "list", "set"}:
        return
    value = exact_value(parsed.node)
    if value != 0:
        yield gold[1:] if gold.startswith("-") else f"-({gold})"
    yield f"{gold}+1"
    if value not in (0, 1, -1):
        yield f"10\\cdot({gold})"
    if value not in (0, 1, -1) and r"\pm" not in gold:
        # (± golds skipped: 1/(3 \pm 2\sqrt2) *is* the set 3 \pm 2\sqrt2)
        yield f"\\frac{{1}}{{{gold}}}"


def test_red_team_math500_perturbations_never_correct() -> None:
    golds = [
        json.loads(line)["answer"]
        for line in (DATA / "math500_test.jsonl").read_text("utf-8").splitlines()
    ]
    tried, correct = 0, []  # measured: 2,702 near misses tried, none correct
    for gold in golds:
        for pred in _perturbations(gold):
            if pred == gold:
                continue
            tried += 1
            if grade_answer(pred, gold).correct:
                correct.append((pred, gold))
    assert tried > 2_000
    assert correct == []
