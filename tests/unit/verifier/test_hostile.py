"""Hostile corpus: every input returns a Verdict in under 1 s and executes nothing.

Each input is graded as a raw response, inside a box, as the gold, and against
itself. Code payloads try to create a canary file in a temporary working directory;
an audit hook also records any process spawn or any open of the canary path.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.models import Verdict
from workers.verifier import grade, grade_answer

# CPU seconds, not wall: a complexity guard (a quadratic scan of 1 MB takes minutes)
# that must not fail because other processes share the machine.
MAX_SECONDS_PER_ITEM = 1.0
CANARY = "CANARY"

_MATRIX_ROW = " & ".join(["1"] * 1000)
_MATRIX = "\\begin{pmatrix}" + " \\\\ ".join([_MATRIX_ROW] * 1000) + "\\end{pmatrix}"

HOSTILE: dict[str, str] = {
    # --- power towers and huge exponents -------------------------------------
    "tower-dfrac": r"\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}",
    "tower-9": "9^{9^{9^9}}",
    "tower-2": "2^{2^{2^{2^{2^{2^{2}}}}}}",
    "tower-python": "2**2**2**2**2**2**2",
    "tower-flat-carets": "9^9^9^9",
    "tower-e": "e^{e^{e^{e^{10}}}}",
    "exp-10-10-10": "10^{10^{10}}",
    "exp-10-999999999": "10^{999999999}",
    "exp-negative-tower": "10^{-10^{10}}",
    "exp-symbolic": "x^{10^{10^{10}}}",
    "exp-sqrt": r"\sqrt{2}^{10^{100}}",
    "exp-limit": "(1+10^{-100})^{10^{100}}",
    "exp-float-overflow": "1e999999999",
    "exp-float-underflow": "1e-999999999",
    "exp-unicode-superscript": "2⁹⁹⁹⁹⁹⁹⁹⁹⁹",
    "exp-times-ten": r"3\times10^{999999999}",
    # --- factorials, sums, products, integrals -------------------------------
    "factorial-100000": "100000!",
    "factorial-power": "(10^{10})!",
    "factorial-nested": "((10!)!)!",
    "factorial-multi": "9!!!!!!!!!!!!",
    "gamma": r"\Gamma(10^{10})",
    "sum-huge": r"\sum_{k=1}^{10^{10}} k",
    "prod-huge": r"\prod_{k=1}^{10^{9}} k",
    "sum-infinite": r"\sum_{n=1}^{\infty} \frac{1}{n^2}",
    "integral": r"\int_0^{10^{10}} x^{x}\,dx",
    "binom-huge": r"\binom{10^{10}}{5\cdot 10^{9}}",
    # non-integer factorials and binomials, exp towers: SymPy ran past 60 s (issue 13)
    "binom-half-huge": r"\binom{0.5}{33827135797}",
    "factorial-decimal-ratio": r"-91677237683782.8736!/0.0001!",
    "factorial-half": r"12345.5!",
    "exp-fn-tower": r"\exp(\exp(\exp(100)))",
    "mod-tower": r"2^{2^{100}} \bmod 7",
    # --- nesting ---------------------------------------------------------------
    "braces-5000": "{" * 5000 + "1" + "}" * 5000,
    "parens-5000": "(" * 5000 + "1" + ")" * 5000,
    "brackets-5000-open": "[" * 5000,
    "sqrt-2000": "\\sqrt{" * 2000 + "2" + "}" * 2000,
    "frac-1000": "\\frac{1}{" * 1000 + "2" + "}" * 1000,
    "minus-10000": "-" * 10000 + "1",
    "boxed-nested-1000": "\\boxed{" * 1000 + "1" + "}" * 1000,
    # --- sizes -----------------------------------------------------------------
    "digits-1mb": "1" * 1_000_000,
    "letters-1mb": "x" * 1_000_000,
    "sum-1mb": "1+" * 500_000 + "1",
    "digits-100k": "9" * 100_000,
    "decimal-100k": "0." + "3" * 100_000,
    "tiny-decimal": "0." + "0" * 100_000 + "1",
    "matrix-1000x1000": _MATRIX,
    "boxes-2000": "\\boxed{1} " * 2000,
    "boxed-open-10000": "\\boxed{" * 10000,
    "closers-10000": "}" * 10000,
    # --- issue 37 (r6) scans: chains, stray closers, markers, units, subscripts --
    "chain-sentence-100k": "<answer> " + "1 + " * 25_000 + "1 = 25001 </answer>",
    "chain-parens-open": "So " + "(" * 5000 + "2 * 3 = 6 apples.",
    "chain-many-equals": "x " + "= 1 + 1 " * 5000 + "= 2",
    "chain-huge-numbers": "9" * 500 + " * " + "9" * 500 + " = 1 cows.",
    "stray-closers-10000": "Answer: 5\n" + "</think> </answer> <" * 10000,
    "hashes-10000": "8 " + "#### " * 10000 + "8",
    "units-tail-1000": "5" + " \\text{ m}^{-2}" * 1000,
    "condition-tail": "x = 1" + ", \\quad \\text{for } x" * 1000,
    "subscript-nested": "E_{" + "\\widetilde{" * 500 + "1" + "}" * 501 + " = 2",
    "ceil-nested": "\\lceil " * 3000 + "2.5" + " \\rceil" * 3000,
    "set-builder-deep": "\\{x \\mid " * 2000 + "x > 1" + "\\}" * 2000,
    "clock-like-10000": "1:" * 10000 + "00",
    "mixed-number-huge": "9" * 400 + " " + "1" * 30 + "/" + "9" * 30,
    "primes-10000": "f" + "'" * 10000,
    "repeated-value-prose": "<answer> " + "we got 47 apples and " * 5000 + "</answer>",
    "final-answer-colon": "**Final Answer**\n\nIt is:\n\n$$" + "x+" * 100_000,
    # --- code payloads -----------------------------------------------------------
    "import-os": f"__import__('os').system('touch {CANARY}')",
    "lambda": f"lambda: open('{CANARY}', 'w')",
    "exec": f"exec(\"open('{CANARY}', 'w')\")",
    "eval": f"eval(\"__import__('os').system('touch {CANARY}')\")",
    "subclasses": "().__class__.__bases__[0].__subclasses__()",
    "open-write": f"open('{CANARY}', 'w').write('x')",
    "builtins": f"__builtins__.open('{CANARY}', 'w')",
    "statement": f"import os; os.system('touch {CANARY}')",
    "getattr": f"getattr(__import__('os'), 'system')('touch {CANARY}')",
    "text-payload": f"\\text{{__import__('os').system('touch {CANARY}')}}",
    "sympify-payload": f"sympify(\"open('{CANARY}', 'w')\")",
    "breakpoint": "breakpoint()",
    "globals": "globals()['__builtins__']",
    # --- SymPy-special names -------------------------------------------------
    "sympy-symbol": "Symbol('x')",
    "sympy-function": "Function('f')(x)",
    "sympy-lambda": "Lambda(x, x**2)",
    "sympy-evalf": "pi.evalf(10**9)",
    "sympy-N": "N(pi, 10**9)",
    "sympy-consts": "oo + zoo + nan + E**(I*pi)",
    "sympy-matrix": "Matrix([[1, 2], [3, 4]]) ** 10**9",
    "sympy-dunder": "x.__class__.__mro__",
    # --- unicode tricks ---------------------------------------------------------
    "rtl-override": "\u202e5\u202c",
    "zero-width-joiner": "1\u200d2\u200b3",
    "fullwidth-digits": "１２３",
    "homoglyph-e": "x^2+е",
    "bom": "\ufeff5",
    "combining": "5\u0301",
    "math-bold-digit": "𝟓",
    "nul": "5\x00",
    "lone-surrogate": "\ud800",
    # --- undefined values ---------------------------------------------------------
    "div-zero": r"\frac{1}{0}",
    "zero-zero": "0^0",
    "inf-minus-inf": r"\infty - \infty",
    "log-zero": r"\log(0)",
}


def _roles() -> Iterator[tuple[str, str]]:
    for name in HOSTILE:
        for role in ("response", "boxed", "gold", "both", "answer"):
            yield name, role


def _run(name: str, role: str) -> Verdict:
    text = HOSTILE[name]
    calls: dict[str, Callable[[], Verdict]] = {
        "response": lambda: grade(text, "5"),
        "boxed": lambda: grade(f"The answer is \\boxed{{{text}}}.", "5"),
        "gold": lambda: grade("\\boxed{5}", text),
        "both": lambda: grade(text, text),
        "answer": lambda: grade_answer(text, "5"),
    }
    return calls[role]()


_SPAWN_EVENTS = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork")
_audit: dict[str, Any] = {"armed": False, "events": []}


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    if not _audit["armed"]:
        return
    spawned = event.startswith(_SPAWN_EVENTS) or event == "subprocess.Popen"
    opened = event == "open" and args and CANARY in str(args[0])
    if spawned or opened:
        _audit["events"].append(event)


sys.addaudithook(_audit_hook)  # permanent by design; inert unless armed


@pytest.fixture(scope="module", autouse=True)
def _warm_grader() -> None:
    """Import SymPy once up front: a one-off import is not per-input work."""
    grade("\\boxed{x^2+2x+1}", "(x+1)^2")


def test_hostile_corpus_is_big_enough() -> None:
    assert len(HOSTILE) >= 50


@pytest.mark.parametrize(
    ("name", "role"), list(_roles()), ids=[f"{n}-{r}" for n, r in _roles()]
)
def test_hostile_input_returns_verdict_fast_and_runs_nothing(
    name: str, role: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given: an empty working directory where payloads would drop the canary
    monkeypatch.chdir(tmp_path)
    _audit["events"] = []
    _audit["armed"] = True
    # When: the hostile input is graded
    try:
        started = time.process_time()
        verdict = _run(name, role)
        elapsed_s = time.process_time() - started
    finally:
        _audit["armed"] = False
    # Then: a verdict, quickly, and nothing executed
    assert isinstance(verdict, Verdict)
    assert elapsed_s < MAX_SECONDS_PER_ITEM, f"{elapsed_s:.3f} s"
    assert not (tmp_path / CANARY).exists()
    assert _audit["events"] == []
