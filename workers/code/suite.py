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
  (DeepCoder and others), `reward_model.ground_truth` / `ground_truth` (verl
  prime_code): `{"inputs": [...], "outputs": [...], "fn_name"?}` -> stdio, or call
  with `fn_name`; the same fields holding verl's `{"assert_case": [...]}` (a list of
  test sources, or one) -> assert; `tests` / `ground_truth` as a list of
  `{"input", "output"}` -> stdio;
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
- HumanEval: a `check` whose body is only asserts is split into one case per assert
  (partial credit), leaving out asserts that read no program name (`assert True`);
  any other `check` is one case.
- Assert tests ran in the program's namespace in the original harnesses, so they
  read more than the entry point: `program_names` lists every name they read that
  neither they, the setup code nor the builtins bind (the entry point first, even
  when it shadows a builtin, as MBPP's `def sum`); the harness binds each to a proxy
  of the model's object. Stdlib modules they read unimported (`math.isclose`) and
  the prompt's top-level imports are added to `setup_code`.
- Limits from the row: `time_limit` (seconds, `{"seconds", "nanos"}` as CodeContests,
  or text such as "2 seconds"), `time_limit_s`; `memory_limit_bytes`, `memory_limit_mb`,
  `memory_limit` (a number is MB; text such as "256 megabytes"). A float tolerance
  only from `float_tol`, `atol`, `abs_tol` or `tolerance` (see `compare`).

Adding a shape: a reader `(row) -> TestSuite | None` in `_READERS` (None: not this
shape; `InvalidTestsError`: this shape, but broken), its field in `_CODE_FIELDS`
when it is a new top-level field, and a row of it in
tests/unit/code/test_inputs_suite.py.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import itertools
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from workers.code.errors import InvalidTestsError, PlainDataError
from workers.code.pickled import decode_pickled_tests, looks_pickled
from workers.code.plain import to_tagged
from workers.code.program import parse_tree

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

Mode = Literal["stdio", "call", "assert"]

# A bound on cases per row: real sets have at most a few hundred (CodeContests'
# generated tests); more is a broken row, not a task.
MAX_TESTS = 10_000
_MAX_TEST_SOURCE = 1024 * 1024


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


def _check_count(count: int, where: str) -> None:
    if count == 0:
        raise InvalidTestsError(f"{where}: zero tests")
    if count > MAX_TESTS:
        raise InvalidTestsError(f"{where}: {count} tests, more than {MAX_TESTS}")


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
    _check_count(len(pairs), where)
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
    _check_count(len(pairs), where)
    cases = tuple(
        _call_case(given, wanted, f"{where} test {i}")
        for i, (given, wanted) in enumerate(pairs)
    )
    return TestSuite(mode="call", calls=cases, fn_name=fn_name)


def _io_suite(spec: Any, where: str) -> TestSuite:
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
    fn_name = _fn_name(spec.get("fn_name"), where)
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
    return _assert_suite(sources, entry_point=spec.get("entry_point"), where=where)


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


def _tests_value(value: Any, where: str) -> TestSuite:
    """A tests field in any of the JSON shapes above."""
    value = _json(value, where)
    if isinstance(value, Mapping) and "input_output" in value:
        return _io_suite(_json(value["input_output"], where), where)
    if isinstance(value, list):
        return _case_list(value, fn_name=None, where=where)
    return _io_suite(value, where)


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


# ------------------------------------------------------------------------- asserts


def _parse_source(source: str, where: str) -> ast.Module:
    if len(source) > _MAX_TEST_SOURCE:
        raise InvalidTestsError(f"{where}: test code larger than {_MAX_TEST_SOURCE}")
    tree = parse_tree(source, _MAX_TEST_SOURCE)
    if tree is None:
        raise InvalidTestsError(f"{where}: test code does not parse")
    return tree


def _assert_suite(
    sources: Sequence[str],
    *,
    entry_point: Any = None,
    setup_code: str = "",
    where: str,
) -> TestSuite:
    _check_count(len(sources), where)
    trees = [_parse_source(s, f"{where} test {i}") for i, s in enumerate(sources)]
    setup_tree = _parse_source(setup_code, f"{where} setup code")
    if entry_point is not None and not (
        isinstance(entry_point, str) and entry_point.isidentifier()
    ):
        raise InvalidTestsError(f"{where}: entry_point must be an identifier")
    entry = entry_point or _called_name(trees, _bound_names(setup_tree))
    unbound = _unbound_names(trees, setup_tree, entry)
    modules = [name for name in unbound if name in sys.stdlib_module_names]
    imports = "".join(f"import {name}\n" for name in modules)
    return TestSuite(
        mode="assert",
        asserts=tuple(AssertCase(source=s) for s in sources),
        entry_point=entry,
        program_names=tuple(name for name in unbound if name not in modules),
        setup_code=_joined(setup_code, imports),
    )


_BUILTIN_NAMES = frozenset(dir(builtins))


def _joined(code: str, more: str) -> str:
    if not more or not code.strip():
        return more or code
    return f"{code.rstrip()}\n{more}"


def _bound_names(tree: ast.AST) -> set[str]:
    """The names code binds itself: defs, classes, imports, assignments, parameters."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound


def _unbound_names(
    trees: Sequence[ast.Module], setup_tree: ast.Module, entry_point: str | None
) -> list[str]:
    """Names the tests read but neither they, the setup code nor the builtins bind:
    the program's (the entry point first), or stdlib modules the program imported
    when the original harness ran tests in the program's namespace."""
    bound = _bound_names(setup_tree).union(*(_bound_names(t) for t in trees))
    found = dict.fromkeys([entry_point] if entry_point else [])
    for tree in trees:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Name)
                and isinstance(node.ctx, ast.Load)
                and node.id not in bound
                and node.id not in _BUILTIN_NAMES
            ):
                found[node.id] = None
    return list(found)


