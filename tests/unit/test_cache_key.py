"""cache_key / cache_keyer canonicalisation (hypothesis, pinned digests) and the stored
entry shape and encoding."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.cache.results import (
    ANSWER_FIELDS,
    _encode_entry,
    cache_entry,
    cache_key,
    cache_keyer,
    verdict_from_entry,
)
from workers.models import (
    CODE_FIELDS,
    ExtractionMethod,
    GradeOptions,
    Status,
    Verdict,
    VerifyMethod,
)

options_st = st.builds(
    GradeOptions,
    allow_fallback=st.booleans(),
    approximate=st.booleans(),
    rel_tol=st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
)
texts = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\ud800\udfff"))


@given(version=st.text(), options=options_st, key=texts)
def test_cache_key_is_sha256_hex_and_independent_of_dict_order(
    version: str, options: GradeOptions, key: str
) -> None:
    digest = cache_key(version, options, key)
    assert len(digest) == 64
    assert int(digest, 16) >= 0
    # Rebuilding the options from a reversed-order dict gives the same key.
    reordered = GradeOptions.from_dict(dict(reversed(list(options.to_dict().items()))))
    assert cache_key(version, reordered, key) == digest


@given(version=st.text(), other_version=st.text(), key=texts, other_key=texts)
def test_cache_key_changes_with_version_and_decision_key(
    version: str, other_version: str, key: str, other_key: str
) -> None:
    options = GradeOptions()
    base = cache_key(version, options, key)
    assert (cache_key(other_version, options, key) == base) == (
        version == other_version
    )
    assert (cache_key(version, options, other_key) == base) == (key == other_key)


@given(options=options_st, other=options_st)
def test_cache_key_changes_with_every_option(
    options: GradeOptions, other: GradeOptions
) -> None:
    same = cache_key("v", options, "k") == cache_key("v", other, "k")
    assert same == (options.to_dict() == other.to_dict())


def test_cache_key_separates_fields_unambiguously() -> None:
    # Moving text between the version and the decision key must change the key.
    assert cache_key("ab", GradeOptions(), "c") != cache_key("a", GradeOptions(), "bc")


VERDICT = Verdict(
    correct=True,
    status=Status.CORRECT,
    format_valid=True,
    extracted="1/2",
    extraction_method=ExtractionMethod.BOXED,
    canonical_pred="1/2",
    canonical_gold="1/2",
    verify_method=VerifyMethod.NUMERIC,
    reason="equal fractions",
    grader_version="v1",
)


def test_cache_entry_holds_answer_fields_only() -> None:
    entry = cache_entry(VERDICT)
    assert tuple(sorted(entry)) == tuple(sorted(ANSWER_FIELDS))
    assert "extracted" not in entry
    assert "format_valid" not in entry


def test_cache_entry_rebuilds_with_per_response_fields_of_the_item() -> None:
    other = dataclasses.replace(
        VERDICT,
        extracted="0.5",
        extraction_method=ExtractionMethod.ANSWER_LINE,
        format_valid=False,
        status=Status.WRONG,
        correct=False,
    )
    rebuilt = verdict_from_entry(cache_entry(VERDICT), other, other.cached)
    assert rebuilt == dataclasses.replace(
        VERDICT,
        extracted="0.5",
        extraction_method=ExtractionMethod.ANSWER_LINE,
        format_valid=False,
    )


@pytest.mark.parametrize("status", [Status.TIMEOUT, Status.MEMORY_LIMIT, Status.ERROR])
def test_cache_entry_refuses_transient_verdicts(status: Status) -> None:
    with pytest.raises(ValueError, match="transient"):
        cache_entry(VERDICT.replace(status=status, correct=False))


def reference_key(version: str, options: GradeOptions, key: str) -> str:
    """The definition, spelled out: sha256 of the sorted compact JSON of all three."""
    canonical = json.dumps(
        {"grader_version": version, "options": options.to_dict(), "decision_key": key},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


@given(version=st.text(), options=options_st, key=texts)
def test_cache_key_equals_the_canonical_json_definition(
    version: str, options: GradeOptions, key: str
) -> None:
    assert cache_key(version, options, key) == reference_key(version, options, key)


def test_cache_key_tells_negative_zero_from_zero() -> None:
    # JSON writes them differently (equal as floats, so no cache may conflate them).
    zero, negative_zero = GradeOptions(rel_tol=0.0), GradeOptions(rel_tol=-0.0)
    assert cache_key("v", zero, "k") == reference_key("v", zero, "k")
    assert cache_key("v", negative_zero, "k") == reference_key("v", negative_zero, "k")
    assert cache_key("v", zero, "k") != cache_key("v", negative_zero, "k")
    assert cache_keyer("v", zero)("k") != cache_keyer("v", negative_zero)("k")


@given(version=st.text(), options=options_st, keys=st.lists(texts, max_size=8))
def test_cache_keyer_equals_the_canonical_json_definition_for_every_key(
    version: str, options: GradeOptions, keys: list[str]
) -> None:
    # One keyer, reused across keys (as a batch does), gives the defined digests.
    key_of = cache_keyer(version, options)
    assert [key_of(key) for key in keys] == [
        reference_key(version, options, key) for key in keys
    ]


# Digests computed by the implementation before `cache_keyer` existed: stored results
# stay reachable only while every key stays byte-identical. (Re-pinned when
# `GradeOptions.approximate` joined the options, with grader revision 5: every older
# entry is unreachable anyway once the grader version changes.)
PINNED_DIGESTS = [
    (
        "v1",
        GradeOptions(approximate=True),
        "pred=1/2|gold=1/2",
        "f73aa71f5baa0bbce1ed8acb372d818a399dbdafd64a52db36bc12d905b066b5",
    ),
    (
        "v1",
        GradeOptions(),
        "pred=1/2|gold=1/2",
        "6ccb88815252be26010eb8dcecbfa9f50325e922da94bab73727c86c2b7c0a14",
    ),
    (
        "v1",
        GradeOptions(allow_fallback=False, rel_tol=0.0),
        "π ≈ 3.14159",
        "946b361a741f939f9c5f2588002df9980b010d7f260593bcf0c108ac10230cef",
    ),
    (
        "v1",
        GradeOptions(rel_tol=-0.0),
        "lone \ud800 surrogate",
        "31c013b272f0a5d4ca2244ed74377801b8b1fa4f7847e097073ad9af4d3fe938",
    ),
    (
        "2024.1",
        GradeOptions(rel_tol=1e-300),
        'quote " backslash \\ newline \n tab \t nul \x00',
        "495152a25c25917a07eb99b5c4bf2cfc7407cd93c1f5e38339b2bba40af22819",
    ),
    (
        "",
        GradeOptions(),
        "",
        "2a5f33c43b4c3a99d5977e2d5c30da855594738d4d4c126bde24a9c28bcc7fb2",
    ),
]


@pytest.mark.parametrize(("version", "options", "key", "digest"), PINNED_DIGESTS)
def test_cache_key_digests_are_pinned(
    version: str, options: GradeOptions, key: str, digest: str
) -> None:
    assert reference_key(version, options, key) == digest
    assert cache_key(version, options, key) == digest
    assert cache_keyer(version, options)(key) == digest


def reference_entry_json(entry: dict[str, object]) -> str:
    """The stored form of an entry, spelled out (ASCII: escapes, surrogates too)."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


