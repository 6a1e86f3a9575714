"""A row's unit tests: the test shape a row carries, read into a `TestSuite`.

Pure and stdlib only: nothing here runs code (test sources are only `ast.parse`d).

Three modes:
- `stdio`: the program reads `stdin` and must print `expected_stdout`
  (compared by `compare.stdout_matches`).
- `call`: the harness calls `fn_name(*args)` (a top-level function, or a method of
  `class Solution`, which is instantiated) and compares the plain-data result with
  `expected` (`compare.call_matches`).
- `assert`: each case is trusted test code (an MBPP assert, a HumanEval `check` def
  followed by `check(<entry_point>)`) run in the harness against a proxy of the
  model's `entry_point`.

Row shapes read (each field a JSON object or a JSON string of one; the first found
wins, in this order):
- `input_output` (APPS/TACO), `verifier_metadata.unit_tests` (NeMo Gym), `tests`
  (DeepCoder and others), `official_tests` (open-r1 Codeforces),
  `reward_model.ground_truth` / `ground_truth` (verl prime_code):
  `{"inputs": [...], "outputs": [...], "fn_name"?}` -> stdio, or call with `fn_name`
  (or the row's `fn_name` / `func_name` / `metadata.func_name`); the same fields
  holding verl's `{"assert_case": [...]}` (a list of test sources, or one) -> assert;
  a list of `{"input", "output"}` (`testtype`/`type` functional -> call) -> stdio;
  test code (with `entry_point`: HumanEval, as `test` below) -> assert;
- `verification_info.test_cases` (PrimeIntellect):
  `[{"input", "output", "type", "fn_name"?}]` -> stdio, or call for `function_call`;
- `public_tests`, `private_tests`, `generated_tests` (CodeContests, those present
  joined in this order): `{"input": [...], "output": [...]}` -> stdio;
- `public_test_cases`, `private_test_cases` (LiveCodeBench; private may be pickled,
  see `pickled`), `metadata.func_name`: `[{"input", "output", "testtype"}]` -> stdio,
  or call for `functional`;
- `test` + `entry_point` (HumanEval): `def check(candidate): ...` -> assert;
- `test` (SandboxFusion): `[{"input": {"stdin"}, "output": {"stdout"}}]`, or
  base64(zlib(pickle)) of `{"input_output": ...}` -> stdio / call;
- `test_list` (MBPP) + `test_setup_code` (top level or under `labels`):
  `["assert f(1) == 2", ...]` -> assert.

Conventions (those of the graders that made the data, so reference programs pass):
- stdio: an input or output given as a list of lines is joined with newlines (APPS).
- call, LiveCodeBench style (the input is a string): one JSON value per non-blank line
  of the input are the arguments; the output is the JSON text of the return value.
- call, APPS/TACO style (the input is a list): the list is the arguments; the output
  is the return value, and when it is a one-element list the element is accepted too
  (`CallCase.also_expected`), as APPS's grader does: TACO wraps most return values
  in a list, but not all.
- MBPP: `test_list` only (`challenge_test_list` is a harder extra set, not the task's
  tests); `entry_point` is the function the asserts call.
- HumanEval `check`, MBPP asserts, verl `assert_case`: see `assert_tests` (how checks
  are split into cases, `program_names`, what `setup_code` gains).
- Limits and a float tolerance from the row: see `limits`.

The data classes live in `cases` and are re-exported here.

Adding a shape: a reader `(row) -> TestSuite | None` in `_READERS` (None: not this
shape; `InvalidTestsError`: this shape, but broken), its field in `_CODE_FIELDS`
when it is a new top-level field, and a row of it in
tests/unit/code/test_inputs_suite.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from workers.code.assert_tests import assert_suite, humaneval_suite
from workers.code.cases import (
    MAX_TESTS,
    AssertCase,
    CallCase,
    Mode,
    StdioCase,
    TestSuite,
    check_count,
)
from workers.code.errors import InvalidTestsError, PlainDataError
from workers.code.limits import row_limits
from workers.code.pickled import decode_pickled_tests, looks_pickled
from workers.code.plain import to_tagged

__all__ = [
    "MAX_TESTS",
    "AssertCase",
    "CallCase",
    "Mode",
    "StdioCase",
    "TestSuite",
    "is_code_row",
    "parse_suite",
    "suite_key",
]

Reader = Callable[[Mapping[str, Any]], TestSuite | None]

# --------------------------------------------------------------------------- helpers


def _json(value: Any, where: str) -> Any:
    """A field given as JSON text or as the object itself."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):  # RecursionError: absurd nesting
        raise InvalidTestsError(f"{where} is not valid JSON") from None


