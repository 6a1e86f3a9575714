"""When a written decimal counts as an exact value: float noise, and rounding.

Default (strict): an exact gold needs an exactly equal answer. The one exception is
float noise: a predicted decimal with at least `FLOAT_DIGITS` significant digits (what a
program prints for a binary float, ``2.0000000000000004``, ``0.3333333333333333``)
matches a *rational* gold within a relative `FLOAT_NOISE` (``0.333`` for 1/3, ``3.14``
for pi and the repeating ``0.(35625)`` for ``.35625`` are wrong; a float for an
irrational gold is an approximation, not noise).

With ``GradeOptions(approximate=True)`` the rounded-decimal policy applies: let one
side be a written decimal D with d >= 1 digits after the point and the other side an
exact value X that has no finite decimal expansion (1/3, sqrt(2), pi; if X
terminates, like 1/8 = 0.125, D must equal it exactly). D matches X when it shows at
least 3 significant digits, or 2 significant digits and 2 decimals (the usual "to the
nearest hundredth"), and |D - X| <= 0.5 * 10**-d (X correctly rounded to the digits
shown): ``3.14``, ``0.33`` and ``31.4`` (10 pi) count; ``3.1`` for pi and ``0.3`` for
1/3 are too coarse to reward. When D is the *prediction*, |D - X| <= rel_tol * |X| also
matches; a rounded *gold* is held to its own digits (an exact 1/3 does not match gold
``0.333333333333333314829616256247``). Two written decimals must be equal exactly. All
arithmetic is exact (Fraction); irrational X is evaluated to 60 significant digits.
"""

from __future__ import annotations

from fractions import Fraction

from workers.verifier.nodes import Node
from workers.verifier.values import decimal_places

__all__ = ["float_noise_match", "rounded_match"]

# A binary double prints with 15 to 17 significant digits; its rounding error relative
# to the value it stands for is below 2**-52 (about 2.2e-16). Sums of a few floats
# accumulate a few of those; 1e-12 keeps a wide margin and is still far finer than any
# decimal a person writes by hand.
FLOAT_DIGITS = 15
FLOAT_NOISE = Fraction(1, 10**12)
_EVAL_DIGITS = 60
MIN_SIGNIFICANT = 3
# ... or this many significant digits with at least `MIN_PLACES` decimals.
MIN_SIGNIFICANT_AT_PLACES = 2
MIN_PLACES = 2


def rounded_match(
    pred: Node,
    gold: Node,
    p_val: Fraction | None,
    g_val: Fraction | None,
    *,
    rel_tol: float,
) -> bool:
    """Apply the rounded-decimal policy (see the module docstring).

    Args:
        pred: predicted tree.
        gold: gold tree.
        p_val: exact value of `pred` if rational.
        g_val: exact value of `gold` if rational.
        rel_tol: relative tolerance from `GradeOptions`.

    Returns:
        True when one side is a decimal rounding of the other under the policy.
    """
    p_places, g_places = decimal_places(pred), decimal_places(gold)
    if (p_places is None) == (g_places is None):
        return False
    if p_places is not None:
        places, shown, other, other_val = p_places, p_val, gold, g_val
    else:
        places, shown, other, other_val = g_places or 0, g_val, pred, p_val
    if shown is None:
        return False
    exact = other_val if other_val is not None else _evaluate(other)
    if exact is None:
        return False
    if other_val is not None and _terminates(other_val):
        return False
    error = abs(shown - exact)
    written = pred if p_places is not None else gold
    if _fine_enough(_significant_digits(written), places) and (
        error * 2 * 10**places <= 1
    ):
        return True
    return p_places is not None and error <= Fraction(rel_tol) * abs(exact)


def float_noise_match(
    pred: Node, p_val: Fraction | None, g_val: Fraction | None
) -> bool:
    """Whether `pred` is a float print of the rational gold `g_val` (strict policy)."""
    if p_val is None or g_val is None or p_val == g_val:
        return p_val is not None and p_val == g_val
    if decimal_places(pred) is None or _significant_digits(pred) < FLOAT_DIGITS:
        return False
    return abs(p_val - g_val) <= FLOAT_NOISE * abs(g_val)


def _fine_enough(significant: int, places: int) -> bool:
    if significant >= MIN_SIGNIFICANT:
        return True
    return significant >= MIN_SIGNIFICANT_AT_PLACES and places >= MIN_PLACES


def _evaluate(node: Node) -> Fraction | None:
    from workers.verifier.symbolic import value_digits

    return value_digits(node, _EVAL_DIGITS)


def _significant_digits(node: Node) -> int:
    while node.kind == "neg":
        node = node.kids[0]
    digits = node.text.replace(".", "").lstrip("0")
    return len(digits)


def _terminates(value: Fraction) -> bool:
    """Whether `value` has a finite decimal expansion (denominator 2^a 5^b)."""
    den = value.denominator
    for prime in (2, 5):
        while den % prime == 0:
            den //= prime
    return den == 1