entries_st = st.fixed_dictionaries(
    {
        "status": st.sampled_from([s.value for s in Status]),
        "correct": st.booleans(),
        "verify_method": st.sampled_from([m.value for m in VerifyMethod]),
        "reason": texts,
        "canonical_pred": st.none() | texts,
        "canonical_gold": st.none() | texts,
        "grader_version": st.text(),
    }
)


@given(entry=entries_st)
def test_cache_entry_encoding_is_the_compact_sorted_json(
    entry: dict[str, object],
) -> None:
    encoded = _encode_entry(entry)
    assert encoded == reference_entry_json(entry)
    assert encoded.isascii()


def test_cache_entry_encoding_is_pinned() -> None:
    entry = {
        "status": "wrong",
        "correct": False,
        "verify_method": "symbolic",
        "reason": 'x²≠ \ud800 "q"',
        "canonical_pred": None,
        "canonical_gold": "x+2",
        "grader_version": "v1",
    }
    assert _encode_entry(entry) == (
        '{"canonical_gold":"x+2","canonical_pred":null,"correct":false,'
        '"grader_version":"v1","reason":"x\\u00b2\\u2260 \\ud800 \\"q\\"",'
        '"status":"wrong","verify_method":"symbolic"}'
    )


# Every field of a Verdict, none at its default: a new field must be added here (and
# to `verdict_from_entry`), else the field-set assertion below fails.
PER_RESPONSE_FIELDS: dict[str, object] = {
    "correct": False,
    "status": Status.ERROR,
    "format_valid": True,
    "extracted": "0.5",
    "extraction_method": ExtractionMethod.ANSWER_LINE,
    "canonical_pred": "stale-pred",
    "canonical_gold": "stale-gold",
    "verify_method": VerifyMethod.TEXT,
    "reason": "stale reason",
    "grader_version": "stale",
    "cached": True,
}


def test_per_response_fixture_covers_every_verdict_field() -> None:
    # Every field but a code verdict's own (CODE_FIELDS: kind "math" and no test
    # counts on every verdict here; their round trips are in test_models).
    names = {field.name for field in dataclasses.fields(Verdict)} - set(CODE_FIELDS)
    assert set(PER_RESPONSE_FIELDS) == names


@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("method", list(VerifyMethod))
@pytest.mark.parametrize("cached", [False, True])
def test_verdict_from_entry_equals_replace_for_every_status_and_method(
    status: Status, method: VerifyMethod, cached: bool
) -> None:
    per_response = Verdict(**{**PER_RESPONSE_FIELDS, "cached": cached})  # type: ignore[arg-type]
    entry = {
        "status": status.value,
        "correct": status is Status.CORRECT,
        "verify_method": method.value,
        "reason": f"{status} by {method}",
        "canonical_pred": None if cached else "π",
        "canonical_gold": "\ud800",
        "grader_version": "v9",
    }
    expected = dataclasses.replace(
        per_response,
        status=Status(entry["status"]),
        correct=entry["correct"],
        verify_method=VerifyMethod(entry["verify_method"]),
        reason=entry["reason"],
        canonical_pred=entry["canonical_pred"],
        canonical_gold=entry["canonical_gold"],
        grader_version=entry["grader_version"],
    )
    rebuilt = verdict_from_entry(entry, per_response, cached)
    assert rebuilt == expected
    assert type(rebuilt.status) is Status
    assert type(rebuilt.verify_method) is VerifyMethod