def _dig(row: Mapping[str, Any], path: str) -> Any:
    """`row["a"]["b"]` for "a.b"; None when any step is missing (a JSON-string step
    is parsed: some exports store nested objects as text)."""
    value: Any = row
    for key in path.split("."):
        if isinstance(value, str) and value.lstrip().startswith("{"):
            value = _json(value, path)
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _text(value: Any, where: str) -> str:
    """A stdin or stdout: a string, or a list of lines (APPS) joined by newlines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise InvalidTestsError(f"{where}: expected text, got {type(value).__name__}")


def _plain(value: Any, where: str) -> Any:
    try:
        to_tagged(value)
    except PlainDataError as exc:
        raise InvalidTestsError(f"{where}: {exc}") from None
    return value


def _fn_name(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise InvalidTestsError(f"{where}: fn_name must be an identifier")
    return value


# ------------------------------------------------------------------ inputs/outputs


def _stdio_suite(pairs: Sequence[tuple[Any, Any]], where: str) -> TestSuite:
    check_count(len(pairs), where)
    cases = tuple(
        StdioCase(
            stdin=_text(given, f"{where} input {i}"),
            expected_stdout=_text(wanted, f"{where} output {i}"),
        )
        for i, (given, wanted) in enumerate(pairs)
    )
    return TestSuite(mode="stdio", stdio=cases)


def _call_case(given: Any, wanted: Any, where: str) -> CallCase:
    if isinstance(given, str):  # LiveCodeBench: one JSON value per line
        args = tuple(
            _json(line, f"{where} argument")
            for line in given.split("\n")
            if line.strip()
        )
        if not isinstance(wanted, str):
            raise InvalidTestsError(f"{where}: expected output must be JSON text")
        expected = _json(wanted, f"{where} output")
        also: tuple[Any, ...] = ()
    elif isinstance(given, list):  # APPS/TACO: the arguments as a list
        args = tuple(given)
        expected = wanted
        also = (wanted[0],) if isinstance(wanted, list) and len(wanted) == 1 else ()
    else:
        raise InvalidTestsError(f"{where}: call input must be JSON text or a list")
    return CallCase(
        args=_plain(args, where), expected=_plain(expected, where), also_expected=also
    )


def _call_suite(
    pairs: Sequence[tuple[Any, Any]], fn_name: str, where: str
) -> TestSuite:
    check_count(len(pairs), where)
    cases = tuple(
        _call_case(given, wanted, f"{where} test {i}")
        for i, (given, wanted) in enumerate(pairs)
    )
    return TestSuite(mode="call", calls=cases, fn_name=fn_name)


def _io_suite(spec: Any, where: str, row_fn_name: str | None = None) -> TestSuite:
    """`{"inputs", "outputs", "fn_name"?}` or verl's `{"assert_case": [...]}`."""
    if not isinstance(spec, Mapping):
        raise InvalidTestsError(f"{where}: expected an object with inputs and outputs")
    if spec.get("assert_case"):
        return _verl_asserts(spec, where)
    inputs, outputs = spec.get("inputs"), spec.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise InvalidTestsError(f"{where}: inputs and outputs must be lists")
    if len(inputs) != len(outputs):
        raise InvalidTestsError(
            f"{where}: {len(inputs)} inputs but {len(outputs)} outputs"
        )
    pairs = list(zip(inputs, outputs, strict=True))
    fn_name = _fn_name(spec.get("fn_name") or row_fn_name, where)
    if fn_name is not None:
        return _call_suite(pairs, fn_name, where)
    return _stdio_suite(pairs, where)


def _verl_asserts(spec: Mapping[str, Any], where: str) -> TestSuite:
    cases = spec["assert_case"]
    if isinstance(cases, str):
        cases = [cases]
    if not isinstance(cases, list) or not all(isinstance(c, str) for c in cases):
        raise InvalidTestsError(f"{where}: assert_case must be a list of strings")
    if any(o not in (None, "") for o in spec.get("outputs") or ()):
        raise InvalidTestsError(f"{where}: both assert_case and expected outputs")
    sources = [c for c in cases if c.strip()]
    return assert_suite(sources, entry_point=spec.get("entry_point"), where=where)


def _pair_list(items: Any, where: str) -> list[tuple[Any, Any]]:
    """`[{"input", "output"}]` (also `stdin`/`stdout`, and SandboxFusion's
    `{"input": {"stdin"}, "output": {"stdout"}}`)."""
    if not isinstance(items, list):
        raise InvalidTestsError(f"{where}: expected a list of tests")
    pairs = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InvalidTestsError(f"{where} test {i}: expected an object")
        given = item.get("input", item.get("stdin"))
        wanted = item.get("output", item.get("stdout", item.get("expected_output")))
        if isinstance(given, Mapping):
            given = given.get("stdin")
        if isinstance(wanted, Mapping):
            wanted = wanted.get("stdout")
        if given is None or wanted is None:
            raise InvalidTestsError(f"{where} test {i}: no input or no output")
        pairs.append((given, wanted))
    return pairs


