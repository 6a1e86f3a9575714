"""The public API: statuses, format vs answer, fallback, decision keys, safety."""

from __future__ import annotations

import doctest
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import workers.verifier as verifier
from workers.models import ExtractionMethod, GradeOptions, Status, Verdict, VerifyMethod
from workers.verifier import GRADER_VERSION, decide, grade, grade_answer, prepare
from workers.verifier.pipeline import _parse_gold_cached


def test_grade_public_names() -> None:
    assert set(verifier.__all__) == {
        "GRADER_VERSION", "Prepared", "decide", "grade", "grade_answer", "prepare",
        "verdict_from", "identical_never_wrong",
    }  # fmt: skip


def test_grade_docstring_example_runs() -> None:
    failures, tried = doctest.testmod(verifier, verbose=False)
    assert tried >= 1
    assert failures == 0


def test_grade_version_names_sympy_without_importing_it() -> None:
    assert GRADER_VERSION.startswith("gradefleet-")
    assert "+sympy-1.14.0" in GRADER_VERSION


# --- statuses ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("response", "gold", "status", "format_valid"),
    [
        (r"so \boxed{4}", "4", Status.CORRECT, True),
        (r"so \boxed{5}", "4", Status.WRONG, True),
        ("Therefore the result is 4.", "4", Status.CORRECT, False),
        (r"\boxed{}", "4", Status.NO_ANSWER, False),
        ("I cannot solve this.", "4", Status.NO_ANSWER, False),
        ("", "4", Status.NO_ANSWER, False),
        (r"so \boxed{\int_0^1 x\,dx}", "1/2", Status.UNSUPPORTED, True),
        (r"so \boxed{4}", "", Status.INVALID_GOLD, True),
        (r"so \boxed{4}", r"\unknowncommand{4}", Status.INVALID_GOLD, True),
        (r"<answer>30</answer>", "30", Status.CORRECT, True),
    ],
)
def test_grade_statuses(
    response: str, gold: str, status: Status, format_valid: bool
) -> None:
    verdict = grade(response, gold)
    assert verdict.status is status, verdict.reason
    assert verdict.format_valid is format_valid
    assert verdict.correct is (status is Status.CORRECT)
    assert verdict.grader_version == GRADER_VERSION


def test_grade_verdict_fields_and_json() -> None:
    verdict = grade(r"The answer is $\boxed{\dfrac{1}{2}}$.", "0.5")
    assert verdict.extracted == r"\dfrac{1}{2}"
    assert verdict.extraction_method is ExtractionMethod.BOXED
    assert verdict.canonical_pred == "(div 1 2)"
    assert verdict.canonical_gold == "0.5"
    assert verdict.verify_method is VerifyMethod.NUMERIC
    assert Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict


def test_grade_answer_skips_extraction() -> None:
    assert grade_answer("x = 5", "5").correct
    empty = grade_answer("   ", "5")
    assert empty.status is Status.NO_ANSWER
    assert empty.extraction_method is ExtractionMethod.NONE


def test_grade_gold_forms() -> None:
    assert grade(r"\boxed{18}", "#### 18").correct
    assert grade(r"\boxed{18}", r"So she pays $\boxed{18}$ dollars.").correct
    assert grade(r"\boxed{\frac{1}{2}}", r"$\frac{1}{2}$").correct


# --- allow_fallback -------------------------------------------------------------
def test_grade_fallback_not_credited_when_disallowed() -> None:
    strict = GradeOptions(allow_fallback=False)
    fallback = grade("Therefore the result is 4.", "4", options=strict)
    assert fallback.status is Status.NO_ANSWER
    assert not fallback.correct
    assert fallback.extracted == "4"
    assert grade(r"\boxed{4}", "4", options=strict).correct


def test_grade_decision_key_depends_on_fallback() -> None:
    boxed = prepare(r"\boxed{4}", "4")
    phrase = prepare("Therefore the result is 4.", "4")
    assert boxed.decision_key is not None
    assert phrase.decision_key is not None
    assert boxed.decision_key != phrase.decision_key


