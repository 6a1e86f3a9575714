"""Node kinds are a closed set: every kind the verifier compares against exists.

mypy checks `Node(...)` and `node.kind == "..."` against `NodeKind`; membership tests
against sets of strings (`node.kind in _ORDERED`) escape it, so this test reads the
verifier's source and checks every string compared with a `.kind`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from workers.verifier.nodes import NODE_KINDS, Node

PACKAGE = Path(__file__).resolve().parents[3] / "workers" / "verifier"


def _strings(node: ast.expr, names: dict[str, ast.expr]) -> Iterator[str]:
    """The string constants an expression compared with `.kind` can hold."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.Set | ast.Tuple | ast.List):
        for element in node.elts:
            yield from _strings(element, names)
    elif isinstance(node, ast.BinOp):
        yield from _strings(node.left, names)
        yield from _strings(node.right, names)
    elif isinstance(node, ast.Call) and node.args:  # frozenset({...})
        yield from _strings(node.args[0], names)
    elif isinstance(node, ast.Name) and node.id in names:
        yield from _strings(names[node.id], names)


def _kind_comparisons(tree: ast.Module) -> Iterator[tuple[int, str]]:
    names = {
        target.id: statement.value
        for statement in tree.body
        if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value
        for target in (
            statement.targets
            if isinstance(statement, ast.Assign)
            else [statement.target]
        )
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides):
            continue
        for side in sides:
            for text in _strings(side, names):
                yield node.lineno, text


def test_every_kind_compared_in_the_verifier_exists() -> None:
    # Given: every verifier module's source
    unknown = []
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # When: the strings compared with a `.kind` are collected
        for line, text in _kind_comparisons(tree):
            if text not in NODE_KINDS:
                unknown.append(f"{path.name}:{line}: {text!r}")
    # Then: each is a declared node kind (tokens have kinds too: allow theirs)
    token_kinds = {"num", "id", "word", "cmd", "op", "end", "space"}
    assert [u for u in unknown if u.rsplit("'", 2)[1] not in token_kinds] == []


def test_the_check_sees_a_misspelt_kind() -> None:
    # Given: a comparison with a misspelt kind (the check must be able to fail)
    tree = ast.parse('_S = frozenset({"lsit"})\ndef f(n): return n.kind in _S\n')
    # When / Then: it is reported
    assert [text for _, text in _kind_comparisons(tree)] == ["lsit"]


def test_node_kinds_match_what_the_parser_builds() -> None:
    assert Node("list").kind in NODE_KINDS
    assert len(NODE_KINDS) == 27
