"""Answers written in prose: answer lines, "the answer is" phrases, and unmarked
fallbacks (a closing math span, a bare answer, the last number).

All scans are linear: lines are read from the end, phrases found with `str.rfind`,
and the few regexes are anchored or have no nested quantifiers.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from workers.verifier.sentences import (
    MAX_SENTENCE_SPAN_CHARS,
    first_sentence,
    is_label_number,
    is_prose,
    read_sentence,
)
from workers.verifier.spans import clean, is_alnum_at, is_letter_at

__all__ = [
    "MAX_BARE_ANSWER_CHARS",
    "UNMARKED_FINDERS",
    "answer_line",
    "bare_answer",
    "closing_math",
    "cut_mid_sentence",
    "last_number",
    "named_value",
    "phrase_answer",
]

# Longest "the answer is ..." tail kept (a sentence, not a paragraph).
MAX_PHRASE_CHARS = 200
# Phrases that judge the answer (`our answer is correct`) skipped before giving up.
MAX_PHRASE_TRIES = 5
# At most this much text, with no digits, may follow a closing math span.
MAX_CLOSING_TAIL_CHARS = 60
# A response ending in this much text without a digit commits to no number.
MAX_UNCOMMITTED_CHARS = 300
# Tries to find a last number not glued to a word (`H2O`) before giving up.
MAX_NUMBER_TRIES = 20
# Escaped dollars (`\$5`) skipped while looking for a math span's `$`.
MAX_ESCAPED_DOLLARS = 100
# Lines mentioning "answer" examined from the end before giving up.
MAX_ANSWER_LINES = 1_000
# Display math under a `Final Answer` heading longer than this is not read.
MAX_DISPLAY_CHARS = 2_000
# A response this short with no words in it is taken whole as its answer.
MAX_BARE_ANSWER_CHARS = 100

_ANSWER_LINE = re.compile(
    r"[\s>*#_]*(?:final\s+answer|answer)[\s*_]*[:：](?P<rest>.*)",
    re.IGNORECASE | re.DOTALL,
)
_ANSWER_HEADING = re.compile(r"[\s>*#_]*final\s+answer[\s*_:：]*", re.IGNORECASE)
# `A: 18`, or `#### 18` (GSM8K's own answer line; a `#### Step 2` heading is not one).
_GSM8K_LINE = re.compile(
    r"[ \t]*(?:A[ \t]*:|####(?!#)(?=[ \t]*[-+$\\.\d(|]))[ \t]*(?P<rest>.+)", re.DOTALL
)
_INLINE_MARKERS = ("final answer:", "the answer:")
_NEXT_LINE = re.compile(r"\s*(\S[^\n]*)")
# Letter runs allowed in a bare answer; any other run of two or more letters that is
# not a LaTeX command (`\\frac`) marks the text as prose.
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
# Two or more non-ASCII, non-Greek letters in a row (`答案是`, `Ответ`) are words.
_FOREIGN_WORD = re.compile(r"[^\W\d_A-Za-z\u0370-\u03ff]{2,}")
# Prose that denies or hedges its only number never reduces to that number.
_DENIED = re.compile(
    r"(?:\bnot|n't|\bnever|\bno)(?:\s+(?:be|equal|equals|to|exactly))*"
    r"\s*(?:\$\$|\$|\\\(|\\\[|-)?\s*\Z",
    re.IGNORECASE,
)
_NAMED_VALUE = re.compile(
    r"(?P<name>[A-Za-z][A-Za-z _']*[A-Za-z]{3}[A-Za-z _']*)=(?P<value>[^=]+)"
)
_NAMED_DENIAL = re.compile(
    r"\b(?:not|no|never|wrong|incorrect|false|isn't|isnt)\b", re.IGNORECASE
)
# A text ending in one of these stops mid-sentence (see `cut_mid_sentence`).
_DANGLING_CHARS = frozenset(",(")
# (Not `for`, `with`, `to`, `that`...: "which is what we were looking for" is a
# whole sentence.)
_FUNCTION_WORDS = frozenset(
    {"the", "a", "an", "of", "and", "or", "is", "are", "was", "were", "which", "we",
     "then", "than", "if", "but", "because", "since", "per", "each", "its", "their",
     "our"}
)  # fmt: skip
_LAST_WORD = re.compile(r"(?<![A-Za-z\\])[A-Za-z]+\Z")
_BARE_WORDS = frozenset({"sqrt", "sin", "cos", "tan", "log", "ln", "exp", "pi"})
_PHRASES = ("final answer is", "answer is", "result is")
_JUDGEMENT = re.compile(
    r"(?:correct|right|wrong|incorrect|reasonable|valid|plausible|consistent|verified)"
    r"\b",
    re.IGNORECASE,
)
_MATH_SPANS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_OUTPUT_FENCE = "```output"
_NUMBER_CHARS = "0123456789.,/"
_DIGITS = "0123456789"
_LIST_STARTS = frozenset("0123456789$\\-(")


def answer_line(text: str, *, allow_gsm8k: bool) -> tuple[str, int] | None:
    """The answer on the last `Answer: x` line (or a final GSM8K `A: x` line).

    Returns the answer and the offset where its marker's line starts. Candidate
    lines are found with `str.rfind` from the end, at most `MAX_ANSWER_LINES`.
    """
    if allow_gsm8k:
        found = _gsm8k_last_line(text)
        if found is not None:
            return found
    end = len(text)
    for _ in range(MAX_ANSWER_LINES):
        pos = max(text.rfind("nswer", 0, end), text.rfind("NSWER", 0, end))
        if pos < 0:
            return None
        line_start = text.rfind("\n", 0, pos) + 1
        line_end = text.find("\n", pos)
        line = text[line_start : len(text) if line_end < 0 else line_end]
        answer = _read_answer_line(text, line, line_start + len(line))
        if answer is not None:
            return answer, line_start
        inline, offset = _inline_final_answer(line, line_start)
        if inline is not None:
            return inline, offset
        end = line_start
    return None


def _gsm8k_last_line(text: str) -> tuple[str, int] | None:
    """`A: 18` or `#### 18` on the last non-empty line (GSM8K's solutions); `####`
    counts wherever it stands on that line (`... for the 12 of them. #### 8`)."""
    body = text.rstrip()
    start = body.rfind("\n") + 1
    match = _GSM8K_LINE.match(body, start)
    if match is None:
        hashes = body.rfind("####", start)
        if hashes <= start or body.startswith("#", hashes - 1):
            return None
        match = _GSM8K_LINE.match(body, hashes)
        if match is None:
            return None
        start = hashes
    answer = clean(match.group("rest"))
    return None if answer is None else (answer, start)


def _inline_final_answer(line: str, line_start: int) -> tuple[str | None, int]:
    """`... so it is 10,455. Final Answer: The final answer is $10,455$.` in a line.

    Only the distinctive `Final Answer:` and `the answer:` count mid-line (a marker
    is one wherever it stands); returns its offset.
    """
    lowered = line.lower()
    pos, marker = max((lowered.rfind(marker), marker) for marker in _INLINE_MARKERS)
    if pos < 0:
        return None, line_start
    rest = line[pos + len(marker) :].strip(" *_")
    if marker == "the answer:" and not _states_answer(rest):
        return None, line_start  # `let me check the answer: is 5 right? ...`
    return _line_content(rest), line_start + pos


def _states_answer(rest: str) -> bool:
    """Whether text after a mid-line `the answer:` states one (a value or a sentence
    starting with a capital), rather than going on with a question or a clause."""
    if not rest or rest[0].islower():
        return False
    return not first_sentence(rest).rstrip().endswith("?")


def _read_answer_line(text: str, line: str, line_end: int) -> str | None:
    """`Answer: x`, or a heading (`Answer:`, `## Final Answer`) over the answer."""
    rest: str | None = None
    match = _ANSWER_LINE.match(line)
    if match is not None:
        rest = match.group("rest")
    elif _ANSWER_HEADING.fullmatch(line) is None:
        return None
    if not rest or not rest.strip(" *_"):
        following = _NEXT_LINE.match(text, line_end)
        if following is None:
            return None
        rest = following.group(1)
        line_end = following.end()
    rest = rest.strip(" *_")
    if rest.endswith(":"):
        # `The general solution is:` introduces the display math below it
        return _display_after(text, line_end)
    return _line_content(rest)


def _display_after(text: str, start: int) -> str | None:
    """The first display math (`$$...$$`, `\\[...\\]`) right below `start`."""
    following = _NEXT_LINE.match(text, start)
    if following is None:
        return None
    begin = following.start(1)
    for opener, closer in (("$$", "$$"), ("\\[", "\\]")):
        if text.startswith(opener, begin):
            end = text.find(closer, begin + len(opener), begin + MAX_DISPLAY_CHARS)
            return clean(text[begin + len(opener) : end]) if end >= 0 else None
    return None


def _line_content(rest: str) -> str | None:
    """The answer in an answer line's text: a phrase's answer, else the line's first
    sentence when it is prose (read by the sentence policy when parsed), else all of
    it (`Answer: 5, 6` is a list)."""
    phrase = phrase_answer(rest)
    if phrase is not None:
        return phrase
    answer = clean(rest)
    if answer is None or not is_prose(answer):
        return answer
    return clean(first_sentence(answer)) or answer


def cut_mid_sentence(text: str) -> bool:
    """Whether the text stops mid-sentence on a function word or a comma (`...
    multiply this by the number of`): cut at the token limit, it committed to no
    value, and a number met on the way is no answer. A dangling `=` is left to the
    sentence rules (a loop of `total = 27` lines cut at `=` still says 27)."""
    tail = text[-40:].rstrip()
    if not tail:
        return False
    if tail[-1] in _DANGLING_CHARS:
        return True
    word = _LAST_WORD.search(tail)
    return word is not None and word.group().lower() in _FUNCTION_WORDS


def named_value(text: str) -> str:
    """`any text=12` gives `12`: a bare answer naming its value in words before a
    final `=` (a word of three letters or more, no negation). Anything else,
    including a label equation (`x = 5`, decided by the comparison), is kept."""
    if "=" not in text or len(text) > MAX_BARE_ANSWER_CHARS:
        return text
    match = _NAMED_VALUE.fullmatch(text)
    if match is None or _NAMED_DENIAL.search(match.group("name")):
        return text
    return clean(match.group("value")) or text


def phrase_answer(text: str) -> str | None:
    """The answer after the last "the final answer is" / "answer is" / "result is".

    A verdict on the answer (`we can see that our answer is correct`) is no answer:
    the phrase before it is looked for instead.
    """
    lowered = text.lower()
    end = len(text)
    for _ in range(MAX_PHRASE_TRIES):
        best, best_len = -1, 0
        for phrase in _PHRASES:
            pos = lowered.rfind(phrase, 0, end)
            if pos > best:
                best, best_len = pos, len(phrase)
        if best < 0:
            return None
        start = best + best_len
        tail = text[start : start + MAX_PHRASE_CHARS].lstrip(" :\t")
        if _JUDGEMENT.match(tail) is None:
            return clean(_first_sentence(tail))
        end = best
    return None


def _first_sentence(tail: str) -> str:
    """Cut the tail at a math span's end, a newline, or a sentence-ending period.

    A comma, "or" or "and" followed by more math (`is $5$ or $6$`, `is 5, 6`) does
    not end the answer: the whole list is the answer (a hedge is never one value).
    """
    for opener, closer in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if tail.startswith(opener):
            end = tail.find(closer, len(opener)) + len(closer)
            if end >= len(closer) and not _more_math(tail, end):
                return tail[:end]
    depth = 0
    for index, char in enumerate(tail):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "\n" or (
            depth <= 0 and char in ".,;" and tail[index + 1 : index + 2] in (" ", "")
        ):
            if char == "," and _more_math(tail, index + 1):
                continue
            return tail[:index]
    return tail


def _more_math(tail: str, index: int) -> bool:
    """Whether `tail[index:]` continues a list: `, 6`, ` or $6$`, `, and 7`."""
    rest = tail[index : index + 40].lstrip(" ,")
    for word in ("or ", "and "):
        if rest.startswith(word):
            rest = rest[len(word) :].lstrip()
    return rest[:1] in _LIST_STARTS and rest[:1] != ""


def closing_math(text: str) -> str | None:
    """The last math span, when at most a few words without numbers follow it.

    `... so $x = 5$.` and `Therefore $x \\geq 5$ is the solution.` both qualify.
    """
    best = (-1, -1, -1)  # content start, content end, span end
    for opener, closer in _MATH_SPANS:
        close = _rfind_unescaped(text, closer, len(text))
        open_ = _rfind_unescaped(text, opener, close) if close > 0 else -1
        if open_ >= 0 and close + len(closer) > best[2]:
            best = (open_ + len(opener), close, close + len(closer))
    if best[2] < 0 or len(text) - best[2] > 4 * MAX_CLOSING_TAIL_CHARS:
        return None
    tail = text[best[2] :].strip()
    if len(tail) > MAX_CLOSING_TAIL_CHARS or any(char.isdigit() for char in tail):
        return None
    if _DENIED.search(text, max(0, best[0] - 40), best[0]):
        return None  # `It is not $12$.`
    return clean(text[best[0] : best[1]])


def _rfind_unescaped(text: str, token: str, end: int) -> int:
    """Last `token` starting before `end`, skipping `\\$` (an escaped dollar)."""
    pos = text.rfind(token, 0, end)
    for _ in range(MAX_ESCAPED_DOLLARS):
        if token != "$" or pos <= 0 or text[pos - 1] != "\\":
            return pos
        pos = text.rfind(token, 0, pos)
    return -1


def bare_answer(text: str) -> str | None:
    """The whole text when it is one short line with no words (`x+1`, `(1, 3)`)."""
    body = text.strip()
    if len(body) > MAX_BARE_ANSWER_CHARS or "\n" in body:
        return None
    if "boxed" in body or "fbox" in body or _FOREIGN_WORD.search(body):
        return None
    words = (match.group() for match in _PROSE_WORD.finditer(body))
    if any(word not in _BARE_WORDS for word in words):
        return None
    return clean(body)


def last_number(text: str) -> str | None:
    """The last number not glued to a word (digits, point, thousands commas, a/b),
    not a label (`week #3`, `Step 2`, `3rd`) and not ruled out by a negation just
    before it (`we got 42, not 41` gives 42)."""
    end = len(text)
    for _ in range(MAX_NUMBER_TRIES):
        last = max(text.rfind(digit, 0, end) for digit in _DIGITS)
        if last < 0:
            return None
        head = text[: last + 1]
        start = len(head.rstrip(_NUMBER_CHARS))
        denied = _DENIED.search(text, max(0, start - 40), start) is not None
        label = is_label_number(text, start, last + 1)
        if not denied and not label and not _glued_to_word(text, start - 1):
            return _number_token(text, start, head[start:])
        # `H2O` (part of a word) or `42, not 41` (ruled out): look further back
        end = start
    return None


def _glued_to_word(text: str, index: int) -> bool:
    """An ASCII letter before a number (`H2O`); CJK text runs into numbers freely."""
    return is_letter_at(text, index) and text[index].isascii()


def _number_token(text: str, start: int, token: str) -> str | None:
    token = token.lstrip(",/")
    if token.startswith(".") and not token[1:2].isdigit():
        token = token.lstrip(".")
    if token.count("/") > 1:
        token = token.rsplit("/", 1)[1]
    sign = ""
    if start > 0 and text[start - 1] in "-−" and not is_alnum_at(text, start - 2):
        sign = "-"
    return clean(sign + token)


def final_sentence(text: str) -> str | None:
    """The value the last sentence holding one asserts (the sentence policy), read
    from the end of the text; None when that sentence asserts none."""
    tail = text[-MAX_SENTENCE_SPAN_CHARS:]
    if len(text) > len(tail):
        tail = tail[tail.find("\n") + 1 :]  # start at a line, not mid-sentence
    answer = read_sentence(tail).answer
    return None if answer is None else clean(answer)


def output_block(text: str) -> str | None:
    """The value printed by the last ```` ```output ```` block, when it is one line."""
    start = text.rfind(_OUTPUT_FENCE)
    if start < 0:
        return None
    start += len(_OUTPUT_FENCE)
    end = text.find("```", start)
    body = text[start : len(text) if end < 0 else end].strip()
    if not body or "\n" in body or len(body) > MAX_BARE_ANSWER_CHARS:
        return None
    return clean(body)


def _committed(finder: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """`finder`, applied only when a digit sits near the end of the text: a response
    that trails off into `MAX_UNCOMMITTED_CHARS` of number-free prose committed to no
    value, and a number found far back in it is an accident, not an answer."""

    def committed(text: str) -> str | None:
        tail = text[-MAX_UNCOMMITTED_CHARS:]
        if len(text) > len(tail) and not any(d in tail for d in _DIGITS):
            return None
        return finder(text)

    committed.__name__ = finder.__name__
    return committed


UNMARKED_FINDERS: tuple[tuple[Callable[[str], str | None], str], ...] = (
    (closing_math, "closing math span"),
    (bare_answer, "bare answer"),
    (_committed(final_sentence), "final sentence"),
    (_committed(output_block), "last output block"),
    (_committed(last_number), "last number"),
)
