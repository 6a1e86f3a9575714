"""Assert tests (HumanEval `check`, MBPP asserts, verl `assert_case`) read into a suite.

Trusted test code is only parsed here (`program.parse_tree`), never run. What this
module decides, for the harness that runs the cases:
- which cases: a HumanEval `check` made only of asserts becomes one case per assert
  (partial credit), leaving out asserts that read no program name (`assert True`);
  any other `check`, and each MBPP assert or verl source, is one case;
- `program_names`: every name the tests read that neither they, the setup code nor
  the builtins bind (the original harnesses ran tests in the program's namespace, so
  MBPP tests call reference helpers, and `def sum` shadows the builtin) — the entry
  point first; the harness binds each to a proxy of the model's object;
- refusal (`InvalidTestsError`) of test code that checks nothing when run: only
  definitions (a `check` never called, pytest-style `def test_*` functions) would
  pass every program;
- `setup_code`: the row's own, plus the prompt's top-level imports and the stdlib
  modules the tests read without importing them (`math.isclose`).
"""

from __future__ import annotations

import ast
import builtins
import io
import itertools
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any, TypeGuard

from workers.code.cases import AssertCase, TestSuite, check_count
from workers.code.errors import InvalidTestsError
from workers.code.program import parse_tree

__all__ = ["MAX_TEST_SOURCE_CHARS", "assert_suite", "humaneval_suite"]

MAX_TEST_SOURCE_CHARS = 1024 * 1024


def _parse_source(source: str, where: str) -> ast.Module:
    if len(source) > MAX_TEST_SOURCE_CHARS:
        raise InvalidTestsError(
            f"{where}: test code larger than {MAX_TEST_SOURCE_CHARS}"
        )
    tree = parse_tree(source, MAX_TEST_SOURCE_CHARS)
    if tree is None:
        raise InvalidTestsError(f"{where}: test code does not parse")
    return tree


def assert_suite(
    sources: Sequence[str],
    *,
    entry_point: Any = None,
    setup_code: str = "",
    where: str,
) -> TestSuite:
    check_count(len(sources), where)
    trees = [_parse_source(s, f"{where} test {i}") for i, s in enumerate(sources)]
    for i, tree in enumerate(trees):
        if not _runs_a_check(tree):
            raise InvalidTestsError(
                f"{where} test {i}: the code only defines things and checks nothing "
                "(a `check` never called, pytest-style `def test_*`?)"
            )
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
_DEFINITIONS = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Import,
    ast.ImportFrom,
)


def _walk(node: ast.AST) -> list[ast.AST]:
    """`ast.walk`'s nodes in its (breadth-first) order, as a list, so that each tree
    is walked once (MBPP's suites cost 0.39 ms a row, 60% of it in `ast.walk`, and
    the worker builds one per rollout; now 0.28 ms)."""
    nodes = [node]
    for parent in nodes:  # the list grows while it is read: breadth-first
        for field in parent._fields:
            value = getattr(parent, field, None)
            if isinstance(value, ast.AST):
                nodes.append(value)
            elif isinstance(value, list):
                nodes += [item for item in value if isinstance(item, ast.AST)]
    return nodes


def _runs_a_check(tree: ast.Module) -> bool:
    """Whether running the test code can fail: some top-level statement (outside a
    def or class) asserts, raises or calls something. A test module that only
    defines `check` or `test_*` functions would pass every program."""
    return any(
        isinstance(node, ast.Assert | ast.Raise | ast.Call)
        for stmt in tree.body
        if not isinstance(stmt, _DEFINITIONS)
        for node in _walk(stmt)
    )


def _joined(code: str, more: str) -> str:
    if not more or not code.strip():
        return more or code
    return f"{code.rstrip()}\n{more}"


def _bound_names(tree: ast.AST, nodes: list[ast.AST] | None = None) -> set[str]:
    """The names code binds itself: defs, classes, imports, assignments, parameters
    (`nodes`: the tree's, when walked already)."""
    bound: set[str] = set()
    for node in _walk(tree) if nodes is None else nodes:
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
    walked = [_walk(tree) for tree in trees]
    bound = _bound_names(setup_tree).union(
        *(_bound_names(t, n) for t, n in zip(trees, walked, strict=True))
    )
    found = dict.fromkeys([entry_point] if entry_point else [])
    for nodes in walked:
        for node in nodes:
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
            for node in _walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        ]
        names = (n for n in called if n not in _BUILTIN_NAMES and n not in defined)
        counts.update(list(dict.fromkeys(names)))
    return counts.most_common(1)[0][0] if counts else None


def humaneval_suite(test: str, entry_point: Any, prompt: Any, where: str) -> TestSuite:
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
    return assert_suite(sources, entry_point=entry_point, setup_code=setup, where=where)


def _is_check_def(node: ast.stmt) -> TypeGuard[ast.FunctionDef]:
    return isinstance(node, ast.FunctionDef) and node.name == "check"


def _split_check(test: str, tree: ast.Module, entry_point: str) -> list[str] | None:
    """One source per assert of a `check` made of asserts only (each keeps the test
    module around it); None when `check` is anything else (it stays one case).

    Asserts that read neither the candidate nor any program name (HumanEval's
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
    # The parser's line breaks only (`str.splitlines` also breaks at \f and \u2028,
    # which may sit inside a string literal).
    lines = io.StringIO(test, newline="").readlines()
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
    return {n.id for n in _walk(node) if isinstance(n, ast.Name)}


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _prompt_imports(prompt: Any) -> str:
    """The prompt's top-level import statements (trusted: the data set wrote them)."""
    tree = (
        parse_tree(prompt, MAX_TEST_SOURCE_CHARS) if isinstance(prompt, str) else None
    )
    if tree is None:
        return ""
    imports = [
        ast.get_source_segment(prompt, node) or ""
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    return "".join(f"{line}\n" for line in imports if line)
