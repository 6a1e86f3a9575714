"""Issue 37 (verifier r6): the written answer precedence, the nine numbered examples,
and the shapes other graders' own tests expect, each with a near miss that stays
wrong. Every example is written for the test in the shape the issue describes."""

from __future__ import annotations

import pytest

from workers.models import ExtractionMethod, Status
from workers.verifier import grade, grade_answer
from workers.verifier.extract import extract_answer
from workers.verifier.version import GRADER_VERSION, VERIFIER_REVISION

OK, NO, UNS, NONE = Status.CORRECT, Status.WRONG, Status.UNSUPPORTED, Status.NO_ANSWER
FINAL_ANSWER_SECTION = (
    "We solve the system.\n\n**Final Answer**\n\nThe general solution is:\n\n"
    "$$x(t) = c_1 e^t + c_2 e^{-t}$$"
)
TRUNCATED = (
    "First, the total number of apples is 3 + 4 = 7. Next, we need to multiply "
    "this by the number of"
)

# (id, whole response, gold, expected status)
RESPONSES: list[tuple[str, str, str, Status]] = [
    # 1. GSM8K's own marker, wherever it stands on the last line; never a label
    ("hashes-mid-line", "Thus they ordered 8 meals for the 12 of them. #### 8",
     "8", OK),
    ("hashes-mid-line-wrong", "Thus they ordered 8 meals for the 12 of them. #### 8",
     "12", NO),
    ("hashes-label-fallback", "It took 5 steps to reach step #3", "3", NO),
    ("hashes-glued", "8 meals for the 12 of them ####8", "8", OK),
    # 2. stray closing tags and end tokens are cut before a marker is looked for
    ("answer-line-stray-tags", "Answer: 270 tissues\n <</think> </answer>", "270", OK),
    ("answer-sentence-stray-tags", "Answer: Jordan has 11 Oreos.\n</think>\n</answer>",
     "11", OK),
    ("answer-line-stray-tags-wrong", "Answer: 270 tissues\n </answer>", "27", NO),
    ("the-answer-mid-line", "...so, the answer: Nadine spends 55 minutes cleaning.",
     "55", OK),
    ("the-answer-then-question", "Let me check the answer: is 5 correct? Yes, it "
     "is 6.", "5", NO),
    ("end-token-after-box", "so \\boxed{42}<|im_end|>\nUser: next", "42", OK),
    # 3. sentence rules: one value said twice, true chains, units in chains, percent
    ("value-said-twice", "<answer> 47 (the cat catches 47 animals. </answer>",
     "47", OK),
    ("two-values-no-assertion", "<answer> 47 cats and 12 dogs </answer>", "47", NO),
    ("chain-with-number-word",
     "<answer> She needs to reread 24 - 20 = 4 books to have two books a month. "
     "</answer>", "4", OK),
    ("chain-with-units",
     "<answer> He buys 8 bags (2 pounds/bag * 8 bags = 16 pounds) </answer>", "16", OK),
    ("chain-with-units-not-first", "<answer> He buys 8 bags (2 pounds/bag * 8 bags "
     "= 16 pounds) </answer>", "8", NO),
    ("false-chain-asserts-nothing", "<answer> She reads 24 - 20 = 5 books to have two "
     "books a month. </answer>", "4", UNS),
    ("chain-before-other-number", "<answer> After 3 * 4 = 12 hours the car covered "
     "600 miles. </answer>", "12", UNS),
    ("percent-sentence", "<answer> 80% of the girls like basketball </answer>",
     "80", OK),
    ("percent-sentence-wrong", "<answer> 80% of the girls like basketball </answer>",
     "20", NO),
    # 4. a digit glued to letters is no number
    ("glued-apostrophe-name", "<answer> <Z/A> 11’Brien cows. </answer>", "11", UNS),
    ("glued-unit-kept", "<answer> The rope is 16cm long. </answer>", "16", OK),
    ("glued-terms-assert-nothing", "<answer> We get 2x + 3 = 12 - 4y </answer>",
     "12", UNS),
    # 6. a Final Answer heading, a sentence ending in a colon, display math below
    ("final-answer-display", FINAL_ANSWER_SECTION, "x(t) = c_1 e^t + c_2 e^{-t}", OK),
    ("final-answer-display-wrong", FINAL_ANSWER_SECTION, "x(t) = c_1 e^t", NO),
    ("final-answer-box-after-heading",
     "**Final Answer**\n\nThe value is:\n\n\\boxed{12}", "12", OK),
    # 8. neither ... nor is no negation; a negation still is
    ("neither-nor", "<answer> three boxes contain neither pens nor pencils </answer>",
     "3", OK),
    ("neither-value-nor", "<answer> It is neither 3 nor 4. </answer>", "3", UNS),
    # 9. truncated outputs stay not correct
    ("truncated-mid-sentence", TRUNCATED, "7", NONE),
    ("whole-sentence-ending-in-for", "So the total is 42, which is what we were "
     "looking for", "42", OK),
    ("truncated-box", "The answer is \\boxed{7", "7", UNS),
    # program-aided: the last ```output block when the closing sentence asserts none
    ("output-block", "```python\nprint(3.0)\n```\n```output\n3.0\n```\n"
     "Three trucks carry 80 stones.", "3", OK),
    ("output-block-wrong", "```python\nprint(3.0)\n```\n```output\n3.0\n```\n"
     "Three trucks carry 80 stones.", "80", NO),
]  # fmt: skip

