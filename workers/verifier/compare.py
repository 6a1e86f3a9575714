"""Compare a predicted answer tree with a gold one: exact, numeric, structure, SymPy.

Cheapest first: identical canonical renderings, then exact rational arithmetic, then
structures element by element, and SymPy (imported lazily) only for what is left.

Policies:
    Percent: a value written with ``%`` has two readings, its value (``25%`` = 1/4) and
    the number before the sign (a "what percent" question answered "25"). A side with
    ``%`` matches the other side under either reading, so ``25%`` matches gold ``25``,
    ``0.25`` and ``1/4``, and ``25`` or ``0.25`` match gold ``25%``. Without a ``%``
    on either side, ``25`` and ``0.25`` are different numbers.
    Rounded decimals: strict by default (float noise aside, and an exact answer that
    rounds to a decimal gold showing 3+ decimals); rounding tolerance only with
    ``approximate``. See `workers.verifier.rounding`. A gold written as a true
    closed chain (``\\frac{\\sqrt3}{3} \\approx 0.577``) accepts any side it asserts.
    Labels: ``x = 5`` answers gold ``5`` (and gold ``x = 5`` accepts ``5``) only when
    the left side names a quantity; ``3 = 3`` is a relation and matches no value.
    An answer's left side may also be a function of a label or a sum of labels
    (``\\tan A = 2``, ``a + b + c = 20``); a gold's may not (``x + y = 5`` is a line).
    One function under two names (``y = 2x + 3``, ``f(x) = 2x + 3``; ``f(z) = z``,
    ``f(x) = x``) compares right sides (see `relations`).
    Assignments repeating their labels in one order (``p=5,q=2;p=7,q=2``) answer
    the list of tuples ``(5,2),(7,2)``.
    Collections: tuples are ordered; sets and bare comma lists are unordered. A
    gold list that repeats a part (``1, 1, 2``: roots with multiplicity) is a
    multiset and needs every repeat (``1, 2`` is wrong); otherwise repeats in the
    answer add nothing and count once (a solution listed twice, as Math-Verify);
    a gold set always ignores repeats. A list against one value is
    right only when every part equals it (one answer restated in two forms).
    ``(a, b)`` is a point or an open interval, never ``[a, b]``.
    Decimal comma: a bare ``2,74`` (no space, not a thousands group; ``0,111`` is
    never 111) is a list of two numbers or the decimal 2.74; against a single value
    either reading may match, against a collection only the list reading counts.
    Degrees: an angle written in degrees (``30^\\circ``) has two readings, its number
    (gold ``30``) and its radians (gold ``\\frac{\\pi}{6}``); ``150^\\circ`` is not
    ``\\frac{\\pi}{6}``, and a bare ``\\frac{\\pi}{6}`` answers gold ``30^\\circ``.
    Choices and text: one capital letter is a choice (``B`` = ``(B)`` = ``\text{(B)}``);
    text answers compare case-insensitively word by word.
"""

from __future__ import annotations

from fractions import Fraction

from workers.models import VerifyMethod
from workers.verifier.nodes import Node, Refused, num, render
from workers.verifier.outcome import Outcome
from workers.verifier.parse_atoms import DEGREES
from workers.verifier.rounding import (
    float_noise_match,
    gold_rounding_match,
    rounded_match,
)
from workers.verifier.structures import (
    MAX_PARTS,
    as_interval,
    expand_pm,
    has_repeats,
    is_choice,
    matrix_value,
    regroup_assignments,
    strip_label,
    unordered,
)
from workers.verifier.values import exact_value

__all__ = ["Outcome", "compare"]

_ORDERED = frozenset({"pair", "tuple"})
_UNORDERED = frozenset({"set", "list"})
_INTERVALS = frozenset({"interval", "union"})
GOLD_ROUNDED = "the exact answer rounds to the decimal gold at its precision"


def compare(
    pred: Node,
    gold: Node,
    *,
    rel_tol: float,
    approximate: bool = False,
    keys: tuple[str, str] | None = None,
) -> Outcome:
    """Decide whether `pred` answers `gold`.

    Args:
        pred: the predicted answer tree.
        gold: the gold answer tree.
        rel_tol: relative tolerance for a rounded decimal against an exact value
            (used only with `approximate`).
        approximate: apply the rounded-decimal policy (off: exact values only).
        keys: the canonical renderings of (pred, gold) when already known.

    Returns:
        The outcome; ``same=None`` means we cannot decide (reported as unsupported).

    Raises:
        Refused: a bound was hit while deciding.
    """
    same = keys[0] == keys[1] if keys is not None else render(pred) == render(gold)
    if same:
        return Outcome(True, VerifyMethod.EXACT, "identical canonical form")
    comparer = _Comparer(rel_tol, approximate=approximate)
    if _is_plain_number(pred) and _is_plain_number(gold):
        return comparer.scalar(pred, gold)
    return comparer.run(pred, gold)


