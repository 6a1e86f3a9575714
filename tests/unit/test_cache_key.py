"""cache_key canonicalisation (hypothesis) and the stored entry shape."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.cache import ANSWER_FIELDS, cache_entry, cache_key, verdict_from_entry
from workers.models import ExtractionMethod, GradeOptions, Status, Verdict, VerifyMethod

options_st = st.builds(
    GradeOptions,
    allow_fallback=st.booleans(),
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
    rebuilt = verdict_from_entry(cache_entry(VERDICT), other)
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
    # JSON writes them differently; the memo of option encodings must keep them apart.
    zero, negative_zero = GradeOptions(rel_tol=0.0), GradeOptions(rel_tol=-0.0)
    assert cache_key("v", zero, "k") == reference_key("v", zero, "k")
    assert cache_key("v", negative_zero, "k") == reference_key("v", negative_zero, "k")
