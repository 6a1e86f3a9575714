"""When a written decimal counts as an exact value: float noise, and rounding.

Default (strict): an exact gold needs an exactly equal answer. Two exceptions:
float noise: a predicted decimal with at least `FLOAT_DIGITS` significant digits (what a
program prints for a binary float, ``2.0000000000000004``, ``0.3333333333333333``,
``0.8660254037844386``) matches the gold's value, rational or not, within a relative
`FLOAT_NOISE` (``0.333`` for 1/3 and ``3.14`` for pi are wrong); and a rounded *gold*
(r6): when the gold is a decimal showing 3+ decimals (``3.33333333``, ``0.577``,
``2.314814814815 \\times 10^{-3}``), an exact answer that rounds to it at the gold's
own precision is right (``\\frac{10}{3}``, ``\\frac{1}{432}``; see
`gold_rounding_match`), never a coarser decimal answer (``3.3``).

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

__all__ = ["float_noise_match", "gold_rounding_match", "rounded_match"]

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
# A decimal gold read as a rounding shows at least this many digits after its point.
MIN_GOLD_PLACES = 3


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
    pred: Node, gold: Node, p_val: Fraction | None, g_val: Fraction | None
) -> bool:
    """Whether `pred` is a float print of the gold's value (strict policy); an
    irrational gold is evaluated to 60 digits (``0.8660254037844386`` for
    ``\\frac{\\sqrt3}{2}``)."""
    if p_val is None or p_val == g_val:
        return p_val is not None
    if decimal_places(pred) is None or _significant_digits(pred) < FLOAT_DIGITS:
        return False
    exact = g_val if g_val is not None else _evaluate(gold)
    return exact is not None and abs(p_val - exact) <= FLOAT_NOISE * abs(exact)


def gold_rounding_match(
    pred: Node, gold: Node, p_val: Fraction | None, g_val: Fraction | None
) -> bool:
    """Whether the exact `pred` rounds to the decimal gold at the gold's precision.

    The gold is a written decimal (``3.33333333``) or one in scientific notation
    (``2.314814814815 \\times 10^{-3}``) showing at least `MIN_SIGNIFICANT`
    significant digits and `MIN_GOLD_PLACES` digits after its point (a short gold
    such as ``12.5`` or ``0.33`` is as likely exact as rounded: ``\\sqrt{156}``
    is not ``12.5``);
    the answer is exact, not a decimal, with no finite decimal expansion (as in the
    rounded policy: ``\\frac{1}{8}`` must equal its gold). A fraction p/q counts
    only when the gold shows more significant digits than q has: a gold as long as
    q may be an exact decimal of another number (``0.\\overline{35625}`` is
    11875/33333, not gold ``.35625``). ``3.3`` for gold ``3.33333333`` stays wrong:
    an answer's decimal is never rounded to the gold.
    """
    written = _written_decimal(gold)
    if written is None or decimal_places(pred) is not None or _is_scientific(pred):
        return False
    shown, exponent, significant, places = written
    if significant < MIN_SIGNIFICANT or places < MIN_GOLD_PLACES:
        return False  # `12.5`, `0.33`: as likely an exact value as a rounding
    if p_val is not None and (
        _terminates(p_val) or p_val.denominator >= 10 ** (significant - 1)
    ):
        return False  # `\\frac{1}{8}`, or a gold with no more digits than q needs
    exact = p_val if p_val is not None else _evaluate(pred)
    if exact is None:
        return False
    return bool(abs(exact - shown) * 2 * Fraction(10) ** exponent <= 1)


def _written_decimal(node: Node) -> tuple[Fraction, int, int, int] | None:
    """(value, decimal exponent of its last digit, significant digits, digits after
    the point as written) of a written decimal or a decimal times a power of ten;
    None otherwise."""
    sign = 1
    if node.kind == "neg":
        node, sign = node.kids[0], -1
    scale = 0
    if _is_scientific(node):
        node, power = node.kids
        exponent = power.kids[1]
        negative = exponent.kind == "neg"
        literal = exponent.kids[0] if negative else exponent
        if literal.value is None or literal.value.denominator != 1:
            return None
        scale = -int(literal.value) if negative else int(literal.value)
    places = decimal_places(node)
    if places is None or node.value is None:
        return None
    value = sign * node.value * Fraction(10) ** scale
    return value, places - scale, _significant_digits(node), places


def _is_scientific(node: Node) -> bool:
    """`D \\times 10^{k}` with D a written decimal and k an integer literal."""
    if node.kind != "mul" or len(node.kids) != 2 or node.text:
        return False
    mantissa, power = node.kids
    if decimal_places(mantissa) is None or power.kind != "pow":
        return False
    base, exponent = power.kids
    if exponent.kind == "neg":
        exponent = exponent.kids[0]
    return base.kind == "num" and base.value == 10 and exponent.kind == "num"


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