# --- decision keys ----------------------------------------------------------------
def test_grade_equal_keys_mean_equal_decisions() -> None:
    responses = [
        r"so \boxed{\frac{1}{2}}", r"hence $\boxed{\dfrac12}$.", r"\boxed{1/2}",
        r"\boxed{0.5}", r"\boxed{0.50}", r"\boxed{2}", r"\boxed{x}",
    ]  # fmt: skip
    by_key: dict[str, dict[str, object]] = {}
    for response in responses:
        prepared = prepare(response, "1/2")
        verdict = decide(prepared).to_dict()
        for field in ("extracted", "extraction_method", "format_valid", "cached"):
            verdict.pop(field)
        assert prepared.decision_key is not None
        by_key.setdefault(prepared.decision_key, verdict)
        assert by_key[prepared.decision_key] == verdict
    assert len(by_key) >= 4  # 1/2 forms share a key; 0.5 and 0.50 do not


def test_grade_decision_key_is_json_of_its_parts_for_any_text() -> None:
    # ASCII answers keep the key the stdlib wrote; other text gets a key of its own,
    # lone surrogates included (orjson refuses them, the stdlib escapes them)
    stdlib = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))
    texts = ["\\boxed{7}", "\\boxed{\\frac{1}{2}}", "\\boxed{é}", "\\boxed{\\ud800}"]
    texts += ["\\boxed{\ud800}", "\\boxed{\udfff}", "\\boxed{\\u00e9}"]
    keys = []
    for text in texts:
        key = prepare(text, "7").decision_key
        assert key is not None
        parts = json.loads(key)  # valid JSON: answer, gold, fallback
        assert len(parts) == 3
        if text.isascii():
            assert key == stdlib.encode(parts)
        keys.append(key)
    assert len(set(keys)) == len(texts)


def test_grade_no_answer_is_not_cached() -> None:
    assert prepare("no answer here", "1").decision_key is None


def test_grade_prepare_does_not_import_sympy_for_symbols() -> None:
    # prepare is pure string work; parsing an expression builds our own tree only.
    prepared = prepare(r"\boxed{x^2+1}", "x^2+1")
    assert prepared.canonical_pred == "(add (pow x 2) 1)"


def test_grade_gold_parse_is_cached() -> None:
    _parse_gold_cached.cache_clear()
    for _ in range(5):
        grade(r"\boxed{3}", r"\frac{6}{2}")
    grade(r"\boxed{3}", "3" + " " * 20_000)  # long golds bypass the cache
    info = _parse_gold_cached.cache_info()
    assert info.misses == 1
    assert info.hits == 4


# --- never raises -------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80), st.text(max_size=40))
def test_grade_never_raises(response: str, gold: str) -> None:
    verdict = grade(response, gold)
    assert verdict.status is not Status.ERROR, verdict.reason


_ALPHABET = st.sampled_from(
    [*"0123456789+-*/^_()[]{},.=<>!|%&x ", r"\frac", r"\sqrt", r"\pi", r"\pm",
    r"\cup", r"\left(", r"\right)", r"\infty", r"\begin{pmatrix}", r"\end{pmatrix}",
    r"\\", r"\text{", "i", "e"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_ALPHABET, max_size=30), st.lists(_ALPHABET, max_size=12))
@example(pred=[], gold=[r"\frac", ".", "0"])  # found by this test: `\frac.0` raised
def test_grade_latex_soup_never_errors(pred: list[str], gold: list[str]) -> None:
    verdict = grade_answer("".join(pred), "".join(gold) or "1")
    assert verdict.status is not Status.ERROR, verdict.reason


# Found by fuzzing: a number token starting with "." after a command or a subscript.
@pytest.mark.parametrize(
    "text", [r"\frac.0", r"\binom.20", r"0_.2", r"\dfrac.2y", "x_.5"]
)
def test_grade_leading_dot_numbers_after_commands_are_not_errors(text: str) -> None:
    assert grade_answer(text, "1").status is not Status.ERROR
    assert grade_answer("1", text).status is not Status.ERROR