def _tests_value(value: Any, where: str, fn_name: str | None = None) -> TestSuite:
    """A tests field in any of the JSON shapes above (`fn_name`: the row's own, for
    shapes that leave it out of the tests)."""
    value = _json(value, where)
    if isinstance(value, Mapping) and "input_output" in value:
        return _io_suite(_json(value["input_output"], where), where, fn_name)
    if isinstance(value, list):
        return _case_list(value, fn_name=fn_name, where=where)
    return _io_suite(value, where, fn_name)


def _test_field(value: Any, row: Mapping[str, Any], where: str) -> TestSuite:
    """A `test`/`tests`-like field: JSON tests, pickled tests, or test code."""
    fn_name = _row_fn_name(row)
    if not isinstance(value, str) or value.lstrip().startswith(("[", "{")):
        return _tests_value(value, where, fn_name)
    if looks_pickled(value):
        return _tests_value(decode_pickled_tests(value), f"{where} (pickled)", fn_name)
    entry_point = row.get("entry_point") or _dig(row, "metadata.entry_point")
    if entry_point is not None:
        return humaneval_suite(value, entry_point, row.get("prompt"), where)
    return assert_suite([value], where=where)  # one test program (verl style)


def _row_fn_name(row: Mapping[str, Any]) -> str | None:
    """The function name a row gives beside its tests (DeepCoder and LiveCodeBench
    keep it in `metadata`)."""
    for path in ("fn_name", "func_name", "metadata.func_name", "metadata.fn_name"):
        value = _dig(row, path)
        if value:
            return _fn_name(value, path)
    return None


def _case_list(items: list[Any], fn_name: str | None, where: str) -> TestSuite:
    """A list of `{"input", "output"}` cases; functional ones (LiveCodeBench
    `testtype`, PrimeIntellect `type` and `fn_name`) are calls."""
    pairs = _pair_list(items, where)
    kinds = {_case_kind(item) for item in items}
    names = {item.get("fn_name") for item in items if item.get("fn_name")}
    fn_name = fn_name or (names.pop() if len(names) == 1 else None)
    if kinds == {"call"} or (kinds == {"any"} and fn_name):
        name = _fn_name(fn_name, where)
        if name is None:
            raise InvalidTestsError(
                f"{where}: functional tests without a function name"
            )
        return _call_suite(pairs, name, where)
    if "call" in kinds:
        raise InvalidTestsError(f"{where}: stdin and functional tests mixed")
    return _stdio_suite(pairs, where)


def _case_kind(item: Mapping[str, Any]) -> str:
    kind = item.get("testtype", item.get("type"))
    if kind in ("functional", "function_call", "call_based"):
        return "call"
    if kind in ("stdin", "stdin_stdout", "stdio"):
        return "stdio"
    return "any"


# ------------------------------------------------------------------------- readers


def _read_io_fields(row: Mapping[str, Any]) -> TestSuite | None:
    for path in _IO_FIELDS:
        value = _dig(row, path)
        if value is not None:
            return _test_field(value, row, path)
    return None


_IO_FIELDS = ("input_output", "verifier_metadata.unit_tests", "tests", "official_tests")


def _read_ground_truth(row: Mapping[str, Any]) -> TestSuite | None:
    for path in ("reward_model.ground_truth", "ground_truth"):
        value = _dig(row, path)
        if _is_code_ground_truth(value):
            return _tests_value(value, path)
    return None


def _is_code_ground_truth(value: Any) -> bool:
    """verl keeps math answers and code tests in the same field: tests are an object
    (or its JSON text) with `inputs` or `assert_case`, or a list of input objects."""
    if isinstance(value, str):
        head = value.lstrip()[:1]
        if head not in ("{", "["):
            return False
        if not any(key in value for key in ('"inputs"', '"assert_case"', '"input"')):
            return False
        try:
            value = json.loads(value)
        except ValueError:
            return False
    if isinstance(value, Mapping):
        return "inputs" in value or "assert_case" in value or "input_output" in value
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, Mapping) and "input" in item for item in value)
    )


def _read_verification_info(row: Mapping[str, Any]) -> TestSuite | None:
    info = row.get("verification_info")
    if info is None:
        return None
    info = _json(info, "verification_info")
    cases = info.get("test_cases") if isinstance(info, Mapping) else None
    if cases is None:
        raise InvalidTestsError("verification_info: no test_cases")
    return _case_list(
        _json(cases, "verification_info.test_cases"),
        fn_name=None,
        where="verification_info.test_cases",
    )


_CODECONTESTS = ("public_tests", "private_tests", "generated_tests")


