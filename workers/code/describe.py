"""A code verdict's first failing test as one line of text: what Inspect's explanation
and `gradefleet diff` show (pure: the row's tests are parsed, nothing runs).

`describe_failure(row, failure)` names the test by its index and failure kind (and
the exception, when the sandbox reported one), then the test itself: an assert's
source, a stdio case's input and expected output, a call's arguments and expected
value, each cut to `MAX_DESCRIBED_CHARS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.code.cases import TestSuite

__all__ = ["MAX_DESCRIBED_CHARS", "describe_failure"]

MAX_DESCRIBED_CHARS = 240


def _cut(text: str) -> str:
    text = " ".join(text.split()) if "\n" in text.strip() else text
    if len(text) <= MAX_DESCRIBED_CHARS:
        return text
    return text[: MAX_DESCRIBED_CHARS - 1] + "…"


def _case_text(suite: TestSuite, index: int) -> str | None:
    if suite.mode == "assert" and 0 <= index < len(suite.asserts):
        return _cut(suite.asserts[index].source.strip())
    if suite.mode == "stdio" and 0 <= index < len(suite.stdio):
        case = suite.stdio[index]
        stdin, expected = _cut(repr(case.stdin)), _cut(repr(case.expected_stdout))
        return f"stdin {stdin} expected {expected}"
    if suite.mode == "call" and 0 <= index < len(suite.calls):
        call = suite.calls[index]
        args = ", ".join(repr(a) for a in call.args)
        return _cut(f"{suite.fn_name}({args}) expected {call.expected!r}")
    return None


def _head(failure: Mapping[str, Any]) -> str:
    index, kind = failure.get("index"), failure.get("kind") or "failed"
    why = failure.get("exception") or failure.get("detail")
    head = f"test {index}: {kind}" if index is not None else str(kind)
    return f"{head} ({why})" if why else head


def describe_failure(
    row: Mapping[str, Any] | None, failure: Mapping[str, Any] | None
) -> str | None:
    """The first failing test as text ("test 1: wrong_answer: assert f(2) == 4"), or
    None when there is no failure. `row` holds the test fields (`encode_code_gold`'s,
    or a whole input row); without usable tests only the index and kind are named."""
    if not failure:
        return None
    head = _head(failure)
    index = failure.get("index")
    if row is None or not isinstance(index, int):
        return head
    from workers.code.errors import InvalidTestsError
    from workers.code.suite import parse_suite

    try:
        suite = parse_suite(row)
    except (InvalidTestsError, RecursionError, ValueError, TypeError):
        return head
    case = _case_text(suite, index)
    return f"{head}: {case}" if case else head
