"""Tables for answer extraction (`extract_answer`) and gold reading (`extract_gold`)."""

from __future__ import annotations

import time

import pytest

from workers.models import ExtractionMethod as M
from workers.verifier.extract import Extraction, extract_answer, extract_gold

BOXED, FBOX, TAG, LINE = M.BOXED, M.FBOX, M.ANSWER_TAG, M.ANSWER_LINE
PHRASE, NUMBER, NONE = M.FINAL_ANSWER_PHRASE, M.LAST_NUMBER, M.NONE

# (response, answer, method, format_valid)
CASES: list[tuple[str, str, str | None, M, bool]] = [
    # --- seed 000 (cookbook): last box, brace depth, truncation, fallback -----
    ("s000-nested", r"blah \boxed{\frac{1}{2}} trailing", r"\frac{1}{2}", BOXED, True),
    ("s000-no-box-no-number", "no box here", None, NONE, False),
    ("s000-unterminated", r"\boxed{unterminated", None, NONE, False),
    # The cookbook's extract_candidate has no phrase step and says 41 here; ours reads
    # the phrase, which names 42.
    ("s000-last-number", "the answer is 42, not 41", "42", PHRASE, False),
    # The seed's naive extractor returns 41; a number ruled out by "not" is skipped.
    ("s000-last-number-plain", "we got 42, not 41", "42", NUMBER, False),
    ("s000-no-numbers", "no numbers here", None, NONE, False),
    ("s000-space-before-brace", r"so \boxed {14/3}.", "14/3", BOXED, True),
    ("s000-dollar-inside", r"\boxed{$14/3$}", "14/3", BOXED, True),
    # --- seed 001: corrected answer wins; fallbacks keep format_valid false ---
    ("s001-corrected", r"Draft \boxed{5}; corrected \boxed{7}.", "7", BOXED, True),
    ("s001-phrase", "Therefore the result is 4.", "4", PHRASE, False),
    ("s001-truncated", r"Final attempt: \boxed{4", "4", NUMBER, False),
    ("s001-boxed-frac", r"\boxed{\frac{2}{6}}", r"\frac{2}{6}", BOXED, True),
    ("s001-import", r"\boxed{__import__(os)}", "__import__(os)", BOXED, True),
    ("s001-sin", r"The value is \boxed{\sin(0)}.", r"\sin(0)", BOXED, True),
    # --- seed 002: canonical, missing, malformed, ambiguous, multiple markers -
    ("s002-canonical", r"The answer is \boxed{42}.", "42", BOXED, True),
    ("s002-empty-output", "", None, NONE, False),
    ("s002-whitespace-output", "  \n\t ", None, NONE, False),
    ("s002-empty-box", r"So \boxed{}.", None, NONE, False),
    ("s002-empty-box-spaces", r"So \boxed{  }", None, NONE, False),
    ("s002-malformed-close-first", r"\boxed}5{", "5", NUMBER, False),
    ("s002-multiple-markers", "Answer: 3\n\\boxed{4}", "4", BOXED, True),
    # boxes joined by nothing but connectors are one list answer (see boxchain)
    ("s002-three-boxes", r"\boxed{1} \boxed{2} \boxed{3}", "1, 2, 3", BOXED, True),
    ("s002-choice", r"\boxed{B}", "B", BOXED, True),
    ("s002-choice-answer-line", "Answer: (B)", "(B)", LINE, True),
    ("s002-gsm8k-line", "16 - 3 - 4 = <<16-3-4=9>>9\nA: 18", "18", LINE, True),
    ("s002-gsm8k-line-trailing-nl", "so 9 * 2 = 18\nA: 18\n\n", "18", LINE, True),
    # --- box variants --------------------------------------------------------
    ("box-no-braces", r"so \boxed 5.", "5", BOXED, True),
    ("box-no-braces-dollar", r"$\boxed 5$", "5", BOXED, True),
    ("box-bare-at-end", "so \\boxed", None, NONE, False),
    ("fbox", r"\fbox{3}", "3", FBOX, True),
    ("fbox-after-box", r"\boxed{2} then \fbox{3}", "3", FBOX, True),
    ("box-after-fbox", r"\fbox{2} then \boxed{3}", "3", BOXED, True),
    ("boxed-prefix-word", r"\boxed{9} \boxedx", "9", BOXED, True),
    ("box-escaped-braces", r"\boxed{\{1,2\}}", r"\{1,2\}", BOXED, True),
    (
        "box-unbalanced-escaped",
        r"\boxed{\left\{ x \right.}",
        r"\left\{ x \right.",
        BOXED,
        True,
    ),
    ("box-deep", r"\boxed{{{{1}}}}", "{{{1}}}", BOXED, True),
    ("box-inside-display", r"\[\boxed{x^2}\]", "x^2", BOXED, True),
    ("box-decimal", r"\boxed{0.5}", "0.5", BOXED, True),
    ("box-trailing-period", r"\boxed{5.}", "5", BOXED, True),
    ("box-factorial", r"\boxed{5!}", "5!", BOXED, True),
    ("box-text", r"\boxed{\text{odd}}", r"\text{odd}", BOXED, True),
    ("box-truncated-after-good", r"\boxed{3} hmm, \boxed{4", "4", NUMBER, False),
    ("box-truncated-with-line", "Answer: 3\n\\boxed{4", "3", LINE, False),
    # --- <answer> tag (R1-Zero style) ----------------------------------------
    ("tag-bare-number", "<answer>30</answer>", "30", TAG, True),
    ("tag-box-inside", r"<answer>\boxed{30}</answer>", "30", BOXED, True),
    ("tag-latex", r"<answer> $\frac{1}{2}$ </answer>", r"\frac{1}{2}", TAG, True),
    ("tag-empty", "<answer> </answer>", None, NONE, False),
    ("tag-after-box", r"\boxed{3} <answer>5</answer>", "5", TAG, True),
    ("box-after-tag", r"<answer>5</answer> \boxed{3}", "3", BOXED, True),
    ("tag-unclosed", "<answer>30", "30", NUMBER, False),
    ("tag-with-phrase", "<answer>The answer is 7.</answer>", "7", TAG, True),
    # --- <think> -------------------------------------------------------------
    ("think-then-box", r"<think>\boxed{3}</think> \boxed{5}", "5", BOXED, True),
    ("think-then-tag", "<think>maybe 3</think><answer>5</answer>", "5", TAG, True),
    ("think-then-number", "<think>maybe 3</think> it is 5", "5", NUMBER, False),
    ("think-only", r"<think>so \boxed{3}</think>", "3", BOXED, False),
    ("think-unterminated", r"<think>so \boxed{3}", "3", BOXED, False),
    ("think-unterminated-nothing", "<think>hmm", None, NONE, False),
    # --- answer lines --------------------------------------------------------
    ("line-answer", "work\nAnswer: 12", "12", LINE, True),
    ("line-upper", "work\nANSWER: 12", "12", LINE, True),
    ("line-bold", "work\n**Answer:** $12$.", "12", LINE, True),
    ("line-bold-colon-out", "work\n**Final Answer**: 12", "12", LINE, True),
    ("line-final", "work\nFinal Answer: 12", "12", LINE, True),
    (
        "line-minerva",
        "work\nFinal Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.",
        r"\frac{1}{2}",
        LINE,
        True,
    ),
    ("line-heading-next-line", "work\n## Final Answer\n\n$12$", "12", LINE, True),
    ("line-answer-next-line", "work\nAnswer:\n12", "12", LINE, True),
    ("line-last-wins", "Answer: 3\nwait\nAnswer: 4\ncheck: 4 = 4", "4", LINE, True),
    ("line-fullwidth-colon", "Answer：12", "12", LINE, True),
    ("line-gsm8k-not-last", "A: 18\nso it is 20", "20", NUMBER, False),
    ("line-gsm8k-lower", "so a: 18 here", "18", NUMBER, False),
    ("line-list", "Answer: 1, 2, 3", "1, 2, 3", LINE, True),
    (
        "line-prose-one-number",
        "Answer: she started 3 hours ago. Sure.",
        "she started 3 hours ago",  # the sentence policy reads 3 when it is parsed
        LINE,
        True,
    ),
    (
        "line-prose-two-numbers",
        "Answer: 3 apples, 4 pears",
        "3 apples, 4 pears",
        LINE,
        True,
    ),
    (
        "line-prose-is",
        "Final Answer: The volume of $V$ is 120. Sure.",
        "The volume of $V$ is 120",
        LINE,
        True,
    ),
    ("line-units-latex", r"Answer: 5 \text{ cm}", r"5 \text{ cm}", LINE, True),
    ("line-quoted", 'Final Answer: The final answer is \\"$12$\\".', "12", LINE, True),
    ("line-answer-dollars", "Answer: \\$18.90", r"\$18.90", LINE, True),
    (
        "line-after-boxes-wins",
        "so \\boxed{200} and \\boxed{255} in total.\n"
        "Final Answer: The final answer is $10,455$. I hope it is correct.",
        "10,455",
        LINE,
        True,
    ),
    (
        "inline-final-answer-after-box",
        r"so \boxed{255} more. Final Answer: The final answer is $10,455$. I hope",
        "10,455",
        LINE,
        True,
    ),
    (
        "inline-answer-not-marker",
        r"the answer: \boxed{5}, and answer: 6",
        "5",
        BOXED,
        True,
    ),
    ("box-on-answer-line", "Answer: \\boxed{5}", "5", BOXED, True),
    ("heading-then-box", "**Final Answer**\n\\boxed{5}", "5", BOXED, True),
    ("line-beats-truncated-box", "Answer: 3\n\\boxed{", "3", LINE, False),
    # --- phrases -------------------------------------------------------------
    (
        "phrase-final",
        "Thus the final answer is $\\sqrt{2}$.",
        r"\sqrt{2}",
        PHRASE,
        False,
    ),
    ("phrase-answer-colon", "So the answer is: 17", "17", PHRASE, False),
    ("phrase-paren", "The answer is \\(x+1\\).", "x+1", PHRASE, False),
    ("phrase-decimal", "the answer is 0.5.", "0.5", PHRASE, False),
    ("phrase-sentence-cut", "The answer is 6. Then we stop.", "6", PHRASE, False),
    ("phrase-newline-cut", "The answer is 6\nmore text 9", "6", PHRASE, False),
    ("phrase-last-wins", "The answer is 3. No, the answer is 4.", "4", PHRASE, False),
    # --- unmarked math: a closing math span, a bare answer (method last_number) -
    ("closing-math", r"So we get $x \in [-2,7]$.", r"x \in [-2,7]", NUMBER, False),
    ("closing-display", r"thus \[ \frac{x}{7} \]", r"\frac{x}{7}", NUMBER, False),
    ("closing-paren", r"thus \( 2^{10} \)", "2^{10}", NUMBER, False),
    ("closing-last-of-two", "between $a$ and $b$", "b", NUMBER, False),
    ("closing-whole", r"$\text{Even}$", r"\text{Even}", NUMBER, False),
    ("closing-escaped-dollar", "it costs 5\\$", "5", NUMBER, False),
    ("bare-expression", "x+1", "x+1", NUMBER, False),
    ("bare-tuple", "(1, 3)", "(1, 3)", NUMBER, False),
    ("bare-sqrt", "3sqrt(2)", "3sqrt(2)", NUMBER, False),
    ("bare-not-prose", "5 apples", "5", NUMBER, False),
    ("bare-too-long", "1+" * 60 + "1", "1", NUMBER, False),
    (
        "closing-then-words",
        r"Therefore $x \geq 5$ is the solution.",
        r"x \geq 5",
        NUMBER,
        False,
    ),
    ("closing-then-number", "so $x = 5$ and then 6 more", "6", NUMBER, False),
    ("closing-escaped-opener", r"Answer $ a \$ = 5 $", r"a \$ = 5", NUMBER, False),
    (
        "end-of-turn-cut",
        "so $(7, 6)$. <|im_start|>user\nWhat is 2+2?",
        "(7, 6)",
        NUMBER,
        False,
    ),
    ("end-of-turn-first", "<|im_end|> so 5", "5", NUMBER, False),
    # --- last number ---------------------------------------------------------
    ("num-negative", "so x equals -7", "-7", NUMBER, False),
    ("num-unicode-minus", "so x equals −7", "-7", NUMBER, False),
    ("num-range-not-negative", "pages 3-5", "5", NUMBER, False),
    ("num-decimal-end", "pi is about 3.14.", "3.14", NUMBER, False),
    ("num-thousands", "about 1,234 apples", "1,234", NUMBER, False),
    # "3,4" is a list or a decimal comma; either way "4" alone would be wrong
    ("num-list", "values 3,4", "3,4", NUMBER, False),
    ("num-decimal-comma", "Soucis : 2,74 $ a..", "2,74", NUMBER, False),
    ("num-fraction", "it is 3/4 of it", "3/4", NUMBER, False),
    ("num-leading-dot", "it is .5", ".5", NUMBER, False),
    ("num-glued-to-word", "we need 3 molecules of H2O", "3", NUMBER, False),
    ("num-only-in-word", "AZYUK2A", None, NONE, False),
    ("num-unit-after", "it is 5cm long", "5", NUMBER, False),
]


