"""Equations and inequalities: label equations, proportional equations, chains, and
closed chains given as an answer (``4+7+2 = 13``, ``2\\pi \\approx 6.28``).

Closed-chain policy (a relation answering a value): when every side of an ``=`` /
``\\approx`` chain is a closed expression (numbers and constants, no variables) and the
chain shows a computation (some side before the last is not a bare number, so ``3 = 3``
still proves nothing), its final side is the answer; after an ``\\approx`` the last
exact side counts too (``\\frac13 \\approx 0.33`` answers 1/3 and 0.33). The chain is
checked first: ``=`` sides must be equal (a decimal after an irrational side is read as
rounded), an ``\\approx`` side must round to the decimal after it; a false chain
(``2+2 = 5``) is a wrong answer whatever its last side, since it contradicts itself.
A chain we cannot evaluate stays a relation, which matches no value.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from workers.models import VerifyMethod
from workers.verifier.nodes import Node, render
from workers.verifier.outcome import Outcome
from workers.verifier.structures import reduce_chain
from workers.verifier.values import decimal_places, exact_value

__all__ = ["FALSE_CHAIN", "closed_chain_answers", "compare_relations"]

FALSE_CHAIN = "false chain: its sides are not equal"
_CONSTANTS = frozenset({"pi", "e"})
_CLOSED_KINDS = frozenset(
    {"num", "add", "mul", "div", "neg", "pow", "root", "fn", "fact", "binom", "abs"}
)
_EVAL_DIGITS = 60

_INEQUALITY = frozenset({"<", "<="})
Compare = Callable[[Node, Node], Outcome]


def compare_relations(pred: Node, gold: Node, compare: Compare) -> Outcome:
    """Compare two relations (both ``rel`` nodes).

    Label equations (``x = 5``) compare label and value; other equations are equal when
    one side-difference is a non-zero constant multiple of the other (``y = 2x + 1`` vs
    ``2x + 1 = y``); a single inequality needs a positive multiple and the same
    strictness; chains compare term by term. ``3 = 3`` proves nothing.

    Args:
        pred: predicted relation.
        gold: gold relation.
        compare: the element comparison to use for sides and values.

    Returns:
        The outcome.
    """
    p_label, g_label = reduce_chain(pred), reduce_chain(gold)
    if p_label and g_label and render(p_label[0]) == render(g_label[0]):
        out = compare(p_label[1], g_label[1])
        return Outcome(out.same, VerifyMethod.STRUCTURAL, "labelled value")
    renamed = _same_function(pred, gold)
    if renamed is not None:
        out = compare(*renamed)
        return Outcome(out.same, VerifyMethod.STRUCTURAL, "same function, renamed")
    p_ops, g_ops = pred.text.split(","), gold.text.split(",")
    if len(p_ops) == 1 and len(g_ops) == 1 and _kind(p_ops[0]) == _kind(g_ops[0]):
        return _single(pred, gold, p_ops[0], g_ops[0])
    if p_ops == g_ops:
        return _chain(pred, gold, compare)
    return Outcome(False, VerifyMethod.STRUCTURAL, "different relations")


def _same_function(pred: Node, gold: Node) -> tuple[Node, Node] | None:
    """(pred's right side, gold's) when both define one function of one variable
    under two names: ``y = 2x + 3`` and ``f(x) = 2x + 3``, or ``f(z) = z`` and
    ``f(x) = x`` (the variable renamed in pred's side when that name is free)."""
    p_def, g_def = _definition(pred), _definition(gold)
    if p_def is None or g_def is None:
        return None
    (p_name, p_var, p_side), (g_name, g_var, g_side) = p_def, g_def
    if p_name != g_name and "y" not in (p_name, g_name):
        return None  # `f(x)` and `g(x)` may be two functions of one problem
    if p_var and g_var and p_var != g_var:
        if _mentions(p_side, g_var) or _mentions(g_side, p_var):
            return None
        p_side = _rename(p_side, p_var, g_var)
    return p_side, g_side


def _definition(node: Node) -> tuple[str, str, Node] | None:
    """(function name, variable or "", right side) of ``f(x) = ...`` or ``y = ...``."""
    if node.text != "=" or len(node.kids) != 2:
        return None
    left, side = node.kids
    if left.kind == "sym" and left.text == "y":
        return "y", "", side
    if left.kind == "call" and len(left.kids) == 1 and left.kids[0].kind == "sym":
        return left.text, left.kids[0].text, side
    return None


def _mentions(node: Node, name: str) -> bool:
    if node.kind in {"sym", "call"} and node.text == name:
        return True
    return any(_mentions(kid, name) for kid in node.kids)


def _rename(node: Node, old: str, new: str) -> Node:
    if node.kind == "sym" and node.text == old:
        return Node("sym", text=new)
    if not node.kids:
        return node
    kids = tuple(_rename(kid, old, new) for kid in node.kids)
    return Node(node.kind, kids, text=node.text, value=node.value)


def _kind(op: str) -> str:
    return "ineq" if op in _INEQUALITY else op


def _single(pred: Node, gold: Node, p_op: str, g_op: str) -> Outcome:
    from workers.verifier.symbolic import proportional

    if p_op != g_op:
        return Outcome(False, VerifyMethod.SYMBOLIC, "different strictness")
    same = proportional(pred.kids, gold.kids, positive=p_op in _INEQUALITY)
    return Outcome(same, VerifyMethod.SYMBOLIC, "" if same else "different relation")


def _chain(pred: Node, gold: Node, compare: Compare) -> Outcome:
    undecided = False
    for p, g in zip(pred.kids, gold.kids, strict=True):
        out = compare(p, g)
        if out.same is False:
            return Outcome(False, VerifyMethod.STRUCTURAL, "a side differs")
        undecided = undecided or out.same is None
    return Outcome(None if undecided else True, VerifyMethod.STRUCTURAL)


def closed_chain_answers(node: Node) -> tuple[Node, ...] | str | None:
    """The answers a closed ``=``/``\\approx`` chain asserts (see the module policy).

    Returns:
        The candidate answers (final side first), `FALSE_CHAIN` when the chain is
        false, or None when `node` is not a closed chain we can check.
    """
    ops = node.text.split(",")
    sides = node.kids
    if any(op not in {"=", "~"} for op in ops) or len(sides) != len(ops) + 1:
        return None
    if not all(_closed(side) for side in sides):
        return None
    if all(op == "=" for op in ops) and all(_literal(s) for s in sides[:-1]):
        return None  # `3 = 3`: no computation, a tautology
    values = [value for value in map(_value, sides) if value is not None]
    if len(values) != len(sides):
        return None
    for k, op in enumerate(ops):
        if not _holds(op, values[k], values[k + 1], sides[k], sides[k + 1]):
            return FALSE_CHAIN
    answers = [sides[-1]]
    if "~" in ops:
        exact = sides[ops.index("~")]
        if exact is not sides[-1]:
            answers.append(exact)
    return tuple(answers)


def _closed(node: Node) -> bool:
    if node.kind == "sym":
        return node.text in _CONSTANTS
    if node.kind not in _CLOSED_KINDS:
        return False
    return all(_closed(kid) for kid in node.kids)


def _literal(node: Node) -> bool:
    while node.kind == "neg":
        node = node.kids[0]
    return node.kind == "num"


def _value(node: Node) -> Fraction | None:
    exact = exact_value(node)
    if exact is not None:
        return exact
    from workers.verifier.symbolic import value_digits

    return value_digits(node, _EVAL_DIGITS)


def _holds(op: str, left: Fraction, right: Fraction, lhs: Node, rhs: Node) -> bool:
    """Whether `lhs op rhs` is true (values to 60 digits where irrational)."""
    places = decimal_places(rhs)
    rational = exact_value(lhs) is not None and exact_value(rhs) is not None
    if op == "=" and (rational or places is None):
        scale = max(Fraction(1), abs(left))
        return bool(abs(left - right) <= Fraction(1, 10**40) * scale)
    if places is None:
        places = 0 if _literal(rhs) else -1
    if places < 0:
        return False
    return bool(abs(left - right) * 2 * 10**places <= 1)