def _called_name(trees: Sequence[ast.Module], defined: set[str]) -> str | None:
    """The function MBPP-style asserts test: the non-builtin name called by the most
    asserts (ties: the first called), not one the setup code defines."""
    counts: Counter[str] = Counter()
    for tree in trees:
        called = [
            node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        ]
        names = (n for n in called if n not in _BUILTIN_NAMES and n not in defined)
        counts.update(list(dict.fromkeys(names)))
    return counts.most_common(1)[0][0] if counts else None


def _humaneval_suite(test: str, entry_point: Any, prompt: Any, where: str) -> TestSuite:
    if isinstance(entry_point, str):
        entry_point = entry_point.strip()  # MBPP's "is_Power_Of_Two " (two rows)
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise InvalidTestsError(f"{where}: entry_point must be an identifier")
    tree = _parse_source(test, where)
    sources = _split_check(test, tree, entry_point)
    if sources is None:
        if not any(_is_check_def(node) for node in tree.body):
            raise InvalidTestsError(f"{where}: no top-level `def check(candidate)`")
        sources = [f"{test.rstrip()}\n\ncheck({entry_point})\n"]
    setup = _prompt_imports(prompt)
    return _assert_suite(
        sources, entry_point=entry_point, setup_code=setup, where=where
    )


def _is_check_def(node: ast.stmt) -> TypeGuard[ast.FunctionDef]:
    return isinstance(node, ast.FunctionDef) and node.name == "check"


def _split_check(test: str, tree: ast.Module, entry_point: str) -> list[str] | None:
    """One source per assert of a `check` made of asserts only (each keeps the test
    module around it); None when `check` is anything else (it stays one case).

    Asserts that name neither the candidate nor the entry point (HumanEval's
    `assert True, "This prints if this assert fails"`) test nothing and would pass
    as cases of their own: they are left out of the split."""
    checks = [node for node in tree.body if _is_check_def(node)]
    body = _assert_body(checks[0]) if len(checks) == 1 else None
    if body is None:
        return None
    check = checks[0]
    params = {arg.arg for arg in check.args.args}
    # Every name a test reads that the test does not bind is the program's.
    program = _unbound_names([tree], ast.Module(body=[], type_ignores=[]), None)
    wanted = params | set(program) | {entry_point}  # MBPP's `def sum` shadows a builtin
    kept = [stmt for stmt in body if _names(stmt) & wanted]
    if len(kept) < 2:
        return None
    lines = test.splitlines(keepends=True)
    first = check.decorator_list[0].lineno if check.decorator_list else check.lineno
    header = lines[first - 1 : body[0].lineno - 1]  # `def check(...):`, docstring
    after = lines[check.end_lineno or len(lines) :]
    call = f"\ncheck({entry_point})\n"
    return [
        "".join(
            lines[: first - 1]
            + header
            + lines[stmt.lineno - 1 : stmt.end_lineno]
            + after
        ).rstrip()
        + "\n"
        + call
        for stmt in kept
    ]