@pytest.mark.parametrize(
    ("response", "answer", "method", "format_valid"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_extract_answer_table(
    response: str, answer: str | None, method: M, format_valid: bool
) -> None:
    found = extract_answer(response)
    assert (found.answer, found.method, found.format_valid) == (
        answer,
        method,
        format_valid,
    ), found.reason


def test_extract_answer_ids_unique() -> None:
    ids = [case[0] for case in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("response", "fragment"),
    [
        (r"So \boxed{}.", "empty \\boxed{}"),
        (r"Final attempt: \boxed{4", "truncated \\boxed{"),
        ("we got 41", "final sentence"),
        ("we had 40 and 41", "last number"),
        (r"<think>\boxed{3}", "unterminated <think>"),
        (r"<think>\boxed{3}</think>", "inside <think>"),
        (r"<answer>\boxed{3}</answer>", "inside <answer>"),
        (r"\boxed}5{", "malformed \\boxed{"),
        ("so $x = 5$.", "closing math span"),
        ("x+1", "bare answer"),
    ],
    ids=[
        "empty",
        "truncated",
        "final-sentence",
        "last-number",
        "think-open",
        "think-only",
        "tag-box",
        "malformed",
        "closing-math",
        "bare",
    ],
)
def test_extract_answer_reason_says_why(response: str, fragment: str) -> None:
    assert fragment in extract_answer(response).reason


def test_extract_answer_returns_extraction() -> None:
    found = extract_answer(r"\boxed{1}")
    assert isinstance(found, Extraction)
    with pytest.raises(AttributeError):
        found.answer = "2"  # type: ignore[misc]


# (gold, expected)
GOLDS: list[tuple[str, str, str | None]] = [
    ("bare-int", "18", "18"),
    ("bare-spaces", "  18 \n", "18"),
    ("latex", r"\frac{14}{3}", r"\frac{14}{3}"),
    ("latex-dollars", r"$\frac{14}{3}$", r"\frac{14}{3}"),
    ("text-choice", r"\text{(C)}", r"\text{(C)}"),
    ("tuple", "(0,1)", "(0,1)"),
    ("decimal", "0.5", "0.5"),
    ("thousands-braces", "10{,}000", "10{,}000"),
    ("worked-solution", "So $$10\\cdot6\\cdot7=\\boxed{420}.$$ Done.", "420"),
    (
        "worked-two-boxes",
        r"First we find $a = \boxed{1}$ from the first equation; substituting it"
        r" into the second gives the area \boxed{\frac12}.",
        r"\frac12",
    ),
    # several boxes with little else: a list of answers, joined
    ("box-list", r"$\boxed{1}\boxed{2}$", "1, 2"),
    ("box-list-and", r"\(\boxed{1}\) and \(\boxed{-2}\).", "1, -2"),
    ("box-list-quad-text", r"$\boxed{1} \quad \text{and} \quad \boxed{2}$", "1, 2"),
    ("box-list-prose-between", r"\boxed{1} no no no no no \boxed{2}", "2"),
    ("box-list-words", r"\boxed{1} papers and \boxed{2} bins", "1, 2"),
    ("box-list-nested", r"\boxed{\frac{1}{2}}, \fbox{3}", r"\frac{1}{2}, 3"),
    ("box-truncated", r"\boxed{1} and \boxed{2", None),
    (
        "long-gold-phrase",
        "We compute. " * 20 + "Final Answer: The final answer is $28 \\%$.",
        "28 \\%",
    ),
    ("gsm8k-hashes", "Janet sells 9 eggs.\n#### 18", "18"),
    ("gsm8k-hashes-comma", "so\n#### 1,000", "1,000"),
    ("gsm8k-example-a-line", "She makes $<<9*2=18>>18.\nA: 18", "18"),
    ("answer-line", "Answer: 5", "5"),
    ("empty", "", None),
    ("whitespace", " \n ", None),
    ("empty-hashes", "work\n####", None),
    ("empty-box", r"so \boxed{}", None),
    ("huge-unmarked", "x" * 5000, None),
]


@pytest.mark.parametrize(
    ("gold", "expected"),
    [case[1:] for case in GOLDS],
    ids=[case[0] for case in GOLDS],
)
def test_extract_gold_table(gold: str, expected: str | None) -> None:
    assert extract_gold(gold) == expected


HOSTILE = {
    "1mb-digits": "1" * 1_000_000,
    "1mb-braces-open": "\\boxed{" + "{" * 1_000_000,
    "1mb-braces-closed": "\\boxed{" + "{" * 5_000 + "}" * 5_000 + "}" + "x" * 1_000_000,
    "deep-5000": "\\boxed{" + "{" * 5_000 + "1" + "}" * 5_001,
    "2000-boxes": "\\boxed{1} " * 2_000,
    "boxed-open-repeated": "\\boxed{" * 100_000,
    "answer-lines": "Answer: 1\n" * 100_000,
    "answer-spaces": "Answer" + " " * 1_000_000,
    "phrases": "the answer is " * 70_000,
    "think-spam": "<think>" * 100_000,
    "tags": "<answer>" * 50_000 + "</answer>" * 50_000,
    "dollars": "$" * 1_000_000,
    "backslashes": "\\boxed{" + "\\" * 1_000_000,
    "minus-digits": "-1" * 500_000,
    "commas": "1," * 500_000,
    "newlines": "\n" * 1_000_000,
    "periods": "5" + "." * 1_000_000,
    "answer-colon-lines": "Answer:\n" * 100_000,
    "answer-headings": "## Final Answer\n\n" * 100_000,
    "boxedx": "\\boxedx" * 100_000,
    "no-brace-boxes": "\\boxed " * 100_000,
    "glued-numbers": "a1" * 500_000,
    "glued-then-letters": "a1" * 1_000 + "x" * 1_000_000,
    "dollar-pairs": "$1$ " * 200_000,
    "escaped-dollars": "\\$" * 500_000,
    "final-answer-inline": "Final Answer: " * 70_000,
    "gold-box-list": "\\boxed{1} and " * 50_000,
}


@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_extract_hostile_is_fast(text: str) -> None:
    started = time.perf_counter()
    extract_answer(text)
    extract_gold(text)
    assert time.perf_counter() - started < 0.5
