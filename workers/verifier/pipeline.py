"""From answer text to a parsed answer: bounds, normalization, parsing, gold cache.

Bounds are checked before any work: length, bracket nesting, then (in the parser and
the exact evaluator) token counts, digits, exponents and magnitudes.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction

from workers.verifier.extract import extract_gold
from workers.verifier.nodes import Node, Refused, num, render
from workers.verifier.normalize import normalize
from workers.verifier.parse import parse_text
from workers.verifier.sentences import MAX_SENTENCE_SPAN_CHARS, is_prose, read_sentence
from workers.verifier.values import exact_value

__all__ = ["MAX_ANSWER_CHARS", "MAX_NESTING", "Parsed", "parse_answer", "parse_gold"]

MAX_ANSWER_CHARS = 1_000
MAX_NESTING = 40
GOLD_CACHE_SIZE = 8_192
MAX_CACHED_GOLD_CHARS = 10_000
_RE_PLAIN_INT = re.compile(r"-?\d{1,30}")
_RE_PLAIN_DEC = re.compile(r"-?\d{0,30}\.\d{1,30}")
_RE_PLAIN_FRAC = re.compile(r"(-?\d{1,30})/(\d{1,30})")
_RE_LATEX_FRAC = re.compile(r"(-?)\\[dt]?frac\{(\d{1,30})\}\{(\d{1,30})\}")
_RE_MIXED = re.compile(r"(-?)(\d{1,30})[ \t]+(\d{1,30})/(\d{1,30})")
# `20:34:00`, `08:34 \text{P.M.}`: a clock time, read as `hours:minutes`.
_RE_CLOCK = re.compile(
    r"\s*(\d{1,2}):([0-5]\d)(?::([0-5]\d))?\s*"
    r"(?:\\(?:text|mathrm)\s*\{\s*)?(?:([AaPp])\.?\s*[Mm]\.?)?\s*\}?\s*"
)
# `2,74`: two numbers or a decimal comma (thousands groups are merged by now).
_RE_DECIMAL_COMMA = re.compile(r"-?\d{1,30},\d{1,30}")


@dataclass(frozen=True, slots=True)
class Parsed:
    """A parsed answer: the tree and its canonical rendering, or why it was refused."""

    node: Node | None
    canonical: str | None
    error: str = ""


def parse_answer(text: str, *, sentences: bool = True) -> Parsed:
    """Parse one extracted answer, never raising.

    Args:
        text: the extracted answer.
        sentences: read prose through the sentence policy (off for golds: a gold
            is an exact reference, never guessed from words).

    Prose the parser cannot read as math (words around the numbers) goes through the
    sentence policy (`workers.verifier.sentences`): the value it asserts is parsed
    instead, or the answer is refused when the sentence asserts no single value.

    Returns:
        A `Parsed` with a tree, or with `error` set when the answer is outside what
        we decide (too long, too deep, unknown syntax, too large to evaluate).
    """
    if ":" in text:
        text = clock_time(text)
    fast = _fast_number(text)
    if fast is not None:
        return Parsed(fast, render(fast))
    if not sentences:
        return _parse_math(text)
    too_long = Parsed(None, None, f"answer longer than {MAX_ANSWER_CHARS} characters")
    if MAX_ANSWER_CHARS < len(text) <= MAX_SENTENCE_SPAN_CHARS and is_prose(text):
        return _from_sentence(text, too_long)
    parsed = _parse_math(text)
    if parsed.node is not None and parsed.node.kind != "text":
        return parsed
    if not is_prose(text):
        return parsed
    return _from_sentence(text, parsed)


def _from_sentence(text: str, parsed: Parsed) -> Parsed:
    """The sentence policy's reading of prose `text`; `parsed` when it has no value."""
    reading = read_sentence(text)
    if reading.answer is not None:
        fast = _fast_number(reading.answer)
        if fast is not None:
            return Parsed(fast, render(fast))
        inner = _parse_math(reading.answer)
        return inner if inner.node is not None else parsed
    if reading.refusal:
        return Parsed(None, None, reading.refusal)
    return parsed