class _Comparer:
    def __init__(self, rel_tol: float, *, approximate: bool) -> None:
        self.rel_tol = rel_tol
        self.approximate = approximate

    def run(self, pred: Node, gold: Node) -> Outcome:
        pred, gold = _unwrap_membership(pred), _unwrap_membership(gold)
        if not _has_relation(gold):
            pred = strip_label(regroup_assignments(pred), answer=True)
        if not _has_relation(pred):
            gold = strip_label(regroup_assignments(gold))
        return self.any_form(pred, gold)

    def any_form(self, pred: Node, gold: Node) -> Outcome:
        """Try the alternative readings of percent and ± before comparing."""
        pred_forms, gold_forms = _readings(pred, gold), _readings(gold, pred)
        last = Outcome(False, VerifyMethod.NONE)
        for p in pred_forms:
            for g in gold_forms:
                out = self.node(p, g)
                if out.same:
                    return out
                if last.same is False:
                    last = out
        return last

    def node(self, pred: Node, gold: Node) -> Outcome:
        if render(pred) == render(gold):
            return Outcome(True, VerifyMethod.EXACT)
        if gold.kind == "text" or pred.kind == "text":
            return Outcome(False, VerifyMethod.TEXT, "text answers differ")
        if is_choice(gold) or is_choice(pred):
            return Outcome(False, VerifyMethod.CHOICE, "different choice")
        if gold.kind == "rel" or pred.kind == "rel":
            return self.relation(pred, gold)
        if gold.kind == "based" or pred.kind == "based":
            return _based(pred, gold)
        if _is_structure(gold) or _is_structure(pred):
            return self.structure(pred, gold)
        return self.scalar(pred, gold)

    # -- structures -------------------------------------------------------------
    def structure(self, pred: Node, gold: Node) -> Outcome:
        if pred.kind == "list" and not pred.text and not _is_structure(gold):
            return self.restated(pred.kids, gold)
        if gold.kind == "ratio" or pred.kind == "ratio":
            if gold.kind != pred.kind:
                return Outcome(
                    False, VerifyMethod.STRUCTURAL, "ratio against non-ratio"
                )
            return self.ordered(pred.kids, gold.kids)
        if gold.kind in _INTERVALS or pred.kind in _INTERVALS:
            return self.intervals(pred, gold)
        p_mat, g_mat = matrix_value(pred), matrix_value(gold)
        if p_mat is not None and g_mat is not None:
            return self.matrix(p_mat, g_mat)
        if gold.kind == "matrix" or pred.kind == "matrix":
            return self.matrix(pred, gold)
        if gold.kind in _ORDERED and pred.kind in _ORDERED | _UNORDERED:
            return self.ordered(pred.kids, gold.kids)
        if gold.kind in _UNORDERED and pred.kind in _ORDERED | _UNORDERED:
            return self.unordered(pred, gold)
        return Outcome(False, VerifyMethod.STRUCTURAL, "different kinds of answer")

    def restated(self, parts: tuple[Node, ...], gold: Node) -> Outcome:
        """A list against one value: right only if every part is that value.

        (`15\frac{39}{40}, \frac{639}{40}`: one answer in two forms.)
        """
        if len(parts) > MAX_PARTS:
            raise Refused(f"more than {MAX_PARTS} parts")
        results = [self.any_form(part, gold).same for part in parts]
        if all(results):
            return Outcome(True, VerifyMethod.STRUCTURAL, "every part is the answer")
        if False in results:
            return Outcome(False, VerifyMethod.STRUCTURAL, "different kinds of answer")
        return Outcome(None, VerifyMethod.STRUCTURAL)

    def ordered(self, pred: tuple[Node, ...], gold: tuple[Node, ...]) -> Outcome:
        if len(pred) != len(gold):
            return Outcome(False, VerifyMethod.STRUCTURAL, "different number of parts")
        undecided = False
        for p, g in zip(pred, gold, strict=True):
            out = self.any_form(p, g)
            if out.same is False:
                return Outcome(False, VerifyMethod.STRUCTURAL, "a part differs")
            undecided = undecided or out.same is None
        return Outcome(None if undecided else True, VerifyMethod.STRUCTURAL)

    def unordered(self, pred: Node, gold: Node) -> Outcome:
        multiset = gold.kind != "set" and has_repeats(gold.kids)
        same = unordered(
            pred.kids,
            gold.kids,
            lambda p, g: self.any_form(p, g).same,
            multiset=multiset,
        )
        return Outcome(same, VerifyMethod.STRUCTURAL, "" if same else "parts differ")

    def intervals(self, pred: Node, gold: Node) -> Outcome:
        p_parts, g_parts = as_interval(pred), as_interval(gold)
        if p_parts is None or g_parts is None:
            return Outcome(
                False, VerifyMethod.STRUCTURAL, "interval against non-interval"
            )

        def same_interval(p: Node, g: Node) -> bool | None:
            if p.text != g.text:
                return False
            return self.ordered(p.kids, g.kids).same

        same = unordered(p_parts, g_parts, same_interval)
        return Outcome(
            same, VerifyMethod.STRUCTURAL, "" if same else "intervals differ"
        )

    def matrix(self, pred: Node, gold: Node) -> Outcome:
        p_rows = _matrix_rows(pred)
        g_rows = _matrix_rows(gold)
        if p_rows is None or g_rows is None or len(p_rows) != len(g_rows):
            return Outcome(False, VerifyMethod.STRUCTURAL, "shapes differ")
        if any(len(a) != len(b) for a, b in zip(p_rows, g_rows, strict=True)):
            return Outcome(False, VerifyMethod.STRUCTURAL, "shapes differ")
        flat_p = tuple(c for row in p_rows for c in row)
        flat_g = tuple(c for row in g_rows for c in row)
        return self.ordered(flat_p, flat_g)

    # -- relations --------------------------------------------------------------
    def relation(self, pred: Node, gold: Node) -> Outcome:
        from workers.verifier.relations import (
            closed_chain_answers,
            compare_relations,
        )

        if pred.kind != "rel" or gold.kind != "rel":
            if _is_interval_like(pred) or _is_interval_like(gold):
                return self.intervals(pred, gold)
            answers = closed_chain_answers(pred) if pred.kind == "rel" else None
            if isinstance(answers, str):
                return Outcome(False, VerifyMethod.STRUCTURAL, answers)
            if answers is not None:
                return self.chain_answer(answers, gold)
            golds = closed_chain_answers(gold) if gold.kind == "rel" else None
            if isinstance(golds, tuple):  # `\\frac{\\sqrt3}{3} \\approx 0.577`
                return self.chain_gold(pred, golds)
            return Outcome(False, VerifyMethod.STRUCTURAL, "relation against value")
        return compare_relations(pred, gold, self.any_form)

    def chain_answer(self, answers: tuple[Node, ...], gold: Node) -> Outcome:
        """A true closed chain: correct when one of its asserted answers is."""
        undecided = False
        for answer in answers:
            out = self.any_form(answer, gold)
            if out.same:
                return Outcome(
                    True, out.method, "a side asserted by a true closed chain"
                )
            undecided = undecided or out.same is None
        reason = "" if undecided else "final side of the chain differs"
        return Outcome(None if undecided else False, VerifyMethod.STRUCTURAL, reason)

    def chain_gold(self, pred: Node, golds: tuple[Node, ...]) -> Outcome:
        """A gold written as a true closed chain (`\\frac{\\sqrt3}{3} \\approx
        0.577`): the answer may be its final side or its exact side."""
        undecided = False
        for gold in golds:
            out = self.any_form(pred, gold)
            if out.same:
                return Outcome(True, out.method, "a side the gold's chain asserts")
            undecided = undecided or out.same is None
        reason = "" if undecided else "no side of the gold's chain"
        return Outcome(None if undecided else False, VerifyMethod.STRUCTURAL, reason)

    # -- scalars ----------------------------------------------------------------
    def scalar(self, pred: Node, gold: Node) -> Outcome:
        p_val, g_val = exact_value(pred), exact_value(gold)
        if p_val is not None and g_val is not None:
            if p_val == g_val:
                return Outcome(True, VerifyMethod.NUMERIC, "equal exact values")
            return self.rounded(pred, gold, p_val, g_val)
        if pred.kind == "sym" and gold.kind == "sym":
            return Outcome(False, VerifyMethod.EXACT, "different symbols")
        rounded = self.rounded(pred, gold, p_val, g_val)
        if rounded.same:
            return rounded
        from workers.verifier.symbolic import equal

        return Outcome(equal(pred, gold), VerifyMethod.SYMBOLIC)

    def rounded(
        self, pred: Node, gold: Node, p_val: Fraction | None, g_val: Fraction | None
    ) -> Outcome:
        if not self.approximate:
            if gold_rounding_match(pred, gold, p_val, g_val):
                return Outcome(True, VerifyMethod.NUMERIC, GOLD_ROUNDED)
            same = float_noise_match(pred, gold, p_val, g_val)
            reason = "float noise of the exact value" if same else "different values"
            return Outcome(same, VerifyMethod.NUMERIC, reason)
        same = rounded_match(pred, gold, p_val, g_val, rel_tol=self.rel_tol)
        reason = "rounded decimal within policy" if same else "different values"
        return Outcome(same, VerifyMethod.NUMERIC, reason)