def _read_codecontests(row: Mapping[str, Any]) -> TestSuite | None:
    present = [name for name in _CODECONTESTS if row.get(name) is not None]
    if not present:
        return None
    pairs: list[tuple[Any, Any]] = []
    for name in present:
        spec = _json(row[name], name)
        if not isinstance(spec, Mapping):
            raise InvalidTestsError(f"{name}: expected {{input: [...], output: [...]}}")
        given, wanted = spec.get("input"), spec.get("output")
        if not isinstance(given, list) or not isinstance(wanted, list):
            raise InvalidTestsError(f"{name}: input and output must be lists")
        if len(given) != len(wanted):
            raise InvalidTestsError(
                f"{name}: {len(given)} inputs, {len(wanted)} outputs"
            )
        pairs.extend(zip(given, wanted, strict=True))
    return _stdio_suite(pairs, "+".join(present))


def _read_livecodebench(row: Mapping[str, Any]) -> TestSuite | None:
    public, private = row.get("public_test_cases"), row.get("private_test_cases")
    if public is None and private is None:
        return None
    items: list[Any] = []
    for name, value in (("public_test_cases", public), ("private_test_cases", private)):
        if value is None or value == "":
            continue
        if isinstance(value, str) and looks_pickled(value):
            value = decode_pickled_tests(value)
        value = _json(value, name)
        if not isinstance(value, list):
            raise InvalidTestsError(f"{name}: expected a list of tests")
        items.extend(value)
    return _case_list(
        items, fn_name=_row_fn_name(row), where="public/private_test_cases"
    )


def _read_test(row: Mapping[str, Any]) -> TestSuite | None:
    test = row.get("test")
    return None if test is None else _test_field(test, row, "test")


def _read_test_list(row: Mapping[str, Any]) -> TestSuite | None:
    tests = row.get("test_list")
    if tests is None:
        return None
    tests = _json(tests, "test_list")
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise InvalidTestsError("test_list: expected a list of assert statements")
    setup = row.get("test_setup_code", _dig(row, "labels.test_setup_code")) or ""
    if not isinstance(setup, str):
        raise InvalidTestsError("test_setup_code: expected text")
    return assert_suite(tests, setup_code=setup, where="test_list")


def _read_assert_case(row: Mapping[str, Any]) -> TestSuite | None:
    if row.get("assert_case") is None:
        return None
    return _verl_asserts(row, "assert_case")


_READERS: tuple[Reader, ...] = (
    _read_io_fields,
    _read_ground_truth,
    _read_verification_info,
    _read_codecontests,
    _read_livecodebench,
    _read_test,
    _read_test_list,
    _read_assert_case,
)

_CODE_FIELDS = frozenset(
    {
        "input_output",
        "tests",
        "official_tests",
        "verification_info",
        *_CODECONTESTS,
        "public_test_cases",
        "private_test_cases",
        "test",
        "test_list",
        "assert_case",
    }
)


def is_code_row(row: Mapping[str, Any]) -> bool:
    """Cheap: whether the row carries tests in a shape `parse_suite` reads (it may
    still find them malformed). Math rows never match: no test field, and a verl
    `ground_truth` counts only when it holds code tests."""
    if any(row.get(name) is not None for name in _CODE_FIELDS):
        return True
    if _dig(row, "verifier_metadata.unit_tests") is not None:
        return True
    return any(
        _is_code_ground_truth(_dig(row, path))
        for path in ("reward_model.ground_truth", "ground_truth")
    )


def parse_suite(row: Mapping[str, Any]) -> TestSuite:
    """The row's tests; `InvalidTestsError(reason)` if none, zero, or malformed."""
    for reader in _READERS:
        suite = reader(row)
        if suite is not None:
            return dataclasses.replace(suite, **row_limits(row))
    raise InvalidTestsError(
        "no tests: expected one of input_output, tests, verifier_metadata.unit_tests, "
        "reward_model.ground_truth, verification_info, public_tests/private_tests/"
        "generated_tests, public_test_cases/private_test_cases, test (+ entry_point), "
        "test_list, assert_case"
    )


# ------------------------------------------------------------------------ cache key


def suite_key(suite: TestSuite) -> str:
    """Canonical JSON text of everything that decides verdicts (for cache keys):
    equal suites give equal text, and 1, 1.0 and True stay distinct (tagged form)."""
    body = {
        "mode": suite.mode,
        "stdio": [[c.stdin, c.expected_stdout] for c in suite.stdio],
        "calls": [
            [to_tagged(c.args), to_tagged(c.expected), to_tagged(c.also_expected)]
            for c in suite.calls
        ],
        "fn_name": suite.fn_name,
        "asserts": [c.source for c in suite.asserts],
        "entry_point": suite.entry_point,
        "program_names": list(suite.program_names),
        "setup_code": suite.setup_code,
        "float_tol": suite.float_tol,
        "time_limit_s": suite.time_limit_s,
        "memory_limit_bytes": suite.memory_limit_bytes,
    }
    return json.dumps(body, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
