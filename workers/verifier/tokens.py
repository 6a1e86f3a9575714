"""Whitelisted tokenizer: normalized answer text to a list of `Token`s, or `Refused`.

Anything outside the whitelist (unknown commands, stray symbols) refuses the answer; no
text is ever evaluated.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from workers.verifier.nodes import Refused

__all__ = ["FUNCTIONS", "Token", "tokenize"]

MAX_TOKENS = 600
MAX_DIGITS = 400

FUNCTIONS = frozenset(
    {
        "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan",
        "sinh", "cosh", "tanh", "ln", "log", "exp", "lg",
    }
)  # fmt: skip
# Commands the parser understands; everything else is refused.
_COMMANDS = FUNCTIONS | {
    "frac", "sqrt", "binom", "pi", "infty", "infin", "cdot", "times", "div", "pm", "mp",
    "le", "leq", "leqslant", "ge", "geq", "geqslant", "ne", "neq", "lt", "gt", "approx",
    "cup", "in", "begin", "end", "{", "}", "|", "vert", "lvert", "rvert", "mid", "e",
    "emptyset", "varnothing", "sim", "equiv", "to", "rightarrow", "implies", "ldots",
    "dots", "cdots", "tfrac", "over", "mathbb", "alpha", "beta", "gamma", "theta",
    "lambda", "mu", "phi", "omega", "sigma", "tau", "rho", "delta", "epsilon", "circ",
    "lceil", "rceil", "lfloor", "rfloor",
    # accents and operator names: read only inside a subscript (`E_{\widetilde{10}}`,
    # `m_{\max}`); anywhere else the parser refuses them
    "widetilde", "tilde", "hat", "widehat", "bar", "vec", "max", "min",
}  # fmt: skip
_UNITS_TWO = frozenset(
    {"cm", "mm", "km", "kg", "mg", "ft", "yd", "mi", "hr", "ml", "pt"}
)
# Two-letter English words, never a product of two variables (`80% of the girls`;
# not `at`, `an`, `by`...: `\frac12 at^2` is a product).
_WORDS_TWO = frozenset({"or", "in", "pi", "is", "be", "of", "to"})
_RE_TOKEN = re.compile(
    r"(?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+(?![a-zA-Z]))?|\.\d+)"
    r"|(?P<cmd>\\(?:[a-zA-Z]+|[{}|]))"
    r"|(?P<word>[a-zA-Z]+)"
    r"|(?P<op><=|>=|!=|\\\\|[-+*/^_!=<>()\[\]{},;|&%:'])"
    r"|(?P<space>\s+)"
)


class Token(NamedTuple):
    """One lexical token: kind is num, id, word, cmd, op or end."""

    kind: str
    text: str


def tokenize(text: str) -> list[Token]:
    """Split normalized text into tokens, refusing anything not whitelisted.

    Args:
        text: output of `normalize`.

    Returns:
        Tokens ending with an ``end`` token.

    Raises:
        Refused: unknown characters or commands, too many tokens, or too many digits.
    """
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _RE_TOKEN.match(text, pos)
        if m is None:
            raise Refused(f"character {text[pos]!r} at {pos}")
        pos = m.end()
        kind = m.lastgroup or "space"
        if kind != "space":
            out.extend(_classify(kind, m.group(0)))
        if len(out) > MAX_TOKENS:
            raise Refused(f"more than {MAX_TOKENS} tokens")
    out.append(Token("end", ""))
    return out


def _classify(kind: str, text: str) -> list[Token]:
    if kind == "num":
        if sum(c.isdigit() for c in text) > MAX_DIGITS:
            raise Refused(f"number with more than {MAX_DIGITS} digits")
        return [Token("num", text)]
    if kind == "cmd":
        name = text[1:]
        if name not in _COMMANDS:
            raise Refused(f"command \\{name}")
        return [Token("cmd", name)]
    if kind == "word":
        return _word(text)
    return [Token("op", text)]


def _word(text: str) -> list[Token]:
    low = text.lower()
    if len(text) == 1:
        return [Token("id", text)]
    if low in FUNCTIONS:
        return [Token("cmd", low)]
    if len(text) == 2 and low not in _UNITS_TWO and low not in _WORDS_TWO:
        return [Token("id", c) for c in text]
    if low == "pi":
        return [Token("cmd", "pi")]
    return [Token("word", low)]