def _has_relation(node: Node) -> bool:
    """A relation, or a list holding one: labels there are part of the answer."""
    if node.kind == "list":
        return any(k.kind == "rel" for k in node.kids)
    return node.kind == "rel"


def _is_plain_number(node: Node) -> bool:
    """A literal, a negated literal or a quotient of literals (the common answers)."""
    if node.kind == "neg":
        node = node.kids[0]
    if node.kind == "div":
        return all(k.kind == "num" for k in node.kids)
    return node.kind == "num"


def _readings(node: Node, other: Node) -> list[Node]:
    if node.kind == "pct":
        return [node, node.kids[0]]
    if node.kind == "mul" and node.text == DEGREES:
        return [node.kids[0], node]  # 30 degrees: the number 30, or pi/6 radians
    if _has_degrees(node):
        return [_without_degrees(node), node]
    if node.text.startswith("comma:") and not _is_structure(other):
        return [node, _decimal(node.text.removeprefix("comma:"))]
    expanded = expand_pm(node)
    return [node] if expanded is None else [expanded]


def _has_degrees(node: Node) -> bool:
    if node.kind == "mul" and node.text == DEGREES:
        return True
    if node.kind in _ORDERED | _UNORDERED or node.kind == "fn":
        return False  # parts are read one by one; a trig argument stays radians
    return any(map(_has_degrees, node.kids))


