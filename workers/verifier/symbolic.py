"""SymPy objects built directly from answer trees, and a bounded equality decision.

Imported lazily: integers, decimals and fractions never reach this module. Numeric
sampling is used only to *disprove* equality; equality needs an exact symbolic zero.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import sympy

from workers.verifier.nodes import Node, Refused

__all__ = ["equal", "to_sympy", "value_digits"]

MAX_OPS = 250
_SAMPLE_POINTS = (Fraction(7, 3), Fraction(-5, 11), Fraction(13, 17))
_FUNCS: dict[str, Any] = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "sec": sympy.sec,
    "csc": sympy.csc, "cot": sympy.cot, "arcsin": sympy.asin, "arccos": sympy.acos,
    "arctan": sympy.atan, "sinh": sympy.sinh, "cosh": sympy.cosh, "tanh": sympy.tanh,
    "ln": sympy.log, "exp": sympy.exp, "ceil": sympy.ceiling, "floor": sympy.floor,
}  # fmt: skip
_NAMED = {"pi": sympy.pi, "oo": sympy.oo, "e": sympy.E, "i": sympy.I}


def to_sympy(node: Node) -> Any:
    """Build a SymPy expression from a scalar tree (no text is parsed).

    Args:
        node: a scalar tree already checked by `values.exact_value` for bounds.

    Returns:
        A SymPy expression.

    Raises:
        Refused: the tree holds a structure or construct SymPy should not see.
    """
    kind = node.kind
    if kind == "num":
        value = node.value or Fraction(0)
        return sympy.Rational(value.numerator, value.denominator)
    if kind == "sym":
        return _NAMED.get(node.text) or sympy.Symbol(node.text)
    args = [to_sympy(k) for k in node.kids]
    return _build(node, args)


def _build(node: Node, args: list[Any]) -> Any:  # noqa: C901 - one flat dispatch table
    kind = node.kind
    if kind == "add":
        return sympy.Add(*args)
    if kind == "mul":
        return sympy.Mul(*args)
    if kind == "neg":
        return -args[0]
    if kind == "div":
        return args[0] / args[1]
    if kind == "pow":
        return sympy.Pow(args[0], args[1])
    if kind == "root":
        return sympy.root(args[0], args[1]) if len(args) > 1 else sympy.sqrt(args[0])
    if kind == "pct":
        return args[0] / 100
    if kind == "abs":
        return sympy.Abs(args[0])
    if kind == "fact":
        return sympy.factorial(args[0])
    if kind == "binom":
        return sympy.binomial(args[0], args[1])
    if kind == "fn" and node.text == "log":
        return sympy.log(*args) if len(args) > 1 else sympy.log(args[0])
    if kind == "fn" and node.text in _FUNCS:
        return _FUNCS[node.text](args[0])
    if kind == "call" and len(args) == 1:
        return sympy.Function(node.text)(args[0])
    raise Refused(f"{kind} in an expression")


def _is_zero_exactly(diff: Any) -> bool:
    if diff == 0:
        return True
    if sympy.count_ops(diff) > MAX_OPS:
        raise Refused("expression too large to simplify")
    if sympy.expand(diff) == 0:
        return True
    return bool(sympy.simplify(diff) == 0)


def _magnitude(value: Any) -> float:
    try:
        return abs(complex(value.evalf(15)))
    except (TypeError, ValueError):
        return 0.0


def _clearly_nonzero(diff: Any, a: Any, b: Any) -> bool:
    """|a - b| is above 1e-20 of the larger side, at 40 significant digits.

    Relative, not absolute: tiny values (pi / 2^99 against pi / 2^98) stay apart.
    """
    try:
        gap = abs(complex(diff.evalf(40)))
    except (TypeError, ValueError):
        return False
    return gap > 1e-20 * max(_magnitude(a), _magnitude(b))


def _disproved(a: Any, b: Any) -> bool:
    """True when a seeded numeric evaluation shows ``a - b`` is not identically zero."""
    diff = a - b
    symbols = sorted(diff.free_symbols, key=lambda s: s.name)
    if not symbols:
        return _clearly_nonzero(diff, a, b)
    for shift, point in enumerate(_SAMPLE_POINTS):
        subs = {
            s: sympy.Rational(point.numerator + i, point.denominator)
            for i, s in enumerate(symbols, start=shift)
        }
        value = diff.subs(subs)
        if value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            continue
        if _clearly_nonzero(value, a.subs(subs), b.subs(subs)):
            return True
    return False


def equal(left: Node, right: Node) -> bool | None:
    """Decide whether two scalar trees denote the same value or expression.

    Args:
        left: first tree (already bounds-checked).
        right: second tree.

    Returns:
        True (proved equal), False (proved different), None (could not decide).

    Raises:
        Refused: an expression is too large to simplify.
    """
    a, b = to_sympy(left), to_sympy(right)
    if a.has(sympy.oo) or b.has(sympy.oo):
        return bool(a == b)
    diff = a - b
    if diff == 0:
        return True
    if _disproved(a, b):
        return False
    if _is_zero_exactly(diff):
        return True
    # SymPy's assumptions prove some constants non-zero exactly (sqrt(2) + 10^-30).
    return False if diff.is_zero is False else None


def value_digits(node: Node, digits: int) -> Fraction | None:
    """`node` to `digits` significant digits as a Fraction, if real and finite."""
    expr = to_sympy(node)
    if expr.free_symbols or expr.has(sympy.oo, sympy.zoo, sympy.nan):
        return None
    value = expr.evalf(digits)
    if not value.is_real or not value.is_Number:
        return None
    return Fraction(str(value))


def proportional(
    pred: tuple[Node, ...], gold: tuple[Node, ...], *, positive: bool
) -> bool:
    """Whether ``lhs - rhs`` of two relations differ by a non-zero constant factor.

    Args:
        pred: the (lhs, rhs) of the predicted relation.
        gold: the (lhs, rhs) of the gold relation.
        positive: require a positive factor (inequalities keep their direction).

    Returns:
        True only when the factor is provably a constant; relations between numbers
        alone (``3 = 3``) are never proportional to anything.
    """
    a = to_sympy(pred[0]) - to_sympy(pred[1])
    b = to_sympy(gold[0]) - to_sympy(gold[1])
    if not a.free_symbols or not b.free_symbols or a == 0 or b == 0:
        return False
    if sympy.count_ops(a) + sympy.count_ops(b) > MAX_OPS:
        raise Refused("relation too large")
    ratio = sympy.cancel(a / b)
    if ratio.free_symbols:
        ratio = sympy.simplify(ratio)
    if ratio.free_symbols or ratio == 0 or not ratio.is_number:
        return False
    return bool(ratio > 0) if positive else ratio.is_real is True