# (id, already-extracted answer, gold, expected status)
ANSWERS: list[tuple[str, str, str, Status]] = [
    # 5. identical text is never graded wrong
    ("identical-text-or", r"e \text{ or } 65-6", r"e \text{ or } 65-6", OK),
    # 7. a relation whose left side names the asked quantity
    ("named-trig", r"\tan A = 2", "2", OK),
    ("named-trig-wrong", r"\tan A = 2", "3", NO),
    ("named-accent-subscript", r"E_{\widetilde{10}} = 10.1", "10.1", OK),
    ("named-sum-chain", "a + b + c = 11 + 9 + 0 = 20", "20", OK),
    ("named-sum-chain-wrong", "a + b + c = 11 + 9 + 0 = 20", "11", NO),
    ("coefficient-is-no-name", "2x + z = 1", "1", NO),
    ("named-with-condition",
     r"A = \frac{1}{4-\omega^2}, \quad \text{for } \omega \ne 2",
     r"\frac{1}{4-\omega^2}", OK),
    ("piecewise-keeps-branches", r"5 \text{ if } n \text{ odd}, 6 \text{ otherwise}",
     "5", NO),
    # 8. compound units, ordinals
    ("unit-per-second-squared", r"6 \times 10^{-3} \text{ m/s²}", "0.006", OK),
    ("unit-per-second-squared-wrong", r"6 \times 10^{-3} \text{ m/s²}", "0.06", NO),
    ("unit-negative-powers", r"15000 \text{ kcal m}^{-2} \text{yr}^{-1}", "15000", OK),
    ("ordinal", r"12^{\text{th}}\text{ grade}", "12", OK),
    ("ordinal-wrong", r"12^{\text{th}}\text{ grade}", "11", NO),
    ("hedge-is-no-unit", r"12 \text{ maybe}", "12", UNS),
    # extracted answers that still carry a box, a trailing backslash or an end token
    ("answer-boxed", r"\boxed{42}", "42", OK),
    ("answer-boxed-wrong", r"\boxed{42}", "43", NO),
    ("answer-trailing-backslash", "185\\", "185", OK),
    ("answer-im-end", "42<|im_end|>", "42", OK),
    ("answer-eos", "42</s>", "42", OK),
    ("answer-endoftext", "42<|endoftext|>", "42", OK),
    ("answer-eot", "42<|eot_id|>", "42", OK),
    ("answer-eot-wrong", "41<|eot_id|>", "42", NO),
    # the right side of a final `=` after words, as answer and as gold
    ("named-value-answer", "any text=12", "12", OK),
    ("named-value-gold", "12", "any text=12", OK),
    ("named-value-wrong", "any text=12", "13", NO),
    ("named-value-denied", "not the total=12", "12", UNS),
    # mixed numbers, both directions
    ("mixed-number", "3128 1/2", "3128.5", OK),
    ("mixed-number-gold", "3128.5", "3128 1/2", OK),
    ("mixed-number-small-gold", "1.5", "1 1/2", OK),
    ("mixed-number-sum", r"\frac{3}{2}", "1 1/2", OK),
    ("mixed-number-in-sum", "3127 + 1 1/2", "3128.5", OK),
    ("mixed-number-in-sum-near-miss", "3127 + 1 1/3", "3128.5", NO),
    ("mixed-number-with-unit", "2 1/2 cups", "2.5", OK),
    ("mixed-number-improper", "2 3/2", "3.5", UNS),
    ("mixed-number-near-miss", "3128 1/3", "3128.5", NO),
    ("mixed-number-near-miss-gold", "3128.5", "3128 1/3", NO),
    # clock times
    ("clock-seconds", "20:34:00", "20:34", OK),
    ("clock-pm", r"08:34 \text{P.M.}", "20:34", OK),
    ("clock-am", "8:34 a.m.", "8:34", OK),
    ("clock-near-miss", "20:43", "20:34", NO),
    ("clock-am-not-pm", r"08:34 \text{A.M.}", "20:34", NO),
    # the same function under another name; a renamed variable
    ("function-renamed", "y = 2x + 3", "f(x) = 2x + 3", OK),
    ("function-renamed-near-miss", "y = 2x + 4", "f(x) = 2x + 3", NO),
    ("function-other-letter", "g(x) = 2x + 3", "f(x) = 2x + 3", NO),
    ("variable-renamed", "f(z) = z", "f(x) = x", OK),
    ("variable-renamed-near-miss", "f(z) = z + 1", "f(x) = x", NO),
    # a derivative's name as the gold
    ("derivative-name", "f'", "f'", OK),
    ("derivative-prime-command", r"f^{\prime}", "f'", OK),
    ("derivative-not-function", "f", "f'", NO),
    # gold-side approximations (the answer's decimal is never rounded to the gold)
    ("gold-rounded-third", r"\frac{10}{3}", "3.33333333", OK),
    ("gold-rounded-coarse-answer", "3.3", "3.33333333", NO),
    ("gold-rounded-scientific", r"\frac{1}{432}", r"2.314814814815 \times 10^{-3}", OK),
    ("gold-rounded-chain", r"\frac{\sqrt3}{3}", r"\frac{\sqrt3}{3} \approx 0.577", OK),
    ("gold-rounded-chain-decimal", "0.577", r"\frac{\sqrt3}{3} \approx 0.577", OK),
    ("gold-rounded-chain-wrong", r"\frac{\sqrt2}{3}", r"\frac{\sqrt3}{3} \approx 0.577",
     NO),
    ("gold-short-decimal", r"\frac{1}{3}", "0.33", NO),
    ("physics-product-kept", r"\frac{1}{2}at^2", r"\frac{1}{2}", NO),
    ("degree-inside-trig", r"\sin 30^\circ", r"\sin 30", NO),
    ("strict-pi", "3.14", r"\pi", NO),
    ("strict-third", "0.333", r"\frac{1}{3}", NO),
    # hard equivalences: degrees and radians, inverse trig, set-builder, renamed
    # variables, named gold sides, ceiling and floor
    ("degrees-for-radians", r"30^\circ", r"\frac{\pi}{6}", OK),
    ("radians-for-degrees", r"\frac{\pi}{6}", r"30^\circ", OK),
    ("degrees-near-miss", r"150^\circ", r"\frac{\pi}{6}", NO),
    ("inverse-tan", r"\tan^{-1}(2)", r"\arctan(2)", OK),
    ("inverse-tan-wrong", r"\tan^{-1}(3)", r"\arctan(2)", NO),
    ("set-builder-open", "(-2, 3)", r"\{x \mid -2 < x < 3\}", OK),
    ("set-builder-closed-near-miss", "[-2, 3]", r"\{x \mid -2 < x < 3\}", NO),
    ("named-gold", "n^2 - n - 1", r"m_{\max} = n^2 - n - 1", OK),
    ("named-gold-wrong", "n^2 - n + 1", r"m_{\max} = n^2 - n - 1", NO),
    ("ceiling", "3", r"\lceil 2.5 \rceil", OK),
    ("floor", "2", r"\lfloor 2.5 \rfloor", OK),
    ("floor-wrong", "3", r"\lfloor 2.5 \rfloor", NO),
    # float noise of an irrational gold
    ("irrational-float-noise", "0.8660254037844386", r"\frac{\sqrt3}{2}", OK),
    ("irrational-float-coarse", "0.86602540378", r"\frac{\sqrt3}{2}", NO),
]  # fmt: skip


