"""Exact rational evaluation of answer trees with size bounds (no floats, no SymPy).

`exact_value` returns a `Fraction` when the tree is a plain rational number, None when
it is not (symbols, irrational roots), and raises `Refused` when evaluating it would
exceed the bounds (power towers, huge factorials): the bound is checked before the work.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from fractions import Fraction

from workers.verifier.nodes import Node, Refused

__all__ = ["MAX_BITS", "decimal_places", "exact_value", "int_root"]

MAX_BITS = 20_000  # magnitude bound on any exact intermediate (about 6,000 digits)
MAX_FACTORIAL = 1_500
MAX_SYMBOLIC_EXPONENT = 200
_ROUNDING: dict[str, Callable[[Fraction], int]] = {
    "ceil": math.ceil,
    "floor": math.floor,
}


def exact_value(node: Node) -> Fraction | None:
    """The exact rational value of `node`, or None if it is not a rational number.

    Every subtree is visited (no short-circuit), so a bound violation anywhere refuses
    the whole answer even when a symbol makes the value non-rational.

    Args:
        node: a parsed answer tree.

    Returns:
        The value, or None (symbols, irrationals, division by zero, structures).

    Raises:
        Refused: an intermediate result would exceed `MAX_BITS` or another bound.
    """
    kind = node.kind
    if kind == "num":
        return node.value
    kids = [exact_value(k) for k in node.kids]
    if kind == "fn" and node.text == "exp":
        _check_exponent(node.kids[0], kids[0])
    if kind == "fn" and node.text in _ROUNDING and kids[0] is not None:
        return Fraction(_ROUNDING[node.text](kids[0]))
    if kind in {"sym", "text", "fn", "call"} or any(v is None for v in kids):
        if kind == "pow":
            _check_exponent(node.kids[1], kids[1])
        return None
    vals = [v for v in kids if v is not None]
    return _combine(kind, vals)


_UNARY: dict[str, Callable[[Fraction], Fraction]] = {
    "neg": operator.neg,
    "abs": abs,
    "pct": lambda v: v / 100,
}


def _combine(kind: str, vals: list[Fraction]) -> Fraction | None:
    if kind == "add":
        return _bounded(sum(vals, Fraction(0)))
    if kind == "mul":
        out = Fraction(1)
        for v in vals:
            out = _bounded(out * v)
        return out
    if kind in _UNARY:
        return _UNARY[kind](vals[0])
    if kind == "div":
        return None if vals[1] == 0 else _bounded(vals[0] / vals[1])
    if kind == "pow":
        return _power(vals[0], vals[1])
    if kind == "root":
        degree = vals[1] if len(vals) > 1 else Fraction(2)
        if degree.denominator != 1 or not 1 <= degree <= 64:
            return None
        return _power(vals[0], 1 / degree)
    if kind == "fact":
        return _factorial(vals[0])
    if kind == "binom":
        return _binom(vals[0], vals[1])
    return None


def _bounded(value: Fraction) -> Fraction:
    if value.numerator.bit_length() + value.denominator.bit_length() > MAX_BITS:
        raise Refused(f"exact value larger than {MAX_BITS} bits")
    return value


def _check_exponent(node: Node, exponent: Fraction | None) -> None:
    """A symbolic power or `\\exp` SymPy could take seconds or forever to decide:
    an exponent above `MAX_SYMBOLIC_EXPONENT`, or a tower (`\\exp(\\exp(100))`)."""
    if exponent is not None and abs(exponent) > MAX_SYMBOLIC_EXPONENT:
        raise Refused(f"symbolic power above {MAX_SYMBOLIC_EXPONENT}")
    if exponent is None and _has_exponential(node):
        raise Refused("nested exponential")


def _has_exponential(node: Node) -> bool:
    if node.kind == "fn" and node.text == "exp":
        return True
    if node.kind == "pow" and _no_rational_value(node.kids[1]):
        return True
    return any(_has_exponential(kid) for kid in node.kids)


def _no_rational_value(node: Node) -> bool:
    """Whether `node` has no rational value (a symbolic exponent, say)."""
    try:
        return exact_value(node) is None
    except Refused:
        return True


def _power(base: Fraction, exponent: Fraction) -> Fraction | None:
    if base == 0:
        return None if exponent <= 0 else Fraction(0)
    if base in {1, -1} and exponent.denominator == 1:
        return base**exponent.numerator
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    if abs(exponent) * size > MAX_BITS or abs(exponent.numerator) > MAX_BITS:
        raise Refused("power too large")
    if exponent.denominator == 1:
        return _bounded(base ** int(exponent))
    if base < 0 or exponent.denominator > 64:
        return None
    raised = base ** abs(exponent.numerator)
    top = int_root(raised.numerator, exponent.denominator)
    bottom = int_root(raised.denominator, exponent.denominator)
    if top is None or bottom is None:
        return None
    value = Fraction(top, bottom)
    return value if exponent > 0 else 1 / value


def int_root(value: int, degree: int) -> int | None:
    """The exact integer `degree`-th root of `value` >= 0, or None."""
    if degree == 2:
        root = math.isqrt(value)
        return root if root * root == value else None
    root = (
        round(value ** (1 / degree))
        if value.bit_length() < 1000
        else _nth_root(value, degree)
    )
    for guess in (root - 1, root, root + 1):
        if guess >= 0 and guess**degree == value:
            return guess
    return None


def _nth_root(value: int, degree: int) -> int:
    lo, hi = 0, 1 << (value.bit_length() // degree + 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid**degree <= value:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _factorial(n: Fraction) -> Fraction | None:
    if n.denominator != 1:
        # gamma of a non-integer: never an answer, and SymPy may take minutes on it
        raise Refused("factorial of a non-integer")
    if n < 0:
        return None
    if n > MAX_FACTORIAL:
        raise Refused(f"factorial above {MAX_FACTORIAL}")
    return Fraction(math.factorial(int(n)))


def _binom(n: Fraction, k: Fraction) -> Fraction | None:
    if n.denominator != 1 or k.denominator != 1:
        raise Refused("binomial of a non-integer")
    if abs(n) > 10 * MAX_FACTORIAL or abs(k) > 10 * MAX_FACTORIAL:
        raise Refused("binomial too large")
    if n < 0:
        return None
    return _bounded(Fraction(math.comb(int(n), int(k)))) if k >= 0 else Fraction(0)


def decimal_places(node: Node) -> int | None:
    """Digits after the point when `node` is a written decimal (``-0.33`` gives 2)."""
    if node.kind == "neg":
        return decimal_places(node.kids[0])
    if node.kind == "num" and "." in node.text:
        return len(node.text.split(".", 1)[1])
    return None
