"""The normalized tests of a row: `TestSuite` and its cases (data only, no parsing).

`workers.code.suite` reads rows into these; the harness and the comparison read them.
Plain data only in `CallCase` (`workers.code.plain` types), so a suite can cross the
channel and be keyed canonically (`suite.suite_key`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from workers.code.errors import InvalidTestsError

__all__ = [
    "MAX_TESTS",
    "AssertCase",
    "CallCase",
    "Mode",
    "StdioCase",
    "TestSuite",
    "check_count",
]

Mode = Literal["stdio", "call", "assert"]

# A bound on cases per row: real sets have at most a few hundred (CodeContests'
# generated tests); more is a broken row, not a task.
MAX_TESTS = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class StdioCase:
    stdin: str
    expected_stdout: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallCase:
    args: tuple[Any, ...]  # plain data only
    expected: Any
    # Other results that pass (APPS/TACO: the sole element of a one-element list).
    also_expected: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AssertCase:
    # One test's trusted code: an MBPP assert statement, or a HumanEval `check` def
    # followed by `check(<entry_point>)`.
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TestSuite:
    mode: Mode
    stdio: tuple[StdioCase, ...] = ()
    calls: tuple[CallCase, ...] = ()
    fn_name: str | None = None  # call mode; a `class Solution` method name is allowed
    asserts: tuple[AssertCase, ...] = ()
    entry_point: str | None = None  # assert mode: the name the asserts call
    # Assert mode: every name the test code reads from the program (entry point first),
    # each to be bound in the harness to a proxy of the model's object of that name.
    program_names: tuple[str, ...] = ()
    # Trusted code (MBPP test_setup_code, HumanEval prompt imports): run in the harness
    # and before the program in the model process.
    setup_code: str = ""
    float_tol: float | None = None  # only when the row asks for one
    time_limit_s: float | None = None  # per test, from the row (capped by the worker)
    memory_limit_bytes: int | None = None

    __test__ = False  # not a pytest test class, whatever its name

    def __len__(self) -> int:
        return len(self.stdio) + len(self.calls) + len(self.asserts)


def check_count(count: int, where: str) -> None:
    """`InvalidTestsError` unless 1 <= count <= MAX_TESTS."""
    if count == 0:
        raise InvalidTestsError(f"{where}: zero tests")
    if count > MAX_TESTS:
        raise InvalidTestsError(f"{where}: {count} tests, more than {MAX_TESTS}")
