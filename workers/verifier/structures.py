"""Structural helpers: labels (``x = 5``), ± expansion, intervals, unordered sets."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

from workers.verifier.nodes import Node, NodeKind, Refused, render

__all__ = [
    "MAX_PARTS",
    "as_interval",
    "expand_pm",
    "has_repeats",
    "is_choice",
    "is_label",
    "names_quantity",
    "reduce_chain",
    "regroup_assignments",
    "strip_label",
    "unordered",
]

MAX_PM = 3
MAX_PARTS = 64
_VARIABLE_KINDS = frozenset({"sym", "call"})


def is_choice(node: Node) -> bool:
    """A multiple-choice letter: one capital (``B``, ``(B)``, ``\\text{(B)}``)."""
    return node.kind == "sym" and len(node.text) == 1 and node.text.isupper()


def is_label(node: Node) -> bool:
    """Whether `node` names a quantity (``x``, ``a_3``, ``f(x)``, ``|AB|``, ``A:B``,
    ``\\binom{n}{k}``).

    A label holds no numbers and no sums: ``2x + z`` or ``a^2`` are not labels, so
    ``2x + z = 1`` is a real equation, not "the answer is 1".
    """
    if node.kind in {"sym", "call"}:
        return node.text not in {"pi", "oo"}
    if node.kind in {"abs", "ratio", "mul", "div", "pair", "tuple", "binom"}:
        return all(is_label(k) for k in node.kids)
    return False


def names_quantity(node: Node) -> bool:
    """Whether an answer's left side names the asked quantity: a label, a function
    of one (``\\tan A``), or a sum of plain labels (``a + b + c``). Only an answer's
    side is read this way; a gold ``x + y = 5`` stays an equation."""
    if node.kind == "fn":
        return all(is_label(kid) for kid in node.kids)
    if node.kind == "add":
        return all(kid.kind in _VARIABLE_KINDS and is_label(kid) for kid in node.kids)
    return is_label(node)


def strip_label(node: Node, *, answer: bool = False) -> Node:
    """``x = 5`` becomes ``5``; a label chain ``x = 5+5+1 = 11`` keeps its last value.

    A chain is cut at ``\\approx`` (``x = 1/3 \\approx 0.33`` is 1/3). Lists strip
    item by item. Anything else (``3 = 3``, ``2x + z = 1``) is returned unchanged.
    With `answer`, a left side naming the asked quantity (`names_quantity`) is a
    label too (``\\tan A = 2``, ``a + b + c = 11 + 9 + 0 = 20``).
    """
    if node.kind == "list":
        kids = tuple(strip_label(k, answer=answer) for k in node.kids)
        return Node("list", kids, text=node.text)
    reduced = reduce_chain(node, answer=answer)
    if reduced is None:
        return node
    return reduced[1]


def reduce_chain(node: Node, *, answer: bool = False) -> tuple[Node, Node] | None:
    """(label, value) for a label equation chain, else None."""
    if node.kind != "rel":
        return None
    if not (names_quantity if answer else is_label)(node.kids[0]):
        return None
    ops = node.text.split(",")
    if any(op not in {"=", "~"} for op in ops):
        return None
    terms = list(node.kids)
    if "~" in ops:
        cut = ops.index("~")
        terms = terms[: cut + 1] if cut > 0 else terms[:2]
    return terms[0], terms[-1]


def regroup_assignments(node: Node) -> Node:
    """``p=5, q=2; p=7, q=2`` becomes the list of tuples ``(5, 2), (7, 2)``.

    Only a list of label equations whose labels repeat in one fixed order, at least
    twice (``p, q, p, q``); anything else is returned unchanged.
    """
    if node.kind != "list":
        return node
    chains = [reduce_chain(kid) for kid in node.kids]
    pairs = [chain for chain in chains if chain is not None]
    if len(pairs) != len(node.kids):
        return node
    labels = [render(label) for label, _ in pairs]
    size = labels.index(labels[0], 1) if labels.count(labels[0]) > 1 else 0
    if size < 2 or len(set(labels[:size])) != size or len(labels) % size:
        return node
    if labels != labels[:size] * (len(labels) // size):
        return node
    kind: NodeKind = "pair" if size == 2 else "tuple"
    values = [value for _, value in pairs]
    groups = (tuple(values[i : i + size]) for i in range(0, len(values), size))
    return Node("list", tuple(Node(kind, group) for group in groups))


def expand_pm(node: Node) -> Node | None:
    """Expand ``a \\pm b`` into the set {a + b, a - b}; sets and lists flatten.

    Returns None when `node` holds no ±.

    Raises:
        Refused: more than `MAX_PM` ± signs.
    """
    if "pm" not in render(node):
        return None
    if node.kind in {"set", "list"}:
        kids: list[Node] = []
        for kid in node.kids:
            expanded = expand_pm(kid)
            kids.extend(expanded.kids if expanded is not None else (kid,))
        return Node(node.kind, tuple(kids))
    variants = _variants(node, 0)
    return Node("set", tuple(variants)) if len(variants) > 1 else None


def _variants(node: Node, used: int) -> list[Node]:
    if node.kind == "pm":
        if used >= MAX_PM:
            raise Refused("too many \\pm")
        right = node.kids[-1]
        if len(node.kids) == 1:
            return [right, Node("neg", (right,))]
        left = node.kids[0]
        rights = _variants(right, used + 1)
        plus = [Node("add", (left, r)) for r in rights]
        return plus + [Node("add", (left, Node("neg", (r,)))) for r in rights]
    if node.kind not in {"add", "mul", "div", "neg", "pow", "root"}:
        return [node]
    out: list[list[Node]] = [[]]
    for kid in node.kids:
        out = [[*prefix, v] for prefix in out for v in _variants(kid, used)]
        if len(out) > 2**MAX_PM:
            raise Refused("too many \\pm")
    return [Node(node.kind, tuple(kids), text=node.text) for kids in out]


def as_interval(node: Node) -> list[Node] | None:
    """The intervals a node denotes: interval, ``(a, b)``, union, or inequality."""
    if node.kind == "interval":
        return [node]
    if node.kind == "pair":
        return [Node("interval", node.kids, text="()")]
    if node.kind == "union":
        parts: list[Node] = []
        for kid in node.kids:
            sub = as_interval(kid)
            if sub is None:
                return None
            parts.extend(sub)
        return parts
    if node.kind == "rel":
        return _inequality_interval(node)
    return None


def _inequality_interval(node: Node) -> list[Node] | None:
    ops = node.text.split(",")
    if any(op not in {"<", "<="} for op in ops):
        return None
    if any(_is_abs_variable(kid) for kid in node.kids):
        return _abs_band(node, ops)
    inf = Node("sym", text="oo")
    if len(ops) == 2 and node.kids[1].kind in _VARIABLE_KINDS:
        lo, hi = node.kids[0], node.kids[2]
        shape = ("[" if ops[0] == "<=" else "(") + ("]" if ops[1] == "<=" else ")")
    elif len(ops) == 1 and node.kids[0].kind in _VARIABLE_KINDS:
        lo, hi = Node("neg", (inf,)), node.kids[1]
        shape = "(" + ("]" if ops[0] == "<=" else ")")
    elif len(ops) == 1 and node.kids[1].kind in _VARIABLE_KINDS:
        lo, hi = node.kids[0], inf
        shape = ("[" if ops[0] == "<=" else "(") + ")"
    else:
        return None
    return [Node("interval", (lo, hi), text=shape)]


def _is_abs_variable(node: Node) -> bool:
    return node.kind == "abs" and node.kids[0].kind in _VARIABLE_KINDS


def _abs_band(node: Node, ops: list[str]) -> list[Node] | None:
    """``a <= |z| <= b`` as ``[-b, -a] U [a, b]`` (and ``|z| < b`` as ``(-b, b)``).

    Only for exact constant bounds with ``0 <= a < b``; anything else is None.
    """
    from workers.verifier.values import exact_value

    kids = node.kids
    if len(ops) == 1 and _is_abs_variable(kids[0]):
        lo, hi, lo_op, hi_op = Node("num", value=Fraction(0)), kids[1], "<=", ops[0]
    elif len(ops) == 2 and _is_abs_variable(kids[1]):
        lo, hi, lo_op, hi_op = kids[0], kids[2], ops[0], ops[1]
    else:
        return None
    lo_val, hi_val = exact_value(lo), exact_value(hi)
    if lo_val is None or hi_val is None or not 0 <= lo_val < hi_val:
        return None
    outer = ("[", "]") if hi_op == "<=" else ("(", ")")
    if lo_val == 0 and lo_op == "<=":
        return [Node("interval", (Node("neg", (hi,)), hi), text="".join(outer))]
    inner = ("]", "[") if lo_op == "<=" else (")", "(")
    return [
        Node("interval", (Node("neg", (hi,)), Node("neg", (lo,))), outer[0] + inner[0]),
        Node("interval", (lo, hi), text=inner[1] + outer[1]),
    ]


def unordered(
    pred: Sequence[Node],
    gold: Sequence[Node],
    same: Callable[[Node, Node], bool | None],
    *,
    multiset: bool = False,
) -> bool | None:
    """Match two collections, ignoring order, with `same` (None: undecidable).

    As sets repeated parts count once; as multisets (`multiset=True`) every part
    must be matched by its own part on the other side (`1, 1, 2` is not `1, 2`).
    """
    if not multiset:
        pred, gold = _distinct(pred), _distinct(gold)
    if len(pred) != len(gold):
        return False
    if len(gold) > MAX_PARTS:
        raise Refused(f"more than {MAX_PARTS} parts")
    left = list(gold)
    undecided = False
    for p in pred:
        for i, g in enumerate(left):
            result = same(p, g)
            if result:
                del left[i]
                break
            undecided = undecided or result is None
        else:
            return None if undecided else False
    return True


def has_repeats(nodes: Sequence[Node]) -> bool:
    """Whether some part is written twice (same canonical form)."""
    return len(_distinct(nodes)) < len(nodes)


def _distinct(nodes: Sequence[Node]) -> list[Node]:
    """Drop repeated parts (by canonical form): a solution listed twice is one."""
    seen: dict[str, Node] = {}
    for node in nodes:
        seen.setdefault(render(node), node)
    return list(seen.values())


def matrix_value(node: Node) -> Node | None:
    """Evaluate sums and products of literal matrices entrywise (``A + B``, ``A B``).

    Returns a ``matrix`` node whose entries are unevaluated sums/products, or None when
    `node` is not matrix arithmetic or the shapes do not fit.
    """
    if node.kind == "matrix":
        return node
    if node.kind not in {"add", "mul"} or len(node.kids) > 4:
        return None
    mats = [matrix_value(k) for k in node.kids]
    if any(m is None for m in mats):
        return None
    rows = [[list(r.kids) for r in m.kids] for m in mats if m is not None]
    acc = rows[0]
    for other in rows[1:]:
        next_acc = _mat_add(acc, other) if node.kind == "add" else _mat_mul(acc, other)
        if next_acc is None:
            return None
        acc = next_acc
    return Node("matrix", tuple(Node("row", tuple(r)) for r in acc))


def _mat_add(a: list[list[Node]], b: list[list[Node]]) -> list[list[Node]] | None:
    if [len(r) for r in a] != [len(r) for r in b]:
        return None
    return [
        [Node("add", (x, y)) for x, y in zip(ra, rb, strict=True)]
        for ra, rb in zip(a, b, strict=True)
    ]


def _mat_mul(a: list[list[Node]], b: list[list[Node]]) -> list[list[Node]] | None:
    if any(len(r) != len(b) for r in a) or len({len(r) for r in b}) != 1:
        return None
    cols = range(len(b[0]))
    return [
        [
            Node("add", tuple(Node("mul", (row[k], b[k][j])) for k in range(len(b))))
            for j in cols
        ]
        for row in a
    ]
