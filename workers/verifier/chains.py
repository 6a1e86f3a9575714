"""Arithmetic chains written inside a sentence (`24 - 20 = 4 books`): the value a
true chain asserts.

A chain is a run of plain numbers, `+ - * / x ×  ÷`, brackets and `=`, read after
dropping one unit word after each number (`2 pounds/bag * 8 bags = 16 pounds` is
`2 * 8 = 16`). It asserts its final side when it shows a computation (some side
before the last is not a bare number), every side is evaluated exactly (Fractions,
no eval) and all sides are equal, the final side being allowed to round the others
to the digits it shows (`10 / 3 = 3.33`). A false chain asserts nothing. The final
side must also be the sentence's last written number: `After 3 * 4 = 12 hours it
covered 600 miles` asserts no value of the chain.

Linear: one regex pass without nested quantifiers, then a bounded scan per chain.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from fractions import Fraction

__all__ = ["true_chain_answer"]

# Chains longer than this (characters) are not read.
MAX_CHAIN_CHARS = 300
# Numbers longer than this are not evaluated (a chain of such is no sentence answer).
MAX_NUMBER_CHARS = 30
MAX_CHAINS = 20

_UNIT_AFTER = re.compile(r"(?<=\d)[ \t]*(?!x\b)[A-Za-z]{1,20}(?:/[A-Za-z]{1,20})?")
_CHAIN = re.compile(r"[\d.,$()+\-*/×÷−x \t]+(?:=[\d.,$()+\-*/×÷−x \t]+)+")
# A run of the characters a chain is made of, `=` included: every `_CHAIN` match lies
# inside one. `_CHAIN` is only tried on runs holding an `=`: tried on a whole text, it
# backtracks through every long run of digits and spaces without one (a table of
# numbers), quadratically (4 ms for one sentence of tests/bench's rollouts).
_RUN = re.compile(r"[\d.,$()+\-*/×÷−x \t=]+")
_TOKEN = re.compile(r"\d[\d,]*(?:\.\d+)?|[-+*/×÷−x()]")
_DIGIT_RUN = re.compile(r"\d")
_MUL = frozenset({"*", "x", "×"})
_DIV = frozenset({"/", "÷"})


def true_chain_answer(sentence: str) -> str | None:
    """The final side of the last true chain in `sentence` (see the module policy)."""
    if "=" not in sentence:
        return None
    text = _UNIT_AFTER.sub("", sentence)
    last_digit = max(text.rfind(d) for d in "0123456789")
    answer = None
    for k, (chain, end) in enumerate(_chains(text)):
        if k >= MAX_CHAINS:
            break
        if len(chain) <= MAX_CHAIN_CHARS:
            found = _chain_value(chain)
            if found is not None:
                answer = found if end > last_digit else None
    return answer


def _chains(text: str) -> Iterator[tuple[str, int]]:
    """`_CHAIN`'s matches in `text` with their end offsets, in order (the same as
    `_CHAIN.finditer(text)`: no match crosses the edge of a `_RUN`)."""
    for run in _RUN.finditer(text):
        if "=" in run.group():
            start = run.start()
            for match in _CHAIN.finditer(run.group()):
                yield match.group(), start + match.end()


def _chain_value(chain: str) -> str | None:
    """The final side of a true chain; leading sides that are not arithmetic (`x =
    3 + 4 = 7`, a label) are left out."""
    sides = [_side(side) for side in chain.replace("$", "").split("=")]
    values = [_evaluate(side) for side in sides]
    kept = len(values)
    while kept > 0 and values[kept - 1] is not None:
        kept -= 1
    sides, values = sides[kept:], values[kept:]
    if len(sides) < 2 or all(_bare(side) for side in sides[:-1]):
        return None  # no computation shown
    if not _bare(sides[-1]):
        return None
    first = values[0]
    for side, value in zip(sides[1:], values[1:], strict=True):
        if value != first and not _rounds_to(first, side):
            return None
    return sides[-1].replace(",", "")


def _side(side: str) -> str:
    """A side without edge punctuation and the unmatched bracket of a remark."""
    side = side.strip(" \t,.")
    for _ in range(MAX_CHAIN_CHARS):
        if side.count("(") > side.count(")"):
            side = side[side.index("(") + 1 :].strip()  # `8 (2 * 8`: the remark's
        elif side.count(")") > side.count("("):
            side = side[: side.rindex(")")].strip()
        else:
            break
    return side


def _bare(side: str) -> bool:
    tokens = _TOKEN.findall(side)
    return len(tokens) == 1 and tokens[0][0].isdigit()


def _rounds_to(exact: Fraction | None, written: str) -> bool:
    """Whether `written` (a decimal) is `exact` rounded to its digits."""
    if exact is None or "." not in written:
        return False
    places = len(written.rsplit(".", 1)[1])
    shown = _number(written)
    return shown is not None and abs(shown - exact) * 2 * 10**places <= 1


def _number(text: str) -> Fraction | None:
    digits = text.replace(",", "")
    if len(digits) > MAX_NUMBER_CHARS or not _DIGIT_RUN.match(digits):
        return None
    try:
        return Fraction(digits)
    except ValueError:
        return None


def _evaluate(side: str) -> Fraction | None:
    """Exact value of `+ - * / ( )` over plain numbers, or None (never eval)."""
    tokens = _TOKEN.findall(side)
    if not tokens or "".join(tokens) != "".join(side.split()):
        return None  # something besides numbers and operators
    parser = _Arithmetic(tokens)
    value = parser.sum()
    return value if parser.pos == len(tokens) else None


class _Arithmetic:
    """Recursive descent over at most `MAX_CHAIN_CHARS` characters of tokens."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def sum(self) -> Fraction | None:
        value = self.product()
        while value is not None and self.peek() in {"+", "-", "−"}:
            sign = self.tokens[self.pos]
            self.pos += 1
            term = self.product()
            if term is None:
                return None
            value = value + term if sign == "+" else value - term
        return value

    def product(self) -> Fraction | None:
        value = self.unary()
        while value is not None and (self.peek() in _MUL or self.peek() in _DIV):
            op = self.tokens[self.pos]
            self.pos += 1
            factor = self.unary()
            if factor is None or (op in _DIV and factor == 0):
                return None
            value = value * factor if op in _MUL else value / factor
        return value

    def unary(self) -> Fraction | None:
        token = self.peek()
        self.pos += 1
        if token in {"-", "−"}:
            inner = self.unary()
            return None if inner is None else -inner
        if token == "(" and self.depth < 10:
            self.depth += 1
            inner = self.sum()
            self.depth -= 1
            if self.peek() != ")":
                return None
            self.pos += 1
            return inner
        return _number(token) if token[:1].isdigit() else None
