"""The answer tree (`Node`) and its canonical, injective rendering.

Trees are immutable and hashable; `render` is the canonical string used in verdicts and
decision keys (equal renderings mean equal trees).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, get_args

__all__ = ["NODE_KINDS", "Node", "NodeKind", "Refused", "num", "render"]

# The closed set of node kinds: mypy checks every `Node(...)` and every comparison
# of `node.kind` against it (strict equality flags a misspelt kind).
NodeKind = Literal[
    "num", "sym", "text", "add", "mul", "div", "neg", "pow", "root", "fn", "fact",
    "binom", "abs", "pct", "pm", "tuple", "pair", "interval", "set", "list", "union",
    "matrix", "row", "rel", "based", "call", "ratio",
]  # fmt: skip
NODE_KINDS: frozenset[str] = frozenset(get_args(NodeKind))


class Refused(Exception):
    """The input is outside the bounds we decide in (size, depth, magnitude)."""


@dataclass(frozen=True, slots=True)
class Node:
    """One node of a parsed answer.

    `kind` is one of `NodeKind`. `text` holds names, operators, bracket shapes or a
    decimal literal; `value` holds the exact value of a `num`.
    """

    kind: NodeKind
    kids: tuple[Node, ...] = ()
    text: str = ""
    value: Fraction | None = None


def num(value: Fraction | int, literal: str = "") -> Node:
    """A number leaf; `literal` keeps a decimal's written digits (``"0.330"``)."""
    return Node("num", value=Fraction(value), text=literal)


def _render_num(node: Node) -> str:
    if node.text:
        return node.text
    value = node.value if node.value is not None else Fraction(0)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


def render(node: Node) -> str:
    """Canonical prefix rendering, e.g. ``(add (mul 2 x) 1)``; injective on trees."""
    if node.kind == "num":
        return _render_num(node)
    if node.kind == "sym":
        return node.text
    if node.kind == "text":
        return '"' + node.text.replace('"', "'") + '"'
    head = node.kind if not node.text else f"{node.kind}:{node.text}"
    return "(" + " ".join([head, *(render(k) for k in node.kids)]) + ")"