def _without_degrees(node: Node) -> Node:
    """`node` with every angle in degrees read as its number (`180^\\circ - x`);
    inside a function (`\\sin 30^\\circ`) a degree stays pi/180."""
    if node.kind == "mul" and node.text == DEGREES:
        return node.kids[0]
    if not node.kids or node.kind == "fn":
        return node
    kids = tuple(_without_degrees(kid) for kid in node.kids)
    return Node(node.kind, kids, text=node.text, value=node.value)


def _decimal(literal: str) -> Node:
    """The number a decimal-comma literal (`-2.74`, from `-2,74`) denotes."""
    digits = literal.lstrip("-")
    node = num(Fraction(digits), digits)
    return Node("neg", (node,)) if literal.startswith("-") else node


def _unwrap_membership(node: Node) -> Node:
    if node.kind == "rel" and node.text == "in" and len(node.kids) == 2:
        return node.kids[1]
    return node


def _is_structure(node: Node) -> bool:
    if node.kind in _ORDERED | _UNORDERED | _INTERVALS | {"matrix", "ratio"}:
        return True
    return node.kind in {"add", "mul"} and any(k.kind == "matrix" for k in node.kids)


def _is_interval_like(node: Node) -> bool:
    return node.kind in _INTERVALS or node.kind == "pair"


def _matrix_rows(node: Node) -> list[tuple[Node, ...]] | None:
    if node.kind == "matrix":
        rows = [r.kids for r in node.kids]
        if all(len(r) == 1 for r in rows) and len(rows) > 1:
            return [tuple(r[0] for r in rows)]
        return rows
    if node.kind in _ORDERED:
        return [node.kids]
    return None


def _based(pred: Node, gold: Node) -> Outcome:
    def digits(node: Node) -> tuple[str, str]:
        if node.kind == "based":
            return render(node.kids[0]), render(node.kids[1])
        return render(node), ""

    (p_digits, p_base), (g_digits, g_base) = digits(pred), digits(gold)
    same = p_digits == g_digits and (not p_base or not g_base or p_base == g_base)
    return Outcome(same, VerifyMethod.EXACT, "" if same else "different numeral")