def _parse_math(text: str) -> Parsed:
    try:
        _check_size(text)
        normalized = normalize(text)
        node = _mark_decimal_comma(parse_text(normalized), normalized)
        exact_value(node)  # bounds every power, factorial and magnitude up front
    except Refused as exc:
        return Parsed(None, None, str(exc))
    except RecursionError:
        return Parsed(None, None, "nesting too deep")
    return Parsed(node, render(node))


def parse_gold(gold: str) -> tuple[str | None, Parsed]:
    """Extract and parse a gold answer, cached: one gold meets many samples in RL.

    Golds longer than `MAX_CACHED_GOLD_CHARS` are parsed without caching, so the cache
    holds at most about 80 MB however hostile the golds are.

    Args:
        gold: the gold as given (bare answer, LaTeX, worked solution, ``#### 18``).

    Returns:
        The extracted gold text (None if unreadable) and its parse.
    """
    if len(gold) > MAX_CACHED_GOLD_CHARS:
        return _parse_gold(gold)
    return _parse_gold_cached(gold)


def _parse_gold(gold: str) -> tuple[str | None, Parsed]:
    text = extract_gold(gold)
    if text is None or not text.strip():
        return None, Parsed(None, None, "no answer in gold")
    return text, parse_answer(text, sentences=False)


_parse_gold_cached = functools.lru_cache(maxsize=GOLD_CACHE_SIZE)(_parse_gold)


def clock_time(text: str) -> str:
    """`20:34:00` as `20:34` (zero seconds), `08:34 P.M.` as `20:34`; other text as
    it is. Hours must fit the clock (1 to 12 with a.m./p.m., 0 to 23 without)."""
    match = _RE_CLOCK.fullmatch(text)
    if match is None:
        return text
    hours, minutes, seconds, half = match.groups()
    hour = int(hours)
    if half is not None:
        if not 1 <= hour <= 12:
            return text
        hour = hour % 12 + (12 if half in "Pp" else 0)
    elif seconds is None or hour > 23:
        return text  # `3:45` may be a ratio: only a written clock time is changed
    clock = f"{hour}:{minutes}"
    return clock if seconds in (None, "00") else f"{clock}:{seconds}"


def _fast_number(text: str) -> Node | None:
    s = text.strip()
    if _RE_PLAIN_INT.fullmatch(s):
        value = int(s)
        return Node("neg", (num(-value),)) if s.startswith("-") else num(value)
    if _RE_PLAIN_DEC.fullmatch(s):
        neg = s.startswith("-")
        body = s.lstrip("-")
        literal = ("0" + body if body.startswith(".") else body).rstrip(".")
        node = num(Fraction(literal), literal)
        return Node("neg", (node,)) if neg else node
    match = _RE_PLAIN_FRAC.fullmatch(s)
    if match:
        top, bottom = int(match.group(1)), int(match.group(2))
        node = Node("div", (num(abs(top)), num(bottom)))
        return Node("neg", (node,)) if match.group(1).startswith("-") else node
    match = _RE_MIXED.fullmatch(s)
    if match:  # `3128 1/2`: a whole number and a proper fraction
        whole, top, bottom = (int(match.group(k)) for k in (2, 3, 4))
        if not 0 < top < bottom:
            return None
        node = Node("add", (num(whole), Node("div", (num(top), num(bottom)))))
        return Node("neg", (node,)) if match.group(1) else node
    match = _RE_LATEX_FRAC.fullmatch(s)
    if match:
        node = Node("div", (num(int(match.group(2))), num(int(match.group(3)))))
        return Node("neg", (node,)) if match.group(1) else node
    return None


def _mark_decimal_comma(node: Node, normalized: str) -> Node:
    """Tag `2,74` (no space) with its decimal-comma reading: `(list:comma:2.74 2 74)`.

    The comparison tries that reading only against a single value (see `compare`).
    """
    if node.kind != "list" or _RE_DECIMAL_COMMA.fullmatch(normalized) is None:
        return node
    return Node("list", node.kids, text="comma:" + normalized.replace(",", "."))


def _check_size(text: str) -> None:
    if len(text) > MAX_ANSWER_CHARS:
        raise Refused(f"answer longer than {MAX_ANSWER_CHARS} characters")
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    if deepest > MAX_NESTING:
        raise Refused(f"nesting deeper than {MAX_NESTING}")
