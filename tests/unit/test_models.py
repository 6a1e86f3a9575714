"""Verdict <-> dict: every enum value round-trips; unknown values are a ValueError."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from workers.models import (
    VERDICT_FIELDS,
    ExtractionMethod,
    Status,
    Verdict,
    VerifyMethod,
    build_verdict,
)


def test_models_verdict_round_trips_every_enum_value():
    for status, extraction, verify in itertools.product(
        Status, ExtractionMethod, VerifyMethod
    ):
        verdict = Verdict(
            correct=status is Status.CORRECT,
            status=status,
            format_valid=True,
            extracted="1",
            extraction_method=extraction,
            verify_method=verify,
            reason="r",
            grader_version="v",
            cached=True,
        )
        back = Verdict.from_dict(verdict.to_dict())
        assert back == verdict
        assert type(back.status) is Status
        assert type(back.extraction_method) is ExtractionMethod
        assert type(back.verify_method) is VerifyMethod


def test_models_verdict_fast_builds_build_what_the_constructor_builds() -> None:
    # Given a verdict whose every field holds a value no other field holds
    verdict = Verdict(
        correct=True,
        status=Status.CORRECT,
        format_valid=True,
        extracted="extracted",
        extraction_method=ExtractionMethod.BOXED,
        canonical_pred="pred",
        canonical_gold="gold",
        verify_method=VerifyMethod.SYMBOLIC,
        reason="reason",
        grader_version="version",
        cached=True,
    )
    # Then reading its dict back gives every field in its place: an equal,
    # equally hashed, still frozen verdict
    values = [getattr(verdict, f) for f in VERDICT_FIELDS]
    for back in (Verdict.from_dict(verdict.to_dict()), build_verdict(*values)):
        assert [getattr(back, f) for f in VERDICT_FIELDS] == values
        assert back == verdict
        assert hash(back) == hash(verdict)
        with pytest.raises(dataclasses.FrozenInstanceError):
            back.reason = "changed"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("status", "maybe"),
        ("status", 1),
        ("status", None),
        ("extraction_method", "guess"),
        ("verify_method", ["exact"]),
    ],
)
def test_models_verdict_from_dict_rejects_unknown_enum_values(field, value):
    data = Verdict(
        correct=False,
        status=Status.WRONG,
        format_valid=False,
        extracted=None,
        extraction_method=ExtractionMethod.NONE,
    ).to_dict()
    data[field] = value
    with pytest.raises(ValueError, match="is not a valid"):
        Verdict.from_dict(data)


def test_models_verdict_from_dict_defaults_missing_methods_to_none():
    verdict = Verdict.from_dict(
        {"correct": True, "status": "correct", "format_valid": True}
    )
    assert verdict.extraction_method is ExtractionMethod.NONE
    assert verdict.verify_method is VerifyMethod.NONE


def test_models_verdict_field_lists_partition_the_verdict() -> None:
    from workers.models import ANSWER_FIELDS, PER_RESPONSE_FIELDS, VERDICT_FIELDS

    verdict = Verdict(
        correct=True,
        status=Status.CORRECT,
        format_valid=True,
        extracted="1",
        extraction_method=ExtractionMethod.BOXED,
    )
    # to_dict spells its fields out (a hot path): it must name exactly these
    assert tuple(verdict.to_dict()) == VERDICT_FIELDS
    assert sorted([*ANSWER_FIELDS, *PER_RESPONSE_FIELDS, "cached"]) == sorted(
        VERDICT_FIELDS
    )


def test_models_options_to_dict_is_asdict() -> None:
    # Every field, in field order (cache keys and the wire are built from it)
    from workers.models import GradeOptions

    options = GradeOptions(allow_fallback=False, approximate=True, rel_tol=1e-3)
    assert list(options.to_dict().items()) == list(dataclasses.asdict(options).items())
    assert GradeOptions.from_dict(options.to_dict()) == options


def test_models_code_verdict_round_trips_and_math_verdicts_gain_no_keys() -> None:
    from workers.models import CODE_FIELDS

    math = Verdict(
        correct=True,
        status=Status.CORRECT,
        format_valid=True,
        extracted="4",
        extraction_method=ExtractionMethod.BOXED,
    )
    # A math verdict's dict and row are exactly the fields they always were.
    assert tuple(math.to_dict()) == VERDICT_FIELDS
    assert len(math.to_row()) == len(VERDICT_FIELDS)
    code = math.replace(
        kind="code",
        score=0.5,
        tests_passed=1,
        tests_total=2,
        failure={"index": 1, "kind": "runtime_error", "exception": "ValueError"},
    )
    assert tuple(code.to_dict()) == VERDICT_FIELDS + CODE_FIELDS
    for back in (Verdict.from_dict(code.to_dict()), Verdict.from_row(code.to_row())):
        assert back == code
        assert back.failure == code.failure
    assert Verdict.from_row(math.to_row()).kind == "math"
    with pytest.raises(ValueError, match="ends with a dict"):
        Verdict.from_row([*math.to_row(), "not a dict"])
