"""Comparison via `grade_answer`: equivalences, near misses, policies, bounds, speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from workers.models import GradeOptions, Status
from workers.verifier import grade_answer

# (answer, gold) pairs that must be correct.
EQUIVALENT = [
    # --- numbers ---
    ("5", "5"), ("5.0", "5"), ("05", "5"), ("5.000", "5.0"), (".5", "0.5"),
    ("-0.5", r"-\frac12"), ("1000", "1,000"), ("1234", r"1{,}234"), ("1234", r"1\,234"),
    ("10000", r"10{,}000"), ("7425000", "7,425,000"),
    # --- fractions ---
    (r"\frac{14}{3}", "14/3"), (r"\dfrac{28}{6}", "14/3"), (r"\tfrac{1}{2}", "0.5"),
    (r"\frac34", "0.75"), ("(28)/(6)", r"\frac{14}{3}"), (r"2\frac{1}{2}", "5/2"),
    (r"-2\frac{1}{2}", "-2.5"),
    # --- percent (see test_compare_percent_policy) ---
    (r"25\%", "1/4"), ("25%", "0.25"), ("50%", r"\frac12"),
    # --- scientific notation ---
    ("3e5", "300000"), (r"3\times10^5", "300000"), (r"3\cdot 10^{5}", "3e5"),
    ("1.5e-3", "0.0015"),
    # --- roots, powers, constants ---
    (r"\sqrt{9}", "3"), (r"\sqrt[3]{8}", "2"), (r"2\sqrt{2}", r"\sqrt{8}"),
    ("√2", r"\sqrt{2}"), ("x²", "x^2"), ("2^{10}", "1024"),
    (r"\frac{\pi}{2}", r"\pi/2"), ("2^10", "1024"), (r"\sqrt 19", r"\sqrt{19}"),
    (r"\frac{3}{4}\text{ of the cake}", "0.75"), (r"3\mathrm{e}", "3e"),
    ("π", r"\pi"), (r"e^{2}", r"\mathrm{e}^2"), ("∞", r"\infty"), ("2×3", "6"),
    ("−5", "-5"), ("１２", "12"), (r"0.\overline{3}", r"\frac13"),
    # --- degrees, units, currency, wrappers ---
    (r"90^\circ", "90"), ("90°", r"90^\circ"), (r"5\text{ cm}", "5"),
    (r"\$18.90", "18.9"),
    ("10 inches", "10"), (r"864 \mbox{ inches}^2", "864"), (r"\textbf{7}", "7"),
    (r"\left( \frac{1}{3} \right)", "1/3"), (r"\mathrm{5}", "5"),
    # --- choices and text ---
    ("B", r"\text{(B)}"), ("(B)", "B"), (r"\text{(C)}", "C"), ("odd", r"\text{odd}"),
    ("Even", r"\text{even}"),
    # --- structures ---
    ("(0,1)", "(0, 1)"), ("(1, 4.5)", r"(1,\frac{9}{2})"), (r"\{1,2\}", r"\{2,1\}"),
    ("1, 2", "2, 1"), ("6 and 8", "6,8"), ("[-1, 2)", r"[-1,2)"),
    (r"(-\infty, 2) \cup (3, \infty)", r"(3,\infty)\cup(-\infty,2)"),
    (r"\begin{bmatrix}1&2\\3&4\end{bmatrix}",
     r"\begin{pmatrix}1&2\\3&4\end{pmatrix}"),
    (r"\begin{pmatrix}1\\2\end{pmatrix}", "(1,2)"),
    (r"\{1+\sqrt{5}, 1-\sqrt{5}, -2\}", r"\{1\pm\sqrt{5},-2\}"),
    (r"1+\sqrt{19}, 1-\sqrt{19}", r"1 \pm \sqrt{19}"),
    # --- equations and inequalities ---
    ("x = 5", "5"), ("5", "x=5"), ("2x+1=y", "y=2x+1"), (r"x \ge 2", r"2 \le x"),
    ("-x > -1", "x < 1"), (r"x \in [-2,7]", r"-2 \le x \le 7"), ("(2, 5)", "2 < x < 5"),
    ("x = 1/3 \\approx 0.33", "1/3"), ("(p,q) = (3,2)", "(3,2)"),
    ("n = 2, k = 45", "k = 45, n = 2"), ("x = 2, x = 3", "3, 2"),
    # --- complex and symbolic ---
    ("4i+3", "3+4i"), ("x^2+2x+1", "(x+1)^2"), (r"\sec^2 y", r"\tan^2 y + 1"),
    (r"\frac{x}{7}+\frac{2}{7}", r"\frac{x+2}{7}"), (r"\log_2 8", "3"),
    (r"\ln(e^2)", "2"), (r"\binom{5}{2}", "10"), ("5!", "120"), (r"\sin(0)", "0"),
    ("2\\sqrt{13}", "\\sqrt{52}"),
]  # fmt: skip

# (answer, gold) pairs that must NOT be correct.
NEAR_MISSES = [
    (r"\frac{1}{2^{99}}", r"\frac{1}{2^{98}}"),  # tiny values never collapse to zero
    ("2^{100}", "2^{100}+1"),
    (r"\frac{\pi}{2^{99}}", r"\frac{\pi}{2^{98}}"),
    (r"\sqrt{2} + 10^{-30}", r"\sqrt{2}"),
    ("50", "5000"),
    ("(1,2)", "[1,2]"),  # a point / open interval is not a closed interval
    ("[1,2]", "(1,2)"),
    ("3 = 3", "3"),  # a tautology proves nothing
    ("1 = 1", "3"),
    ("1 = 1", "y = 2x + 1"),
    ("(2,1)", "(1,2)"),  # tuples are ordered
    ("(1,2,3)", "(1,2)"),
    (r"\frac{14}{3}", r"\frac{15}{3}"),
    ("0.3", r"\frac13"),  # one significant digit is not a rounding of 1/3
    ("0.34", r"\frac13"),
    ("0.13", r"\frac18"),  # 1/8 = 0.125 is exactly writable: must be exact
    ("x > -1", "x < 1"),
    (r"x \le 5", "x < 5"),
    ("A", "B"),
    ("d", r"\text{E}"),
    ("even", "odd"),
    ("2021", r"\pm 2021"),
    (r"(0,1]", "(0,1)"),
    ("x^2+2x", "(x+1)^2"),
    ("3-4i", "3+4i"),
    ("5", "-5"),
    ("1.0001", "1"),
    ("204", "205_5"),
    ("n = 45, k = 2", "k = 45, n = 2"),  # labels in a list are part of the answer
    ("a = 1", "b = 1"),
]

APPROXIMATE = GradeOptions(approximate=True)


@pytest.mark.parametrize(("answer", "gold"), EQUIVALENT, ids=lambda v: repr(v)[:28])
def test_compare_equivalent_forms_are_correct(answer: str, gold: str) -> None:
    verdict = grade_answer(answer, gold)
    assert verdict.status is Status.CORRECT, verdict.reason
    assert verdict.correct


@pytest.mark.parametrize(("answer", "gold"), NEAR_MISSES, ids=lambda v: repr(v)[:28])
def test_compare_near_misses_are_not_correct(answer: str, gold: str) -> None:
    verdict = grade_answer(answer, gold)
    assert not verdict.correct
    assert verdict.status in {Status.WRONG, Status.UNSUPPORTED}


def test_compare_near_misses_are_wrong_not_unsupported() -> None:
    for answer, gold in NEAR_MISSES:
        assert grade_answer(answer, gold).status is Status.WRONG, (answer, gold)


# --- the rounded-decimal policy (workers/verifier/rounding.py) ---------------------
@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        ("0.33", r"\frac13", True),  # correctly rounded to hundredths
        ("0.333", r"\frac13", True),
        ("0.3333", r"\frac13", True),
        ("0.6667", r"\frac23", True),
        ("0.6666", r"\frac23", False),  # truncated, off by more than half a unit
        ("3.14", r"\pi", True),
        ("3.15", r"\pi", False),
        ("1.41", r"\sqrt2", True),
        ("4.123105625617661", r"\sqrt{17}", True),
        ("0.0833333333333333", r"\frac{1}{12}", True),
        ("0.3", r"\frac13", False),  # too few significant digits
        ("0.125", r"\frac18", True),  # exact
        ("0.13", r"\frac18", False),  # gold writable with 2 decimals would be 0.125
        ("7.78", r"\frac{70}{9}", True),
        ("7.77", r"\frac{70}{9}", False),
        ("0.50", "0.5", True),  # two decimals compare exactly
        ("0.51", "0.5", False),
        ("8", "7.78", False),
    ],
)
def test_compare_rounded_decimal_policy_under_approximate(
    answer: str, gold: str, correct: bool
) -> None:
    assert grade_answer(answer, gold, options=APPROXIMATE).correct is correct


# --- the strict default: exact values only, float noise aside ------------------------
@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        ("0.33", r"\frac13", False),
        ("0.3333", r"\frac13", False),
        ("3.14", r"\pi", False),
        # r6: float noise of an irrational gold (15+ digits, 1e-12 relative)
        ("3.14159265358979", r"\pi", True),
        ("3.1415926535897", r"\pi", False),  # 14 digits: a rounding, not noise
        ("1.41", r"\sqrt2", False),
        # r6: a rounded gold accepts the exact value at the gold's precision
        (r"\sqrt2", "1.41421356", True),
        (r"\sqrt2", "1.41421357", False),
        (r"\frac{10}{3}", "3.33333333", True),
        ("3.3", "3.33333333", False),  # the answer is held to the gold's digits
        ("3.333", "3.33333333", False),
        (r"\frac{1}{432}", r"2.314814814815 \times 10^{-3}", True),
        (r"\frac{1}{431}", r"2.314814814815 \times 10^{-3}", False),
        (r"\frac{10}{3}", "3.3", False),  # too coarse a gold to read as a rounding
        (r"\sqrt2", "1.41", False),  # two decimals: maybe exact, not read as rounded
        (r"\sqrt2", "1.414", True),
        (r"\frac18", "0.13", False),  # a terminating value must equal its gold
        (r"0.\overline{35625}", ".35625", False),  # a different number
        ("0.125", r"\frac18", True),
        ("0.50", "0.5", True),
        ("2.0000000000000004", "2", True),  # float noise (16+ significant digits)
        ("0.30000000000000004", "0.3", True),
        ("0.3333333333333333", r"\frac13", True),  # the double nearest 1/3
        ("0.0833333333333333", r"\frac{1}{12}", True),
        ("0.33333333333333", r"\frac13", False),  # 14 digits: a rounding, not noise
        ("2.000000000001", "2", False),
        ("1.0000000001", "1", False),
    ],
)
def test_compare_strict_default(answer: str, gold: str, correct: bool) -> None:
    assert grade_answer(answer, gold).correct is correct


def test_compare_rel_tol_widens_decimal_matches() -> None:
    # 0.3334 is not 1/3 correctly rounded, but is within 2e-4 relative.
    wide = GradeOptions(approximate=True, rel_tol=1e-3)
    assert not grade_answer("0.3334", r"\frac13", options=APPROXIMATE).correct
    assert grade_answer("0.3334", r"\frac13", options=wide).correct
    assert not grade_answer("1.1", "1", options=wide).correct
    # rel_tol alone changes nothing: the strict default has no tolerance
    loose = GradeOptions(rel_tol=1e-3)
    assert not grade_answer("0.3334", r"\frac13", options=loose).correct


# --- the percent policy ---------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        (r"25\%", "25", True),  # "%" read as a unit: 25% answers "what percent? 25"
        (r"25\%", r"\frac14", True),  # ... or as its value 1/4
        ("25", r"25\%", True),
        ("0.25", r"25\%", True),
        ("1/4", r"25\%", True),
        (r"25\%", r"25\%", True),
        ("25", "0.25", False),  # no percent sign on either side: plain numbers
        (r"2.5\%", r"25\%", False),
        ("2500", r"25\%", False),
        (r"50\%", "5000", False),
    ],
)
def test_compare_percent_policy(answer: str, gold: str, correct: bool) -> None:
    assert grade_answer(answer, gold).correct is correct


# --- bounds: refused in milliseconds, inside grade itself --------------------------
@pytest.mark.parametrize(
    "answer",
    [
        r"\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}",
        "9^{9^{9^9}}",
        "100000!",
        "10^{10^{10}}",
        "x^{10^{10}}",
        "1" * 100_000,
        "(" * 5000 + "1" + ")" * 5000,
        "{" * 5000 + "1" + "}" * 5000,
        r"\frac{1}{" * 3000 + "1" + "}{2}" * 3000,
        r"\begin{pmatrix}" + r"\\".join(["&".join(["1"] * 30)] * 30) + r"\end{pmatrix}",
        "1e999999999",
        r"\binom{10^{9}}{5}",
    ],
    ids=lambda v: repr(v)[:24],
)
def test_compare_refuses_unbounded_inputs_fast(answer: str) -> None:
    start = time.perf_counter()
    verdict = grade_answer(answer, "4")
    elapsed_s = time.perf_counter() - start
    assert verdict.status is Status.UNSUPPORTED, verdict.reason
    assert elapsed_s < 0.2


def test_compare_huge_but_bounded_values_stay_exact() -> None:
    assert grade_answer("2^{1000}", str(2**1000)).correct
    assert not grade_answer("2^{1000}", str(2**1000 + 1)).correct
    assert grade_answer("1000!", "1000!").correct


# --- SymPy stays out of the numeric path --------------------------------------------
def test_compare_plain_numbers_never_import_sympy() -> None:
    code = (
        "import sys\n"
        "from workers.verifier import grade, grade_answer\n"
        "assert grade_answer('1/2', '0.5').correct\n"
        "assert grade_answer(r'\\frac{3}{4}', '0.75').correct\n"
        "assert grade(r'so \\boxed{12}', '12').correct\n"
        "assert not grade_answer('7', '1,234').correct\n"
        "print('sympy' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_compare_is_deterministic_across_hash_seeds() -> None:
    code = (
        "import json\n"
        "from workers.verifier import grade_answer\n"
        "pairs = [(r'\\{3,1,2\\}', r'\\{1,2,3\\}'), ('x^2+2x+1', '(x+1)^2'),"
        " ('1,2', '2,1'), (r'\\sec^2 y', r'\\tan^2 y+1'), (r'\\{1,3\\}', '(3,1)')]\n"
        "print(json.dumps([grade_answer(a, g).to_dict() for a, g in pairs]))\n"
    )
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env,
            check=True,
        )  # fmt: skip
        outputs.add(run.stdout)
    assert len(outputs) == 1
    assert [v["correct"] for v in json.loads(outputs.pop())] == [
        True, True, True, True, False,
    ]  # fmt: skip


def test_compare_is_thread_safe() -> None:
    pairs = [(a, g) for a, g in EQUIVALENT[:40]] + NEAR_MISSES
    expected = [grade_answer(a, g).to_dict() for a, g in pairs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(3):
            got = list(pool.map(lambda p: grade_answer(p[0], p[1]).to_dict(), pairs))
            assert got == expected
