"""The sentence policy: reading the asserted value out of a short prose answer.

Used wherever an answer is found (an `<answer>` tag, an `Answer:` line, the tail of
"the answer is ...", an unmarked final sentence) when the span is prose the parser
cannot read as math. An explicit answer phrase is looked for first by the extractor,
so "... 14 loaves. The answer is: 10" gives 10. Policy, on the last sentence holding a
value (questions skipped):

1. A negated or hedged sentence (`not`, `never`, `maybe`, `excluded`, `about`, `any`,
   ...; "neither pens nor pencils", holding no value, is a description, not a
   denial) gives no answer, nor
   does one that ends in the middle of an expression (`... to get 8 + )`).
2. Values are numbers (`14`, `$2,100`, `-3.5`, `3/4`, `35%`), number words (`five`,
   `twenty-one`; not "one", mostly an article: "one pack of gum") and math spans
   holding a digit or a command (`$14\\frac{4}{7}$`). Label-like numbers are not
   values: `#3`, `week 3`, `Step 2`, `3rd`, `10-year-old`, `the first two weeks`,
   `more than 16`, and a number word after a determiner (`the two farms`). Remarks are
   dropped first: a parenthetical holding words and a `because`/`since` clause.
   A digit glued to a word (`11’Brien`, `4abc`) is no value; a glued unit (`16cm`)
   leaves one.
3. A true arithmetic chain anywhere in the sentence asserts its final side when
   that side is the sentence's last written number, whatever else the sentence
   holds (`reread 24 - 20 = 4 books to have two books a month` gives 4; units
   inside the chain are dropped: `2 pounds/bag * 8 bags = 16 pounds` gives 16; see
   `chains`). Otherwise one value: that value (units and words around it are
   dropped: `The bakery sold 14 loaves.` gives 14); one value said again in words
   (`47 (the cat catches 47 animals`) is that one value.
4. Several: the one value after the last `=`, `\\approx` or copula (`is`, `are`, `was`,
   `were`, `be`, `equals`, `gives`, `makes`, `totals`): `20 + 5 = 25 shells` gives 25,
   `The cost for the 36-minute call would be $8.00` gives 8.00. Two or more values
   after it, or no such word, and the sentence is refused (`Five vans will carry 60
   boxes.`): it names several numbers and asserts none.
5. No value at all: not a numeric sentence; the span is left to the parser (text
   answers such as `Monday`).

Linear in the span, which is bounded by `MAX_SENTENCE_SPAN_CHARS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise

from workers.verifier.chains import true_chain_answer

__all__ = [
    "MAX_SENTENCE_SPAN_CHARS",
    "Reading",
    "first_sentence",
    "is_label_number",
    "is_prose",
    "read_sentence",
]

MAX_SENTENCE_SPAN_CHARS = 4_000
MAX_VALUES = 50
MAX_REPEATS = 3

_NEGATION = re.compile(
    r"\b(?:not|no|never|none|neither|nor|cannot|maybe|perhaps|possibly|probably"
    r"|impossible|excluded|except|excluding|wrong|false|incorrect|undefined|invalid"
    r"|unknown|either|any|between|about|around|roughly|approximately|nearly|almost)\b"
    r"|n't\b",
    re.IGNORECASE,
)
_UNITS = {
    "zero": 0, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
    "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17,
    "eighteen": 18, "nineteen": 19,
}  # fmt: skip
_TENS = {
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
    "eighty": 80, "ninety": 90,
}  # fmt: skip
_LABEL_WORDS = frozenset(
    {
        "step", "steps", "week", "day", "part", "question", "problem", "round", "page",
        "line", "chapter", "case", "item", "no", "grade", "level", "exercise",
        "example", "figure", "table", "equation", "option", "choice", "room", "row",
        "column", "term", "stage", "phase", "version",
        # "the first two weeks", "the next 3 days": a span named, not a result
        "first", "last", "next", "past", "previous", "following",
        # "more than 16 seconds": a comparison's reference, not a result
        "than",
    }
)  # fmt: skip
_MARKERS = re.compile(
    r"=|\\approx|≈|\b(?:is|are|was|were|be|equals|equal|gives|makes|totals)\b",
    re.IGNORECASE,
)
_ONES = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
         "eight": 8, "nine": 9}  # fmt: skip
_NUMBER_WORD = "|".join(sorted([*_UNITS, *_TENS], key=len, reverse=True))
_VALUE = re.compile(
    r"(?P<math>\$(?=[^\s\d])(?:\\.|[^$\\]){0,400}?(?<=\S)\$(?!\d)"
    r"|\$\d[^$\s]{0,40}\$(?!\d)|\\\((?:[^\\]|\\(?!\))){0,400}?\\\))"
    r"|(?P<num>(?<![\w.])[-−]?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?%?)"
    rf"|(?P<word>\b(?:{_NUMBER_WORD})(?:-(?:{'|'.join(_ONES)}))?\b)",
    re.IGNORECASE,
)
# Three letters or more: `dx`, `cm`, `of` alone do not make math into prose, nor do
# code identifiers (`total_cost`, `__name__`).
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z_])[A-Za-z]{3,}(?![A-Za-z_])")
_MATH_WORDS = frozenset(
    {"sqrt", "sin", "cos", "tan", "log", "ln", "exp", "pi", "or", "and", "cm", "mm",
     "km", "kg", "mg", "ft", "yd", "mi", "hr", "ml", "pt", "in", "oz", "lb", "lbs"}
)  # fmt: skip
_END = re.compile(r"[.!?](?=\s|\Z)|\n")
_REMARK = re.compile(r"(?<!\\)\((?=[^()\\]*[A-Za-z]{3})[^()\\]{0,300}\)")
_BECAUSE = re.compile(r"\b(?:because|since)\b", re.IGNORECASE)
# "the two farms", "both three-digit numbers": a number word naming a group
_DETERMINERS = re.compile(
    r"\b(?:the|these|those|both|all|its|their)\s+\Z", re.IGNORECASE
)
# An operator after the last value with no operand after it (`... to get 8 + )`).
_DANGLING = re.compile(r"\s*[-+*/×÷=]\s*(?![\s\w$(\\])")
_WORD_BEFORE = re.compile(r"\b([A-Za-z]+)[ \t]+\Z")
# "neither pens nor pencils": a pair of things the answer is not, not a hedge on it.
_NEITHER_NOR = re.compile(r"\bneither\b[^.!?\n]{0,80}?\bnor\s+[A-Za-z]+", re.IGNORECASE)
# Letters glued after a number that still leave it a number (`16cm`, `5kg`, `3pm`).
_GLUED_UNITS = frozenset(
    {"cm", "mm", "km", "m", "kg", "g", "mg", "l", "ml", "s", "h", "hr", "hrs", "min",
     "mins", "ft", "in", "yd", "mi", "oz", "lb", "lbs", "mph", "k", "am", "pm", "x"}
)  # fmt: skip
_ORDINAL = re.compile(r"(?:st|nd|rd|th)\b", re.IGNORECASE)
_LETTERS = re.compile(r"[A-Za-z]+")
_ASCII_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True, slots=True)
class Reading:
    """What a prose span asserts: `answer` (a short value text), or why not.

    `answer` None with `refusal` "" means the span holds no value (not a numeric
    sentence); with `refusal` set, the sentence is refused as an answer.
    """

    answer: str | None
    refusal: str = ""


@dataclass(frozen=True, slots=True)
class _Value:
    start: int
    end: int
    text: str


def read_sentence(span: str) -> Reading:
    """Apply the sentence policy (module docstring) to a prose answer span."""
    if len(span) > MAX_SENTENCE_SPAN_CHARS:
        return Reading(None, f"prose answer longer than {MAX_SENTENCE_SPAN_CHARS}")
    for whole in reversed(_sentences(span)):
        if whole.rstrip().endswith("?"):
            continue
        sentence = _main_clause(whole)
        values = _values(sentence)
        if not values:
            continue
        if _NEGATION.search(_NEITHER_NOR.sub(_no_value, _outside_math(sentence))):
            return Reading(None, "sentence answer is negated or hedged")
        if _DANGLING.match(sentence, values[-1].end):
            return Reading(None, "sentence ends in the middle of an expression")
        chained = true_chain_answer(whole)
        if chained is not None:
            return Reading(chained)
        if _said_again(sentence, values):
            return Reading(values[0].text)
        return _asserted(sentence, values)
    return Reading(None)


def _said_again(sentence: str, values: list[_Value]) -> bool:
    """One value said again in words (`47 (the cat catches 47 animals`): at most
    `MAX_REPEATS` times, with words between (a matrix of ones is no sentence)."""
    if len(values) > MAX_REPEATS or len({value.text for value in values}) != 1:
        return False
    return all(
        _PROSE_WORD.search(sentence, a.end, b.start) is not None
        for a, b in pairwise(values)
    )


def _no_value(match: re.Match[str]) -> str:
    """A "neither pens nor pencils" holding no value: a description, not a denial."""
    return match.group() if _VALUE.search(match.group()) else " "


def _main_clause(sentence: str) -> str:
    """The sentence without its remarks: a parenthetical holding words (`2 (the primes
    are 23 and 29)`) and a `because`/`since` clause after a value are explanations."""
    sentence = _REMARK.sub(" ", sentence)
    match = _BECAUSE.search(sentence)
    if match is not None and _VALUE.search(sentence, 0, match.start()) is not None:
        return sentence[: match.start()]
    return sentence


def _asserted(sentence: str, values: list[_Value]) -> Reading:
    markers = [m for m in _MARKERS.finditer(sentence) if not _in_values(m, values)]
    if markers:
        after = [v for v in values if v.start >= markers[-1].end()]
        if len(after) == 1:
            return Reading(after[0].text)
    return Reading(None, "sentence with several numbers asserts none of them")


def _in_values(marker: re.Match[str], values: list[_Value]) -> bool:
    return any(v.start <= marker.start() < v.end for v in values)


def _sentences(span: str) -> list[str]:
    """Split at `. ` `! ` `? ` and newlines outside `$...$` math."""
    pieces: list[str] = []
    start = 0
    math_spans = _math_ranges(span)
    for match in _END.finditer(span):
        if any(a <= match.start() < b for a, b in math_spans):
            continue
        pieces.append(span[start : match.end()])
        start = match.end()
    pieces.append(span[start:])
    return [piece for piece in pieces if piece.strip()]


def _math_ranges(span: str) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for match in _VALUE.finditer(span):
        if match.group("math") is not None:
            ranges.append(match.span())
            if len(ranges) > MAX_VALUES:
                break
    return ranges


def _outside_math(sentence: str) -> str:
    return _VALUE.sub(lambda m: " " if m.group("math") else m.group(), sentence)


def _values(sentence: str) -> list[_Value]:
    values: list[_Value] = []
    for match in _VALUE.finditer(sentence):
        text = _value_text(sentence, match)
        if text is not None:
            values.append(_Value(match.start(), match.end(), text))
        if len(values) > MAX_VALUES:
            break
    return values


def _value_text(sentence: str, match: re.Match[str]) -> str | None:
    """The value a match stands for, or None when it is a label or a name."""
    if match.group("math") is not None:
        inner = match.group("math")
        body = inner[1:-1] if inner.startswith("$") else inner[2:-2]
        has_value = any(c.isdigit() for c in body) or "\\" in body
        return body.strip() if has_value and body.strip() else None
    if _is_label(sentence, match.start(), match.end()):
        return None
    if match.group("word") is not None:
        return _word_value(sentence, match)
    glued = _glued(sentence, match)
    if glued:
        return glued
    text = match.group("num").replace("$", "").replace("−", "-").rstrip(",")
    return text or None


def _glued(sentence: str, match: re.Match[str]) -> str:
    """A number glued to a word (`11’Brien`, `8r`) as the whole token: a name or a
    term, never the bare number (it still counts as a value, so `3r - 21 = 12 - 8r`
    asserts none); "" when nothing or a unit (`16cm`) is glued to it."""
    end = match.end()
    if match.group("num") is None or end >= len(sentence):
        return ""
    if sentence[end] in "’'" and sentence[end + 1 : end + 2].isalpha():
        end += 1
    elif sentence[end] not in _ASCII_LETTERS:
        return ""
    letters = _LETTERS.match(sentence, end)
    unit = letters is not None and letters.group().lower() in _GLUED_UNITS
    if letters is None or (unit and end == match.end()):
        return ""
    return sentence[match.start() : letters.end()]


def is_prose(span: str) -> bool:
    """Words outside math: a run of two or more letters that is not a command."""
    outside = _outside_math(span[:MAX_SENTENCE_SPAN_CHARS])
    return any(
        word.group().lower() not in _MATH_WORDS
        for word in _PROSE_WORD.finditer(outside)
    )


def first_sentence(span: str) -> str:
    """The span up to its first sentence end outside math (an answer line's answer)."""
    sentences = _sentences(span[:MAX_SENTENCE_SPAN_CHARS])
    return sentences[0] if sentences else span


def is_label_number(text: str, start: int, end: int) -> bool:
    """Whether the number at text[start:end] is a label (`#3`, `week 3`, `3rd`)."""
    return _is_label(text, start, end)


def _is_label(sentence: str, start: int, end: int) -> bool:
    before = sentence[max(0, start - 20) : start]
    mark = before.rstrip()
    if mark.endswith(("No.", "no.")) or (
        mark.endswith("#") and not mark.endswith("####")  # GSM8K's marker, no label
    ):
        return True
    word = _WORD_BEFORE.search(before)
    if word is not None and word.group(1).lower() in _LABEL_WORDS:
        return True
    after = sentence[end : end + 12]
    if _ORDINAL.match(after):
        return True
    return after.startswith("-") and after[1:2].isalpha()  # `10-year-old`


def _word_value(sentence: str, match: re.Match[str]) -> str | None:
    if _DETERMINERS.search(sentence, max(0, match.start() - 12), match.start()):
        return None
    parts = match.group().lower().split("-")
    value = 0
    for part in parts:
        value += _TENS.get(part, 0) or _UNITS.get(part, 0) or _ONES.get(part, 0)
    return str(value)
