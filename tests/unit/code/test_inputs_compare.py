"""Output comparison: near misses must fail, harmless formatting must pass.

The policy is written in workers/code/compare.py's docstring; each table row here is
one clause of it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.code.compare import call_matches, stdout_matches, values_equal
from workers.code.suite import CallCase

# ------------------------------------------------------------------------ stdout

STDOUT_PASS: list[tuple[str, str, str]] = [
    ("identical", "1\n2\n", "1\n2\n"),
    ("no final newline", "1\n2", "1\n2\n"),
    ("trailing spaces", "1 \n2\t\n", "1\n2\n"),
    ("trailing blank lines", "1\n2\n\n\n", "1\n2\n"),
    ("expected has trailing blank lines", "1\n2\n", "1\n2\n\n\n"),
    ("windows line ends", "1\r\n2\r\n", "1\n2\n"),
    ("empty output", "", ""),
    ("blank output for blank expected", "\n\n", ""),
    ("trailing zeros", "2.50\n", "2.5\n"),
    ("integer as decimal", "2.0", "2"),
    ("negative zero", "-0", "0"),
    ("negative zero decimal", "-0.000", "0"),
    ("exponent", "1e2", "100"),
    ("python float exponent", "1e-05", "0.00001"),
    ("big exponent", "1e+16", "10000000000000000"),
    ("tokens with other spacing", "1  2   3", "1 2 3"),
    ("leading spaces", "  1 2", "1 2"),
    ("numbers among words", "Case #1: 0.50", "Case #1: 0.5"),
    (
        "NeMo Gym expected output with trailing spaces",
        "1\n3\n-1\n0\n\n2\n1 2\n",
        "1\n3 \n-1\n0\n\n2\n1 2 \n",
    ),
]

STDOUT_FAIL: list[tuple[str, str, str]] = [
    ("right first line, wrong second (open-r1 zip)", "1\n3\n", "1\n2\n"),
    ("right first line, missing rest", "1\n", "1\n2\n3\n"),
    ("extra line", "1\n2\n3\n", "1\n2\n"),
    ("empty output", "", "1\n"),
    ("output for empty expected", "1\n", ""),
    ("leading blank line", "\n1\n2\n", "1\n2\n"),
    ("blank line in the middle", "1\n\n2\n", "1\n2\n"),
    ("lines merged", "1 2\n", "1\n2\n"),
    ("lines split", "1\n2\n", "1 2\n"),
    ("off by one", "11\n", "10\n"),
    ("close decimal without tolerance", "2.5000001", "2.5"),
    ("leading zeros are text", "0011", "11"),
    ("leading zeros other way", "11", "0011"),
    ("plus sign is text", "+5", "5"),
    ("bare fraction is text", ".5", "0.5"),
    ("trailing dot is text", "5.", "5"),
    ("inf is text", "inf", "Infinity"),
    ("nan never equals", "nan", "NaN"),
    ("hex is text", "0x10", "16"),
    ("case matters", "yes", "YES"),
    ("extra token", "1 2 3", "1 2"),
    ("missing token", "1 2", "1 2 3"),
    ("fake passed line", "All tests passed\n", "3\n"),
    ("number vs word", "3", "three"),
    ("glued tokens", "12", "1 2"),
    ("comma decimal", "2,5", "2.5"),
    ("huge exponent", "1e999999999999", "1"),
]


@pytest.mark.parametrize(
    ("actual", "expected"),
    [(a, e) for _, a, e in STDOUT_PASS],
    ids=[name for name, _, _ in STDOUT_PASS],
)
def test_stdout_passes(actual: str, expected: str) -> None:
    assert stdout_matches(actual, expected, None)


@pytest.mark.parametrize(
    ("actual", "expected"),
    [(a, e) for _, a, e in STDOUT_FAIL],
    ids=[name for name, _, _ in STDOUT_FAIL],
)
def test_stdout_near_misses_fail(actual: str, expected: str) -> None:
    assert not stdout_matches(actual, expected, None)


@pytest.mark.parametrize(
    ("actual", "expected", "tol", "passes"),
    [
        ("2.5000001", "2.5", 1e-6, True),
        ("2.51", "2.5", 1e-6, False),
        ("1000000.5", "1000000", 1e-6, True),  # relative error 5e-7
        ("1000002", "1000000", 1e-6, False),  # relative error 2e-6
        ("0.0000005", "0", 1e-6, True),  # absolute error below the tolerance
        ("0.000002", "0", 1e-6, False),
        ("1e-7", "0", 1e-6, True),
        ("3.14159 2.71828", "3.141592 2.718281", 1e-5, True),
        ("3.14159 2.8", "3.141592 2.718281", 1e-5, False),
        ("abc", "abd", 0.5, False),  # text stays exact
        ("1\n2.0000001\n", "1\n2\n", 1e-6, True),
        ("1\n", "1\n2\n", 1e-6, False),  # line counts still matter
    ],
)
def test_stdout_float_tolerance_only_when_given(
    actual: str, expected: str, tol: float, passes: bool
) -> None:
    assert stdout_matches(actual, expected, tol) is passes
    if passes and actual.split() != expected.split():
        assert not stdout_matches(actual, expected, None)


def test_long_outputs_compare_fast_and_right() -> None:
    expected = "\n".join(str(i) for i in range(200_000)) + "\n"
    assert stdout_matches(expected.replace("\n", " \n"), expected, None)
    wrong = expected[:-8] + "9\n"
    assert not stdout_matches(wrong, expected, None)


def test_long_number_tokens_compare_as_text() -> None:
    digits = "1" * 5000
    assert stdout_matches(digits, digits, None)
    assert not stdout_matches(digits + ".0", digits, None)


# ------------------------------------------------------------------------- calls

VALUES_EQUAL: list[tuple[str, Any, Any]] = [
    ("int", 3, 3),
    ("float", 0.5, 0.5),
    ("int for float", 2, 2.0),
    ("float for int", 2.0, 2),
    ("nan", math.nan, math.nan),
    ("inf", math.inf, math.inf),
    ("str", "a", "a"),
    ("none", None, None),
    ("bool", True, True),
    ("tuple for list", (1, 2), [1, 2]),
    ("list for tuple", [1, 2], (1, 2)),
    ("nested tuple for list", [(1, [2, (3,)])], [[1, [2, [3]]]]),
    ("dict", {"a": [1, 2]}, {"a": (1, 2)}),
    ("dict order", {"b": 1, "a": 2}, {"a": 2, "b": 1}),
    ("set", {1, 2}, {2, 1}),
    ("frozenset for set", frozenset({1}), {1}),
    ("bytes", b"x", b"x"),
    ("complex", 1j, 1j),
    ("empty list", [], []),
    ("big int", 10**100, 10**100),
]

VALUES_DIFFER: list[tuple[str, Any, Any]] = [
    ("bool is not int", True, 1),
    ("int is not bool", 1, True),
    ("false is not zero", False, 0),
    ("bool in a list", [True, 0], [1, 0]),
    ("str of a number", "3", 3),
    ("number for a str", 3, "3"),
    ("none for zero", None, 0),
    ("zero for none", 0, None),
    ("list for dict", [["a", 1]], {"a": 1}),
    ("set for list", {1, 2}, [1, 2]),
    ("list for set", [1, 2], {1, 2}),
    ("shorter list", [1], [1, 2]),
    ("longer list", [1, 2, 3], [1, 2]),
    ("nested difference", [[1, 2], [3, 4]], [[1, 2], [3, 5]]),
    ("close float", 0.1 + 0.2, 0.3),
    ("nan for number", math.nan, 1.0),
    ("number for nan", 1.0, math.nan),
    ("inf sign", -math.inf, math.inf),
    ("dict missing key", {"a": 1}, {"a": 1, "b": 2}),
    ("dict extra key", {"a": 1, "b": 2}, {"a": 1}),
    ("dict key type", {1: "x"}, {"1": "x"}),
    ("dict bool key", {True: "x"}, {1: "x"}),
    ("set bool element", {True}, {1}),
    ("bytes for str", b"a", "a"),
    ("str for bytes", "a", b"a"),
    ("int too big for a float", 10**400, 1.0),
    ("tuple for str", ("a",), "a"),
]


@pytest.mark.parametrize(
    ("actual", "expected"),
    [(a, e) for _, a, e in VALUES_EQUAL],
    ids=[name for name, _, _ in VALUES_EQUAL],
)
def test_values_equal(actual: Any, expected: Any) -> None:
    assert values_equal(actual, expected, None)


@pytest.mark.parametrize(
    ("actual", "expected"),
    [(a, e) for _, a, e in VALUES_DIFFER],
    ids=[name for name, _, _ in VALUES_DIFFER],
)
def test_values_near_misses_differ(actual: Any, expected: Any) -> None:
    assert not values_equal(actual, expected, None)


class AlwaysEqual:
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


class EqualInt(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize("expected", [3, "x", [1], None, 2.5, {"a": 1}, (1,), True])
def test_objects_that_equal_everything_never_pass(expected: Any) -> None:
    # The channel refuses them first; the comparison also never trusts their __eq__.
    assert not values_equal(AlwaysEqual(), expected, None)
    assert not values_equal(EqualInt(3), expected, None)
    assert not values_equal([AlwaysEqual()], [expected], None)


def test_values_float_tolerance() -> None:
    assert values_equal(0.1 + 0.2, 0.3, 1e-9)
    assert values_equal([1.0000001, 2], [1, 2], 1e-6)
    assert not values_equal(1.001, 1.0, 1e-6)
    assert values_equal(1e9 + 1, 1e9, 1e-6)  # relative
    assert not values_equal(True, 1.0, 0.5)  # bool stays apart


def test_call_matches_accepts_apps_unwrapped_result() -> None:
    case = CallCase(args=(1,), expected=[[1, 2]], also_expected=([1, 2],))
    assert call_matches([[1, 2]], case, None)
    assert call_matches([1, 2], case, None)
    assert call_matches((1, 2), case, None)
    assert not call_matches([1], case, None)
    plain = CallCase(args=(1,), expected=[3])
    assert call_matches([3], plain, None)
    assert not call_matches(3, plain, None)


_LINE = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
    max_size=20,
)


@given(st.lists(_LINE, max_size=20))
def test_an_output_always_matches_itself(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert stdout_matches(text, text, None)
    assert stdout_matches(text + "\n\n", text, None)


@given(st.lists(_LINE.filter(lambda s: s.strip() != ""), min_size=1, max_size=20))
def test_a_missing_or_extra_nonblank_line_never_matches(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert not stdout_matches("\n".join(lines[:-1]), text, None)
    assert not stdout_matches(text + "\nextra", text, None)


@given(st.lists(st.integers(-(10**30), 10**30), min_size=1, max_size=30), st.data())
def test_changing_one_integer_never_matches(
    numbers: list[int], data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(numbers) - 1))
    changed = list(numbers)
    changed[index] += data.draw(st.integers(1, 10**6))
    expected = " ".join(map(str, numbers))
    assert stdout_matches(expected, expected, None)
    assert not stdout_matches(" ".join(map(str, changed)), expected, None)