def _assert_body(check: ast.FunctionDef) -> list[ast.stmt] | None:
    """The asserts of `check` (after a docstring), each on lines of its own; None
    when the body holds anything else or statements share a line."""
    body = list(check.body)
    if body and _is_docstring(body[0]):
        body = body[1:]
    if not body or not all(isinstance(stmt, ast.Assert) for stmt in body):
        return None
    if check.body[0].lineno == check.lineno:
        return None  # `def check(c): assert ...` on one line
    spans = [(stmt.lineno, stmt.end_lineno or stmt.lineno) for stmt in check.body]
    if any(a[1] >= b[0] for a, b in itertools.pairwise(spans)):
        return None  # `assert a; assert b`
    return body


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _prompt_imports(prompt: Any) -> str:
    """The prompt's top-level import statements (trusted: the data set wrote them)."""
    tree = parse_tree(prompt, _MAX_TEST_SOURCE) if isinstance(prompt, str) else None
    if tree is None:
        return ""
    imports = [
        ast.get_source_segment(prompt, node) or ""
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    return "".join(f"{line}\n" for line in imports if line)


# ------------------------------------------------------------------------- readers


def _read_io_fields(row: Mapping[str, Any]) -> TestSuite | None:
    for path in ("input_output", "verifier_metadata.unit_tests", "tests"):
        value = _dig(row, path)
        if value is not None:
            return _tests_value(value, path)
    return None


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
    fn_name = _dig(row, "metadata.func_name")
    return _case_list(items, fn_name=fn_name, where="public/private_test_cases")


def _read_test(row: Mapping[str, Any]) -> TestSuite | None:
    test = row.get("test")
    if test is None:
        return None
    if not isinstance(test, str) or test.lstrip().startswith(("[", "{")):
        return _tests_value(test, "test")
    if looks_pickled(test):
        return _tests_value(decode_pickled_tests(test), "test (pickled)")
    if row.get("entry_point") is not None:
        return _humaneval_suite(test, row["entry_point"], row.get("prompt"), "test")
    return _assert_suite([test], where="test")  # one test program (verl style)


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
    return _assert_suite(tests, setup_code=setup, where="test_list")


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
    if not _CODE_FIELDS.isdisjoint(row.keys()):
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
            return dataclasses.replace(suite, **_row_limits(row))
    raise InvalidTestsError(
        "no tests: expected one of input_output, tests, verifier_metadata.unit_tests, "
        "reward_model.ground_truth, verification_info, public_tests/private_tests/"
        "generated_tests, public_test_cases/private_test_cases, test (+ entry_point), "
        "test_list, assert_case"
    )


# -------------------------------------------------------------------------- limits

_UNITS_S = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "ms": 1e-3,
    "millisecond": 1e-3,
}
_UNITS_BYTES = {
    "": 1 << 20,  # a bare number is megabytes (TACO, SandboxFusion)
    "b": 1, "byte": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "kilobyte": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20, "megabyte": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "gigabyte": 1 << 30,
}  # fmt: skip
_QUANTITY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTestsError(f"{where}: expected a number")
    if not math.isfinite(value) or value <= 0:
        raise InvalidTestsError(f"{where}: expected a positive number")
    return float(value)


def _quantity(value: Any, units: Mapping[str, float], where: str) -> float:
    """A number, or text like "2 seconds" / "256 megabytes" in the given units."""
    if isinstance(value, str):
        match = _QUANTITY.fullmatch(value)
        unit = match.group(2).lower() if match else ""
        if unit not in units and unit.endswith("s"):  # "seconds", "megabytes"
            unit = unit[:-1]
        if match is None or unit not in units:
            raise InvalidTestsError(f"{where}: cannot read {value[:40]!r}")
        return _positive(float(match.group(1)) * units[unit], where)
    return _positive(value, where) * units[""]


def _time_limit_s(row: Mapping[str, Any]) -> float | None:
    if row.get("time_limit_s") is not None:
        return _positive(row["time_limit_s"], "time_limit_s")
    value = row.get("time_limit")
    if value is None:
        return None
    if isinstance(value, Mapping):  # CodeContests: {"seconds": 2, "nanos": 0}
        seconds = value.get("seconds") or 0
        nanos = value.get("nanos") or 0
        if not isinstance(seconds, int | float) or not isinstance(nanos, int | float):
            raise InvalidTestsError("time_limit: expected seconds and nanos")
        return _positive(seconds + nanos / 1e9, "time_limit")
    return _quantity(value, _UNITS_S, "time_limit")


def _memory_limit_bytes(row: Mapping[str, Any]) -> int | None:
    if row.get("memory_limit_bytes") is not None:
        return int(_positive(row["memory_limit_bytes"], "memory_limit_bytes"))
    if row.get("memory_limit_mb") is not None:
        return int(_positive(row["memory_limit_mb"], "memory_limit_mb") * (1 << 20))
    if row.get("memory_limit") is not None:
        return int(_quantity(row["memory_limit"], _UNITS_BYTES, "memory_limit"))
    return None


_TOLERANCE_FIELDS = ("float_tol", "atol", "abs_tol", "tolerance")


def _float_tol(row: Mapping[str, Any]) -> float | None:
    for name in _TOLERANCE_FIELDS:
        if row.get(name) is not None:
            return _positive(row[name], name)
    return None


def _row_limits(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "time_limit_s": _time_limit_s(row),
        "memory_limit_bytes": _memory_limit_bytes(row),
        "float_tol": _float_tol(row),
    }


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
