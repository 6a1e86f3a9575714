"""Answer and format as separate verdict fields: seed 001's 24 fixed cases (6
normalization, 10 verification, 8 end-to-end).

The seed judges answer and format separately: `correct` and `format_valid` are two
fields, and "no answer" is distinct from "an answer we do not support".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.models import ExtractionMethod, Status
from workers.verifier import grade, grade_answer

# --- normalization (6): each pair must share one canonical form ------------------
NORMALIZATION = [
    (r"\dfrac{2}{4}", r"\frac{2}{4}", "(div 2 4)"),
    (r"\sqrt{9}", "sqrt9".replace("sqrt", r"\sqrt"), "(root 9)"),
    ("2^3", "2^{3}", "(pow 2 3)"),
    ("1,000", "1000", "1000"),
    (r"\left(\frac{14}{3}\right)", r"$\frac{14}{3}$", "(div 14 3)"),
    (r"\text{odd}", "odd", '"odd"'),
]


@pytest.mark.parametrize(("left", "right", "canonical"), NORMALIZATION)
def test_seed001_normalization(left: str, right: str, canonical: str) -> None:
    a, b = grade_answer(left, right), grade_answer(right, left)
    assert a.canonical_pred == b.canonical_pred == canonical
    assert a.correct
    assert b.correct


# --- verification (10): equivalence or explicit refusal --------------------------
VERIFICATION = [
    (r"\frac{2}{6}", "1/3", Status.CORRECT),
    ("x+x", "2*x", Status.CORRECT),
    (r"\dfrac{1}{2}", "0.5", Status.CORRECT),
    ("(1,2,3)", "(1,2)", Status.WRONG),  # different part count
    ("(1, 2)", "[1,2]", Status.WRONG),  # the seed accepts; issue #2: point != interval
    # rounded gold, exact answer: wrong under r5's strict default (issue 10); r6
    # (issue 37) reads a decimal gold as a rounding the exact answer must round to
    (r"\sqrt{2}", "1.41421356", Status.CORRECT),
    ("__import__(os)", "4", Status.UNSUPPORTED),  # never executed
    (r"\sin(0)", "0", Status.CORRECT),  # the seed refuses \sin; our whitelist has it
    (r"\int_0^1 x dx", "1/2", Status.UNSUPPORTED),  # outside the whitelist
    ("x", "y", Status.WRONG),
]


@pytest.mark.parametrize(("answer", "gold", "status"), VERIFICATION)
def test_seed001_verification(answer: str, gold: str, status: Status) -> None:
    verdict = grade_answer(answer, gold)
    assert verdict.status is status, verdict.reason


def test_seed001_import_payload_executes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    payloads = [
        "__import__('os').system('touch CANARY')",
        r"\boxed{__import__('os').system('touch CANARY')}",
        "open('CANARY', 'w').write('x')",
    ]
    for payload in payloads:
        assert grade(payload, "4").status in {Status.UNSUPPORTED, Status.NO_ANSWER}
        assert grade_answer(payload, payload).status is Status.INVALID_GOLD
    assert not (tmp_path / "CANARY").exists()


# --- end to end (8): response -> (correct, format_valid, status) -----------------
END_TO_END = [
    (r"Draft \boxed{5}; corrected \boxed{7}.", "7", True, True, Status.CORRECT),
    ("Therefore the result is 4.", "4", True, False, Status.CORRECT),
    (r"Final attempt: \boxed{4", "4", True, False, Status.CORRECT),
    (r"\boxed{5}", "4", False, True, Status.WRONG),
    ("I have no idea.", "4", False, False, Status.NO_ANSWER),
    (r"The answer is \boxed{\int_0^1 x\,dx}", "1/2", False, True, Status.UNSUPPORTED),
    (r"So $x = \boxed{\frac{2}{6}}$", r"\frac13", True, True, Status.CORRECT),
    (r"\boxed{__import__(os)}", "4", False, True, Status.UNSUPPORTED),
]


@pytest.mark.parametrize(
    ("response", "gold", "correct", "format_valid", "status"), END_TO_END
)
def test_seed001_end_to_end(
    response: str, gold: str, correct: bool, format_valid: bool, status: Status
) -> None:
    verdict = grade(response, gold)
    assert (verdict.correct, verdict.format_valid, verdict.status) == (
        correct,
        format_valid,
        status,
    ), verdict.reason


def test_seed001_corrected_answer_wins_and_boxes_never_merge() -> None:
    verdict = grade(r"Draft \boxed{5}; corrected \boxed{7}.", "5")
    assert verdict.extracted == "7"
    assert verdict.status is Status.WRONG
    assert verdict.extraction_method is ExtractionMethod.BOXED


def test_seed001_counts_24_cases() -> None:
    assert len(NORMALIZATION) + len(VERIFICATION) + len(END_TO_END) == 24
