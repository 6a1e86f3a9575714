"""Equations and inequalities: label equations, proportional equations, chains."""

from __future__ import annotations

from collections.abc import Callable

from workers.models import VerifyMethod
from workers.verifier.nodes import Node, render
from workers.verifier.outcome import Outcome
from workers.verifier.structures import reduce_chain

__all__ = ["compare_relations"]

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
    p_ops, g_ops = pred.text.split(","), gold.text.split(",")
    if len(p_ops) == 1 and len(g_ops) == 1 and _kind(p_ops[0]) == _kind(g_ops[0]):
        return _single(pred, gold, p_ops[0], g_ops[0])
    if p_ops == g_ops:
        return _chain(pred, gold, compare)
    return Outcome(False, VerifyMethod.STRUCTURAL, "different relations")


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
