"""Canonicalization: normalized text and the canonical trees of equivalent forms."""

from __future__ import annotations

import pytest

from workers.verifier.nodes import Refused, render
from workers.verifier.normalize import normalize
from workers.verifier.parse import parse_text


def canon(text: str) -> str:
    return render(parse_text(normalize(text)))


# --- string-level normalization ------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (r"\$1,234.5", "1234.5"),
        ("(0,1)", "(0,1)"),
        (r"1{,}234", "1234"),
        (r"1\,234", "1234"),
        (r"11,\! 111,\! 111,\! 100", "11111111100"),
        ("1 000", "1000"),
        ("7,425,000", "7425000"),
        (r"\{1,234\}", r"\{1,234\}"),
        ("x²", "x^{2}"),
        ("０.５", "0.5"),
        (r"90^\circ", r"90 \circ"),  # kept: an angle (compare reads it two ways)
        (r"f \circ g", "f g"),  # composition, not a degree
        (r"\left( 3, \frac{\pi}{2} \right)", r"( 3, \frac{\pi}{2} )"),
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\tfrac12", r"\frac12"),
        (r"0.\overline{3}", r"{\frac{1}{3}}"),
        (r"2.\overline{12}", r"{\frac{70}{33}}"),
        ("5.", "5"),
        ("\x0crac{1}{2}", r"\frac{1}{2}"),
        (r"\\left( 1, 2 \\right)", "( 1, 2 )"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_normalize_rewrites(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


# --- equivalent surface forms share one canonical tree -------------------------
@pytest.mark.parametrize(
    ("forms", "expected"),
    [
        (
            [r"\frac{1}{2}", r"\dfrac{1}{2}", r"\tfrac{1}{2}", r"\frac12", "1/2"],
            "(div 1 2)",
        ),
        (
            [r"\left(\frac{14}{3}\right)", r"$\frac{14}{3}$", r"\frac{14}{3}"],
            "(div 14 3)",
        ),
        ([r"2\frac{1}{2}", r"2\dfrac12"], "(add 2 (div 1 2))"),
        (["25%", r"25\%", "25 percent", "25 pct"], "(pct 25)"),
        (["3e5", "3E5"], "300000"),
        (["x²", "x^2", "x^{2}"], "(pow x 2)"),
        (["√2", r"\sqrt{2}", r"\sqrt2", r"\sqrt 2"], "(root 2)"),
        (["π", r"\pi"], "pi"),
        (["∞", r"\infty"], "oo"),
        (["3×4", r"3\times 4", r"3\cdot4"], "(mul 3 4)"),
        (["−5", "-5"], "(neg 5)"),
        (["１２", "12"], "12"),
        ([r"5\text{ cm}", "5 cm", r"5\mbox{ cm}^2", "10 inches"[:0] + "5 inches"], "5"),
        ([r"\$18.90", "18.90"], "18.90"),
        ([r"\text{odd}", "odd", r"\textbf{odd}"], '"odd"'),
        (["B", "(B)", r"\text{(B)}", r"\textbf{B}"], "B"),
        ([r"\mathrm{e}", "e"], "e"),
        ([r"x \ge 2", r"2 \le x", "2 <= x", "x ≥ 2"], "(rel:<= 2 x)"),
        ([r"1 \pm \sqrt{19}", "1 ± √19"], "(pm 1 (root 19))"),
        (
            [
                r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
                r"\begin{bmatrix}1 & 2 \\ 3 & 4\end{bmatrix}",
            ],
            "(matrix (row 1 2) (row 3 4))",
        ),
        (["204_5", "204_{5}"], "(based 204 5)"),
        ([r"\binom{5}{2}", r"\dbinom{5}{2}"], "(binom 5 2)"),
        (["n!"], "(fact n)"),
        ([r"\log_2 8", r"\log_{2}(8)"], "(fn:log 8 2)"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_normalize_equivalent_forms_share_canonical_tree(
    forms: list[str], expected: str
) -> None:
    assert {canon(f) for f in forms} == {expected}


# --- structures keep their shape -------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("(0,1)", "(pair 0 1)"),
        ("[0,1)", "(interval:[) 0 1)"),
        ("(1,2,3)", "(tuple:() 1 2 3)"),
        (r"\{1,2\}", "(set 1 2)"),
        ("1, 2", "(list 1 2)"),
        ("6 and 8", "(list 6 8)"),
        (r"(-\infty, 0] \cup (1, 2)", "(union (interval:(] (neg oo) 0) (pair 1 2))"),
        ("x = 5", "(rel:= x 5)"),
        (r"x \in [-2,7]", "(rel:in x (interval:[] (neg 2) 7))"),
        ("3+4i", "(add 3 (mul 4 i))"),
        (r"\text{The midpoints form a hexagon}", '"the midpoints form a hexagon"'),
        ("The largest n is 34", "34"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_normalize_structures(text: str, expected: str) -> None:
    assert canon(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "__import__(os)",
        "lambda: 1",
        r"\input{/etc/passwd}",
        r"\int_0^1 x dx",
        "1e999999",
        "9" * 500,
        "x y " * 400,
        "{" * 100 + "}" * 100,
    ],
    ids=lambda v: repr(v)[:20],
)
def test_normalize_refuses_outside_whitelist(text: str) -> None:
    with pytest.raises((Refused, RecursionError)):
        parse_text(normalize(text))
