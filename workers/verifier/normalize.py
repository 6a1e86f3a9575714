"""String-level clean-up of an extracted answer: unicode, LaTeX wrappers, commas.

The output is still text; `parse.py` turns it into whitelisted tokens and a tree.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

from workers.verifier.parse_atoms import NOT_UNITS

__all__ = ["normalize"]

_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻ⁿ", "0123456789+-n")
_RE_SUPER = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻ⁿ]+")

# Unicode look-alikes mapped to the LaTeX the parser knows (applied after NFKC).
_UNICODE = {
    "−": "-",
    "–": "-",
    "—": "-",
    "×": r"\times ",
    "·": r"\cdot ",
    "⋅": r"\cdot ",
    "÷": "/",
    "⁄": "/",  # fraction slash (NFKC turns ½ into 1⁄2)
    "√": r"\sqrt ",
    "π": r"\pi ",
    "∞": r"\infty ",
    "≤": r"\le ",
    "≥": r"\ge ",
    "≠": r"\ne ",
    "≈": r"\approx ",
    "°": r"^\circ ",
    "∪": r"\cup ",
    "±": r"\pm ",
    "∈": r"\in ",
    "€": "",
    "£": "",
    "\u00a0": " ",
}
# Vulgar fractions (½) as \frac, before NFKC would glue `2½` into `21⁄2`.
_VULGAR = {
    ch: r"\frac{" + unicodedata.normalize("NFKC", ch).replace("⁄", "}{") + "}"
    for ch in "½⅓⅔¼¾⅕⅖⅗⅘⅙⅚⅐⅛⅜⅝⅞⅑⅒"
}
_RE_VULGAR = re.compile("[" + "".join(_VULGAR) + "]")
_RE_ROOT_DIGITS = re.compile(r"√(\d+(?:\.\d+)?)")  # √19 is √(19), unlike \sqrt19
# `sqrt(3)` and `\\sqrt(3)` in plain-text answers: the square root of what the
# parentheses hold (`sqrt[3]` is left alone: in LaTeX it opens a cube root).
_RE_PAREN_SQRT = re.compile(r"(?<![a-zA-Z])\\?sqrt\s*\(([^()]{1,40})\)")
# `26 x 5 x 1000` in plain text: a spaced x between numbers multiplies.
_RE_TEXT_TIMES = re.compile(r"(?<=\d) x (?=\d)")
_RE_UNICODE = re.compile("|".join(map(re.escape, _UNICODE)))

# Pure layout: removed outright.
_RE_LAYOUT = re.compile(
    r"\\left\.|\\right\.|\\left|\\right|\\[bB]igg?[lr]?|\\displaystyle|\\limits"
    r"|\\q?quad|\\[,!;:> ]|~|\\\(|\\\)|\\\[|\\\]|\$|\\\$|\\!"
)
_RE_FRAC = re.compile(r"\\[dtc]frac")
_RE_BINOM = re.compile(r"\\[dt]binom")
_RE_WRAPPER = re.compile(
    r"\\(?:text(?:normal|rm|bf|it|up)?|mbox|mathrm|mathbf|mathit|mathsf|textsf|boldsymbol"
    r"|operatorname\*?|hbox|emph)\s*(?=\{)"
)
_RE_PRIME = re.compile(r"\^\s*\{\s*\\prime\s*\}|\^\s*\\prime|\\prime")
_RE_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree|\^\s*\{\s*o\s*\}")
_RE_BARE_CIRC = re.compile(r"\\circ")
# A degree sign is kept as `\circ`: the parser reads `30^\circ` as an angle with two
# readings, the number 30 and the radians pi/6 (see `compare`). A bare `\circ` (no
# caret) is a degree only inside a trig argument; elsewhere (`f \circ g`) it is dropped.
_RE_TRIG = re.compile(r"(?<![a-zA-Z])(?:sin|cos|tan|sec|csc|cot)(?![a-zA-Z])")
# The real line is the interval it names (before NFKC, which folds ℝ into a plain R).
_RE_REALS = re.compile(r"\\mathbb\s*\{\s*R\s*\}|\\mathbb\s+R(?![a-zA-Z])|ℝ")
_RE_GROUP_COMMA = re.compile(r"(?<=\d)\s*\{\s*,\s*\}\s*(?=\d{3})")
_RE_SPACED_COMMA = re.compile(r"(?<=\d),\\[!,]\s*(?=\d{3})")
_RE_THIN_SPACE = re.compile(r"(?<=\d)\\[,!;:]\s*(?=\d{3})")
_RE_REPEATING = re.compile(r"(\d*)\.(\d*)\\overline\s*\{?(\d{1,20})\}?")
_RE_SPACE_THOUSANDS = re.compile(r"-?\d{1,3}(?: \d{3})+(?:\.\d+)?")
# A leading group of 0 is never a thousands group: `0,111` is not 111.
_RE_COMMA_THOUSANDS = re.compile(r"(?<![\d.,])[1-9]\d{0,2}(?:,\d{3})+(?![\d,])")
_RE_SPACES = re.compile(r"\s+")
_RE_LEADING_REL = re.compile(r"^(?:=|\\approx|:)\s*")  # "= 5", "\approx 3.14"
# Doubled backslashes before a command (``\\\\left(``) come from over-escaped strings.
_RE_DOUBLED = re.compile(
    r"\\\\(?=(?:left|right|frac|dfrac|tfrac|sqrt|le|leq|ge|geq|ne|neq|text|pi|infty"
    r"|cdot|times|boxed|in|cup|pm)(?![a-z]))"
)
# Control characters that over-unescaped strings leave behind (``"\frac"`` in Python).
_CONTROL = {"\x0c": "\\f", "\x08": "\\b", "\x07": "\\a", "\x0b": "\\v"}


# `12^{\text{th}}`, `3^{rd}`: an ordinal mark after a number (the number is the answer).
_RE_ORDINAL = re.compile(
    r"(?<=\d)\s*\^\s*(?:\{\s*(?:\\text(?:rm)?\s*)?\{?\s*(?:st|nd|rd|th)\s*\}?\s*\}"
    r"|\\text(?:rm)?\s*\{\s*(?:st|nd|rd|th)\s*\}|(?:st|nd|rd|th)(?![A-Za-z]))"
)
# One unit group ending the answer: `\text{ m/s^{2}}`, `\text{ kcal m}^{-2}`.
_RE_UNIT_TAIL = re.compile(
    r"\\(?:text|mathrm|mbox|textrm)\s*\{"
    r"(?P<unit>\s*[A-Za-z][A-Za-z /^{}.\d⁰¹²³⁴⁵⁶⁷⁸⁹⁻-]{0,40})\}"
    r"(?:\s*\^\s*(?:\{\s*-?\d{1,2}\s*\}|-?\d))?\s*"
)
_RE_UNIT_WORD = re.compile(r"[A-Za-z]+")
_RE_DIGIT = re.compile(r"\d")
# Words that change what a value means: never dropped as a unit.
_NOT_UNIT_WORDS = frozenset(
    {"or", "and", "not", "no", "more", "less", "than", "least", "most", "only", "to",
     "of", "for", "if", "when", "where", "is", "are", "the", "times", "plus", "minus",
     "over", "under", "about", "around", "nearly", "almost", "none", "either",
     "neither", "nor", "otherwise", "else", "each", "all", "any", "some", "at", "in"}
)  # fmt: skip
MAX_UNIT_GROUPS = 4
# `A = f(w), \quad \text{for } w \ne 2`: a condition after the value is no part of it.
_RE_CONDITION = re.compile(
    r"(?:[\s,;]|\\q?quad|\\[,;:!])*\\(?:text|mbox|mathrm)\s*\{\s*(?:for|if|when|where)\b",
    re.IGNORECASE,
)
_RE_PIECEWISE = re.compile(r"[,;&]|\\\\|otherwise|else", re.IGNORECASE)


def strip_units_and_conditions(text: str) -> str:
    """Drop what follows a value without changing it: an ordinal mark (`12^{th}`),
    unit groups ending the answer (`6 \\times 10^{-3} \\text{ m/s^2}`) and a closing
    condition (`\\text{for } w \\ne 2`; not a piecewise answer's branches)."""
    if "\\" not in text and "^" not in text:
        return text
    text = _RE_ORDINAL.sub("", text)
    condition = _RE_CONDITION.search(text)
    if (
        condition is not None
        and condition.start() > 0
        and _RE_PIECEWISE.search(text, condition.end()) is None
    ):
        text = text[: condition.start()]
    for _ in range(MAX_UNIT_GROUPS):
        cut = _unit_tail(text)
        if cut is None:
            break
        text = cut
    return text


def _unit_tail(text: str) -> str | None:
    """`text` without its last unit group, or None when it does not end in one."""
    pos = max(text.rfind("\\text"), text.rfind("\\mathrm"), text.rfind("\\mbox"))
    if pos <= 0:
        return None
    match = _RE_UNIT_TAIL.fullmatch(text, pos)
    unit = match.group("unit") if match is not None else "{"
    if unit.count("{") != unit.count("}"):
        return None
    words = [word.lower() for word in _RE_UNIT_WORD.findall(unit)]
    if words in (["e"], ["i"]) or any(
        word in _NOT_UNIT_WORDS or word in NOT_UNITS for word in words
    ):
        return None  # `3\\mathrm{e}` is a constant; `12 \\text{ maybe}` a hedge
    head = text[:pos].rstrip()
    if not head or head[-1] not in "0123456789})" or not _RE_DIGIT.search(head):
        return None
    return head


def normalize(text: str) -> str:
    """Rewrite an answer into the restricted LaTeX subset the parser reads.

    Handles unicode (superscripts, full-width digits, math symbols), spacing and
    sizing macros, ``\\dfrac``-style variants, text wrappers, degrees, currency,
    repeating decimals and thousands separators (only outside brackets, so
    ``(0,1)`` stays a pair).

    Args:
        text: an extracted answer (already length-bounded by the caller).

    Returns:
        The normalized text; may be empty.
    """
    s = text
    for bad, fixed in _CONTROL.items():
        s = s.replace(bad, fixed)
    s = _RE_DOUBLED.sub(r"\\", s)
    s = strip_units_and_conditions(s)
    s = _RE_PRIME.sub("'", s)
    s = _RE_SUPER.sub(lambda m: "^{" + m.group(0).translate(_SUPERSCRIPTS) + "}", s)
    s = _RE_VULGAR.sub(lambda m: _VULGAR[m.group(0)], s)
    s = _RE_REALS.sub(r"(-\\infty,\\infty)", s)
    s = unicodedata.normalize("NFKC", s)
    s = _RE_ROOT_DIGITS.sub(r"\\sqrt{\1}", s)
    s = _RE_PAREN_SQRT.sub(r"\\sqrt{\1}", s)
    s = _RE_TEXT_TIMES.sub(r" \\times ", s)
    s = _RE_UNICODE.sub(lambda m: _UNICODE[m.group(0)], s)
    s = _RE_GROUP_COMMA.sub("", s)
    s = _RE_SPACED_COMMA.sub("", s)
    s = _RE_THIN_SPACE.sub("", s)
    s = _RE_DEGREE.sub("\x04", s)  # a degree sign, kept through the bare-\circ rule
    s = _RE_BARE_CIRC.sub(r" \\circ " if _RE_TRIG.search(s) else " ", s)
    s = s.replace("\x04", r" \circ ")
    s = s.replace("\\\\", "\x03").replace(r"\%", "%")
    s = s.replace(r"\{", "\x01").replace(r"\}", "\x02")
    s = _RE_LAYOUT.sub(" ", s)
    s = s.replace("\x01", r"\{").replace("\x02", r"\}").replace("\x03", " \\\\ ")
    s = _RE_FRAC.sub(r"\\frac", s)
    s = _RE_BINOM.sub(r"\\binom", s)
    s = _RE_WRAPPER.sub("", s)
    s = _RE_REPEATING.sub(_repeating, s)
    s = _RE_SPACES.sub(" ", s).strip()
    s = _RE_LEADING_REL.sub("", s.rstrip(" .,;"))
    if _RE_SPACE_THOUSANDS.fullmatch(s):
        s = s.replace(" ", "")
    return _merge_thousands(s)


def _repeating(match: re.Match[str]) -> str:
    whole, fixed, period = match.group(1), match.group(2), match.group(3)
    base = Fraction(int(whole or "0")) + (
        Fraction(int(fixed), 10 ** len(fixed)) if fixed else Fraction(0)
    )
    rep = Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
    value = base + rep
    return rf"{{\frac{{{value.numerator}}}{{{value.denominator}}}}}"


def _merge_thousands(s: str) -> str:
    """Drop ``1,234``-style separators that sit outside every bracket."""
    if "," not in s:
        return s
    return _merge_outside(s)


def _merge_outside(s: str) -> str:
    pieces: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            if depth == 0:
                pieces.append(_RE_COMMA_THOUSANDS.sub(_drop_commas, s[start:i]))
                start = i
            depth += 1
        elif ch in ")]}" and depth > 0:
            depth -= 1
            if depth == 0:
                pieces.append(s[start : i + 1])
                start = i + 1
    tail = s[start:]
    pieces.append(tail if depth else _RE_COMMA_THOUSANDS.sub(_drop_commas, tail))
    return "".join(pieces)


def _drop_commas(match: re.Match[str]) -> str:
    return match.group(0).replace(",", "")