@pytest.mark.parametrize(
    ("response", "gold", "status"),
    [row[1:] for row in RESPONSES],
    ids=[row[0] for row in RESPONSES],
)
def test_r6_response_shapes(response: str, gold: str, status: Status) -> None:
    verdict = grade(response, gold)
    assert verdict.status is status, (verdict.extracted, verdict.reason)


@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [row[1:] for row in ANSWERS],
    ids=[row[0] for row in ANSWERS],
)
def test_r6_answer_shapes(answer: str, gold: str, status: Status) -> None:
    verdict = grade_answer(answer, gold)
    assert verdict.status is status, (verdict.canonical_pred, verdict.reason)


def test_r6_marker_beats_sentence_and_last_number() -> None:
    # Given: an answer line, then a sentence naming another number
    response = "Answer: 12\nThe farm had 30 cows and 40 sheep before."
    # When: it is extracted
    found = extract_answer(response)
    # Then: the explicit marker wins over the sentence and the last number
    assert (found.answer, found.method) == ("12", ExtractionMethod.ANSWER_LINE)


def test_r6_identical_text_is_never_wrong_as_response() -> None:
    text = r"e \text{ or } 65-6"
    assert grade(text, text).status is not Status.WRONG


def test_r6_version_is_r6() -> None:
    assert VERIFIER_REVISION == "6"
    assert ".r6+" in GRADER_VERSION
