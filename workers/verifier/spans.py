"""Linear scans for answer spans: boxes, `<answer>` tags, and span clean-up.

Brace groups are matched with a depth counter over a tokenizing regex that cannot
backtrack; every search runs from a fixed point with `str.find`/`str.rfind`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workers.models import ExtractionMethod

__all__ = [
    "SPECIAL_TOKENS",
    "Box",
    "answer_tag",
    "box_list",
    "clean",
    "is_alnum_at",
    "is_letter_at",
    "last_box",
    "marker_name",
    "read_group",
    "strip_stray_closers",
]

# A box whose braces have not closed within this many characters is refused: such
# content is far beyond anything the comparison accepts, and scanning it costs time.
MAX_BOX_SCAN_CHARS = 200_000
# A gold with several boxes and at most this much text around them lists answers.
MAX_GOLD_BOXES = 100
MAX_GOLD_BOX_GAP_CHARS = 40
MAX_BOX_SEARCH_CHARS = 10_000

_BOX_MARKERS = (("\\boxed", ExtractionMethod.BOXED), ("\\fbox", ExtractionMethod.FBOX))
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)
# A lone backslash (replaced last) is what an over-escaped `\\boxed` leaves in a gap.
_GAP_DELIMITERS = ("$", "\\(", "\\)", "\\[", "\\]", "\\qquad", "\\quad", "\\text", "\\")
_GAP_WORDS = frozenset({"and", "or", "&", "{and}", "{or}", "{", "}"})
_WRAPPERS = (
    ("$$", "$$"),
    ("$", "$"),
    ("\\(", "\\)"),
    ("\\[", "\\]"),
    ("**", "**"),
    ('\\"', '\\"'),
    ('"', '"'),
)
_TRAILING_PUNCT = ".,;:?。"  # not "!": 5! is a factorial
# `\end{answer}` closing nothing (a model imitating a LaTeX answer environment).
_RE_END_ENV = re.compile(r"\\end\s*\{([a-zA-Z*]{0,20})\}\Z")
_RE_BEGIN_ENV = re.compile(r"\\begin\s*\{([a-zA-Z*]{0,20})\}")
# Zero-width characters around an answer are padding (inside it they refuse it).
_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff"
SPECIAL_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")
# Closers that end a response without closing anything it still needs: a `</think>`
# after the answer, an `</answer>` with no `<answer>`, an end token, a stray `<`.
_STRAY_CLOSERS = (*SPECIAL_TOKENS, "</think>", "</answer>", "<")
# Stray closers stripped from the end of a response before giving up.
MAX_STRAY_CLOSERS = 16
MAX_STRAY_TAIL_CHARS = 64


@dataclass(frozen=True, slots=True)
class Box:
    """The last box read: `content` None when empty; `problem` set when unusable."""

    content: str | None
    method: ExtractionMethod
    end: int
    problem: str = ""  # "truncated" or "malformed": not a box at all
    start: int = -1  # offset of the `\\boxed`/`\\fbox` command (-1 when unknown)


def marker_name(method: ExtractionMethod) -> str:
    return "\\fbox" if method is ExtractionMethod.FBOX else "\\boxed"


def last_box(text: str) -> Box | None:
    """Read the last `\\boxed`/`\\fbox` command (None when there is none)."""
    best, best_method = -1, ExtractionMethod.BOXED
    for marker, method in _BOX_MARKERS:
        pos = text.rfind(marker)
        while pos >= 0 and is_letter_at(text, pos + len(marker)):
            pos = text.rfind(marker, 0, pos)
        if pos > best:
            best, best_method = pos, method
    if best < 0:
        return None
    start = best + len(marker_name(best_method))
    while start < len(text) and text[start] in " \t":
        start += 1
    if start < len(text) and text[start] == "{":
        group = read_group(text, start + 1, best_method)
        return Box(group.content, best_method, group.end, group.problem, best)
    token_end = start
    while token_end < len(text) and not text[token_end].isspace():
        token_end += 1
    token = clean(text[start:token_end].split("$", 1)[0])
    if token is None:  # `\boxed` at the very end: cut off before its answer
        return Box(None, best_method, token_end, "truncated", best)
    if not (token[0].isalnum() or token[0] in "-.\\"):  # `\boxed}5{`
        return Box(None, best_method, token_end, "malformed", best)
    return Box(token, best_method, token_end, "", best)


def is_letter_at(text: str, index: int) -> bool:
    return 0 <= index < len(text) and text[index].isalpha()


def is_alnum_at(text: str, index: int) -> bool:
    return 0 <= index < len(text) and text[index].isalnum()


def read_group(text: str, start: int, method: ExtractionMethod) -> Box:
    """Match the brace group whose content starts at `start`; skip escaped braces."""
    limit = min(len(text), start + MAX_BOX_SCAN_CHARS)
    if text.find("}", start, limit) >= 0:
        closed = _scan_group(text, start, limit, method)
        if closed is not None:
            return closed
    if limit < len(text):
        # Not truncated, just enormous: hand it on so the comparison refuses it.
        return Box(content=text[start:limit], method=method, end=limit)
    return Box(content=None, method=method, end=len(text), problem="truncated")


def _scan_group(
    text: str, start: int, limit: int, method: ExtractionMethod
) -> Box | None:
    """The group closed before `limit`, or None (`read_group` decides what that is)."""
    depth = 1
    for token in _BRACE_TOKEN.finditer(text, start, limit):
        char = token.group()
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                content = clean(text[start : token.start()])
                return Box(content=content, method=method, end=token.end())
    return None


def box_list(text: str) -> str | None:
    """Join a gold made only of boxes (`\\boxed{1} and \\boxed{2}` gives `1, 2`).

    None unless there are several boxes and little else (connectors, and at most
    one label word such as a unit after each box): a worked solution keeps its
    last box. Unlike a response, a gold's several boxes are several answers, not a
    draft and its correction.
    """
    contents: list[str] = []
    outside_chars, pos = 0, 0
    while len(contents) <= MAX_GOLD_BOXES:
        start, method = _next_box(text, pos)
        gap = text[pos : len(text) if start < 0 else start]
        outside_chars += len("".join(gap.split()))
        if outside_chars > MAX_GOLD_BOX_GAP_CHARS or not _is_list_gap(gap):
            return None
        if start < 0:
            return ", ".join(contents) if len(contents) > 1 else None
        brace = start + len(marker_name(method))
        while brace < len(text) and text[brace] in " \t":
            brace += 1
        if not text.startswith("{", brace):
            return None
        box = read_group(text, brace + 1, method)
        if box.problem or box.content is None:
            return None
        contents.append(box.content)
        pos = box.end
    return None


def _is_list_gap(gap: str) -> bool:
    """Text between listed boxes: connectors plus at most one label word."""
    for token in _GAP_DELIMITERS:
        gap = gap.replace(token, " ")
    words = [word.strip(",.;:") for word in gap.split()]
    return sum(1 for word in words if word and word not in _GAP_WORDS) <= 1


def _next_box(text: str, pos: int) -> tuple[int, ExtractionMethod]:
    """First `\\boxed`/`\\fbox` command at or after `pos` (-1 when none)."""
    best, best_method = -1, ExtractionMethod.BOXED
    limit = pos + MAX_BOX_SEARCH_CHARS  # the gap between list items is short
    for marker, method in _BOX_MARKERS:
        found = text.find(marker, pos, limit)
        while found >= 0 and is_letter_at(text, found + len(marker)):
            found = text.find(marker, found + 1, limit)
        if found >= 0 and (best < 0 or found < best):
            best, best_method = found, method
    return best, best_method


def answer_tag(text: str) -> tuple[str, int] | None:
    """Content and end offset of the last complete `<answer>...</answer>`.

    The content ends at the first `</answer>` after the last `<answer>` that has
    one: what follows a closed answer (`... </answer> 7 * 2 = 14 </answer>`) is not
    part of it.
    """
    close = text.rfind("</answer>")
    if close < 0:
        return None
    open_ = text.rfind("<answer>", 0, close)
    if open_ < 0:
        return None
    first_close = text.find("</answer>", open_)
    return text[open_ + len("<answer>") : first_close], first_close + len("</answer>")


def strip_stray_closers(text: str) -> str:
    """Drop closing tags and end tokens trailing a response (`Answer: 270\\n</think>
    </answer>`): they hide the answer line from the searches that read the end.

    An `</answer>` that closes an `<answer>` stays (it is the tag's own end).
    """
    if not text[-MAX_STRAY_TAIL_CHARS:].rstrip().endswith((">", "<")):
        return text  # the common case, without copying a long response
    body = text.rstrip()
    for _ in range(MAX_STRAY_CLOSERS):
        token = next((t for t in _STRAY_CLOSERS if body.endswith(t)), None)
        if token is None:
            break
        opener = {"</answer>": "<answer>", "</think>": "<think>"}.get(token)
        if opener is not None and body.rfind(opener) >= 0:
            break  # it closes something: the tag and `<think>` rules read it
        body = body[: len(body) - len(token)].rstrip()
    return body if body else text


def clean(answer: str) -> str | None:
    """Strip whitespace, math delimiters and trailing punctuation; None if empty."""
    text = answer.strip()
    for _ in range(8):
        before = text
        for token in SPECIAL_TOKENS:
            text = text.removesuffix(token)
        text = _strip_trailing_punct(text.strip().strip(_INVISIBLE).strip())
        for opener, closer in _WRAPPERS:
            if _wrapped(text, opener, closer):
                text = text[len(opener) : len(text) - len(closer)].strip()
        text = _strip_unpaired_delimiters(_strip_fragments(text))
        if text == before:
            break
    return text or None


def _strip_trailing_punct(text: str) -> str:
    """Drop sentence punctuation at the end, but keep `\\right.` (empty delimiter)."""
    if text.endswith("\\right."):
        return text
    return text.rstrip(_TRAILING_PUNCT + " \t\r\n")


def _wrapped(text: str, opener: str, closer: str) -> bool:
    """True if `text` is one span `opener ... closer` (no inner `opener`)."""
    if len(text) < len(opener) + len(closer):
        return False
    if not (text.startswith(opener) and text.endswith(closer)):
        return False
    return opener not in text[len(opener) : len(text) - len(closer)]


def _strip_fragments(text: str) -> str:
    """Drop a stray trailing `\\` or `\\\\` and a `\\begin{..}`/`\\end{..}` that pairs
    with nothing (`25 \\`, `120 \\end{answer} \\`); a matrix keeps its environment."""
    if text.endswith("\\"):
        text = text[:-1].rstrip()
        if text.endswith("\\"):  # `\\\\` at the very end: a line break, not a command
            text = text[:-1].rstrip()
    if text.endswith("}") and text.count("}") > text.count("{"):
        text = text[:-1].rstrip()  # `6.}`: a brace closing nothing
    match = _RE_END_ENV.search(text)
    if match is not None and f"\\begin{{{match.group(1)}}}" not in text:
        text = text[: match.start()].rstrip()
    match = _RE_BEGIN_ENV.match(text)
    if match is not None and f"\\end{{{match.group(1)}}}" not in text:
        text = text[match.end() :].lstrip()
    return text


def _strip_unpaired_delimiters(text: str) -> str:
    """Drop a lone leading or trailing `$`, `\\(`... left over after cutting a span."""
    for token in ("$", "\\(", "\\["):
        if text.startswith(token) and text.count(token) == 1:
            text = text[len(token) :].strip()
    for token in ("$", "\\)", "\\]"):
        if text.endswith(token) and text.count(token) == 1:
            text = text[: len(text) - len(token)].strip()
    return text
