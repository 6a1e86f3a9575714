"""Whether a program's output is the expected one: stdout text, and call results.

Runs on the trusted side only, on text the sandbox captured and on values the plain
codec decoded (exact builtin types; nothing the model made can reach an `__eq__` here).

stdout (`stdout_matches`), the policy:
- Lines are compared one by one; trailing whitespace on each line (a `\\r` too) and
  trailing blank lines are ignored. The line counts must then match: a right first line
  followed by wrong or missing lines fails (open-r1's `zip` passed those).
- Lines that differ as text are split on whitespace into tokens; the token counts must
  match and each pair must be equal as text or equal as decimal numbers: `2.50` =
  `2.5`, `-0` = `0`, `2.0` = `2`, and `1e2` = `100` (LiveCodeBench's grader compares
  tokens as `Decimal`s too; Python prints floats from 1e16 up and below 1e-4 in
  exponent form, so a right float answer must not fail on its notation). A number
  token is `-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?`: leading zeros (`007`),
  `+5`, `.5`, `5.`, `inf`, `nan` and hex are compared as text, so a binary string
  `0011` never equals `11`.
- A float tolerance only when the row asks for one (`suite.TestSuite.float_tol`, read
  from `float_tol`, `atol`, `abs_tol` or `tolerance`): then two number tokens are equal
  when |actual - expected| <= tol * max(1, |expected|), the checker convention "absolute
  or relative error at most tol".

Call results (`values_equal`, `call_matches`), the policy: exact types, with the
conversions JSON forces and nothing more:
- `bool` is not a number: `True` never equals `1`;
- int and float compare as numbers (`2.0` = `2`; JSON writers differ); floats exactly,
  or within the tolerance as above when the row gives one; nan equals nan;
- a tuple equals a list with equal items (JSON has no tuples), either way round;
- `str`, `bytes`, `None`, `complex`: same type and equal; dict: same keys (compared with
  their exact types) and equal values; set and frozenset: the same elements;
- APPS/TACO's wrapped outputs: `call_matches` also accepts `CallCase.also_expected`.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, DecimalException
from typing import Any

from workers.code.suite import CallCase

__all__ = ["call_matches", "stdout_matches", "values_equal"]

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# A longer token is compared as text (no Decimal of a megabyte of digits).
_MAX_NUMBER_CHARS = 400


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def stdout_matches(actual: str, expected: str, float_tol: float | None) -> bool:
    """Whether `actual` stdout passes for `expected` (see the module docstring)."""
    if actual == expected:
        return True
    got, want = _lines(actual), _lines(expected)
    if len(got) != len(want):
        return False
    tol = None if float_tol is None else Decimal(repr(float_tol))
    return all(
        a == e or _line_tokens_match(a, e, tol) for a, e in zip(got, want, strict=True)
    )


def _line_tokens_match(actual: str, expected: str, tol: Decimal | None) -> bool:
    got, want = actual.split(), expected.split()
    if len(got) != len(want):
        return False
    return all(
        a == e or _numbers_equal(a, e, tol) for a, e in zip(got, want, strict=True)
    )


def _decimal(token: str) -> Decimal | None:
    if len(token) > _MAX_NUMBER_CHARS or _NUMBER.fullmatch(token) is None:
        return None
    return Decimal(token)


def _numbers_equal(actual: str, expected: str, tol: Decimal | None) -> bool:
    got, want = _decimal(actual), _decimal(expected)
    if got is None or want is None:
        return False
    try:
        if tol is None:
            return got == want
        return abs(got - want) <= tol * max(Decimal(1), abs(want))
    except DecimalException:  # an exponent past the context's range
        return False


def values_equal(actual: Any, expected: Any, float_tol: float | None) -> bool:
    """Whether a call's plain-data result equals `expected` (see the module doc)."""
    want = type(expected)
    if want is bool or type(actual) is bool:
        return type(actual) is want and actual == expected
    if want is int or want is float:
        return _reals_equal(actual, expected, float_tol)
    if want is list or want is tuple:
        return (
            type(actual) in (list, tuple)
            and len(actual) == len(expected)
            and all(
                values_equal(a, e, float_tol)
                for a, e in zip(actual, expected, strict=True)
            )
        )
    if want is dict:
        return type(actual) is dict and _dicts_equal(actual, expected, float_tol)
    if want is set or want is frozenset:
        return type(actual) in (set, frozenset) and _typed_set(actual) == _typed_set(
            expected
        )
    if want in (str, bytes, complex, type(None)):
        return type(actual) is want and actual == expected
    return False


def call_matches(actual: Any, case: CallCase, float_tol: float | None) -> bool:
    """Whether a call's result passes `case`: `expected`, or one of `also_expected`."""
    return values_equal(actual, case.expected, float_tol) or any(
        values_equal(actual, other, float_tol) for other in case.also_expected
    )


def _reals_equal(actual: Any, expected: int | float, float_tol: float | None) -> bool:
    if type(actual) not in (int, float):
        return False
    if type(actual) is int and type(expected) is int:
        return bool(actual == expected)
    try:
        got, want = float(actual), float(expected)
    except OverflowError:  # an int too large for a float: not near any float
        return False
    if math.isnan(got) or math.isnan(want):
        return math.isnan(got) and math.isnan(want)
    if float_tol is None or math.isinf(want):
        return got == want
    return abs(got - want) <= float_tol * max(1.0, abs(want))


def _typed_key(value: Any) -> Any:
    """A hashable stand-in that keeps the exact type (so True and 1 stay apart)."""
    kind = type(value)
    if kind is tuple:
        return ("tuple", tuple(_typed_key(v) for v in value))
    if kind is frozenset:
        return ("frozenset", frozenset(_typed_key(v) for v in value))
    if kind is int or kind is float:
        return ("number", value)  # 2 and 2.0: equal numbers, as in `values_equal`
    return (kind.__name__, value)


def _typed_set(values: Any) -> frozenset[Any]:
    return frozenset(_typed_key(v) for v in values)


def _dicts_equal(
    actual: dict[Any, Any], expected: dict[Any, Any], float_tol: float | None
) -> bool:
    if len(actual) != len(expected):
        return False
    got = {_typed_key(k): v for k, v in actual.items()}
    for key, value in expected.items():
        typed = _typed_key(key)
        if typed not in got or not values_equal(got[typed], value, float_tol):
            return False
    return len(got) == len(expected)
