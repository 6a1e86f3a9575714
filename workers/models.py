"""Value types shared by the verifier, the fleet and the producer (stdlib only).

`Rollout` is what is graded, `Verdict` what grading returns; `GradeOptions` holds the
knobs that change verdicts (they are part of every cache key). Nothing here imports
SymPy, Celery or Redis.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from fractions import Fraction
from typing import Any, Protocol, TypeVar

_E = TypeVar("_E", bound=StrEnum)


@dataclass(frozen=True, slots=True)
class Rollout:
    """One model output and the gold answer it is graded against."""

    response: str
    gold: str


class RolloutLike(Protocol):
    """Anything with `response` and `gold` text (a `Rollout`, a CLI input row, a
    batch item): what the graders accept, so no caller copies its rows."""

    @property
    def response(self) -> str: ...

    @property
    def gold(self) -> str: ...


class Status(StrEnum):
    """Outcome of grading one rollout."""

    CORRECT = "correct"
    WRONG = "wrong"
    NO_ANSWER = "no_answer"
    UNSUPPORTED = "unsupported"
    INVALID_GOLD = "invalid_gold"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    ERROR = "error"


class ExtractionMethod(StrEnum):
    """Where the graded answer was found in the response."""

    BOXED = "boxed"
    FBOX = "fbox"
    ANSWER_TAG = "answer_tag"
    ANSWER_LINE = "answer_line"
    FINAL_ANSWER_PHRASE = "final_answer_phrase"
    LAST_NUMBER = "last_number"
    NONE = "none"


class VerifyMethod(StrEnum):
    """Which comparison decided the verdict."""

    EXACT = "exact"
    NUMERIC = "numeric"
    STRUCTURAL = "structural"
    SYMBOLIC = "symbolic"
    CHOICE = "choice"
    TEXT = "text"
    NONE = "none"


# value -> member, for hot decoders (`Verdict.from_dict` per result the producer
# receives, the cache per entry): a lookup costs a fraction of calling the enum
# (which walks its metaclass). Read-only by convention.
STATUS_BY_VALUE: Mapping[str, Status] = {m.value: m for m in Status}
EXTRACTION_METHOD_BY_VALUE: Mapping[str, ExtractionMethod] = {
    m.value: m for m in ExtractionMethod
}
VERIFY_METHOD_BY_VALUE: Mapping[str, VerifyMethod] = {m.value: m for m in VerifyMethod}


def _member(table: Mapping[str, _E], value: object, kind: str) -> _E:
    """The enum member for `value`; ValueError (as the enum call) when unknown."""
    member = table.get(value) if isinstance(value, str) else None
    if member is None:
        raise ValueError(f"{value!r} is not a valid {kind}")
    return member


# Statuses that depend on load or on our own bugs, never cached as final.
TRANSIENT_STATUSES = frozenset({Status.TIMEOUT, Status.MEMORY_LIMIT, Status.ERROR})
# A code rollout's gold is its row's tests as JSON behind this prefix
# (`workers.code.item`). NUL never starts a math gold a person or a data set writes;
# a gold that did start so would be read as code and get `invalid_gold`, never a
# pass. Here, below both graders and the wire, because the wire bounds code golds
# differently (`contract.text_error`).
CODE_GOLD_PREFIX = "\x00gradefleet:code\x00"


@dataclass(frozen=True, slots=True, kw_only=True)
class GradeOptions:
    """Knobs that change verdicts; every field is part of the cache key.

    Attributes:
        allow_fallback: let answers found without an explicit final-answer marker
            (a "the result is 4" phrase, the last number) count as correct.
            `format_valid` is false for them either way.
        approximate: credit a rounded decimal for an exact value with no finite
            decimal expansion (``3.14`` for pi, ``0.33`` for 1/3) and a prediction
            within `rel_tol` of the gold. Off by default: an exact gold then needs
            an exactly equal answer (float noise like ``2.0000000000000004`` aside).
        rel_tol: relative tolerance used only with `approximate`, when the
            *prediction* is a rounded decimal compared against an exact gold.
    """

    allow_fallback: bool = True
    approximate: bool = False
    rel_tol: float = 1e-6

    def to_dict(self) -> dict[str, Any]:
        # Not `dataclasses.asdict` (~10 us, deep-copying): the fields are scalars,
        # and options are encoded for every batch a worker grades (issue 11).
        return {name: getattr(self, name) for name in _OPTION_FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> GradeOptions:
        if not data:
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown grade options: {sorted(unknown)}")
        return cls(**dict(data))


_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(GradeOptions))


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The structured result of grading one rollout (immutable, JSON-able)."""

    correct: bool
    status: Status
    format_valid: bool
    extracted: str | None
    extraction_method: ExtractionMethod
    canonical_pred: str | None = None
    canonical_gold: str | None = None
    verify_method: VerifyMethod = VerifyMethod.NONE
    reason: str = ""
    grader_version: str = ""
    cached: bool = False
    # Code verdicts only (issue 39); a math verdict keeps the defaults and none of these
    # appear in its dict or row, so math outputs stay byte for byte what they were.
    kind: str = "math"
    score: float | None = None  # fraction of tests passed
    tests_passed: int | None = None
    tests_total: int | None = None
    # The first failing test: index, kind, detail (not hashed: a dict).
    failure: dict[str, Any] | None = dataclasses.field(default=None, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only (enums become their string values)."""
        data = {
            "correct": self.correct,
            "status": self.status.value,
            "format_valid": self.format_valid,
            "extracted": self.extracted,
            "extraction_method": self.extraction_method.value,
            "canonical_pred": self.canonical_pred,
            "canonical_gold": self.canonical_gold,
            "verify_method": self.verify_method.value,
            "reason": self.reason,
            "grader_version": self.grader_version,
            "cached": self.cached,
        }
        if self.kind != "math":
            data.update(self._code_dict())
        return data

    def _code_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in CODE_FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        verdict = build_verdict(
            bool(data["correct"]),
            _member(STATUS_BY_VALUE, data["status"], "Status"),
            bool(data["format_valid"]),
            data.get("extracted"),
            _member(
                EXTRACTION_METHOD_BY_VALUE,
                data.get("extraction_method", "none"),
                "ExtractionMethod",
            ),
            data.get("canonical_pred"),
            data.get("canonical_gold"),
            _member(
                VERIFY_METHOD_BY_VALUE,
                data.get("verify_method", "none"),
                "VerifyMethod",
            ),
            str(data.get("reason", "")),
            str(data.get("grader_version", "")),
            bool(data.get("cached", False)),
        )
        if data.get("kind", "math") != "math":
            _set_code_fields(verdict, data)
        return verdict

    def replace(self, **changes: Any) -> Verdict:
        return dataclasses.replace(self, **changes)

    def to_row(self) -> list[Any]:
        """`to_dict`'s values in field order: what a sandbox child sends its parent
        per item (a list encodes and decodes in a fraction of a dict's time). A code
        verdict's row has one more value, the dict of its `CODE_FIELDS`."""
        row: list[Any] = [
            self.correct,
            self.status.value,
            self.format_valid,
            self.extracted,
            self.extraction_method.value,
            self.canonical_pred,
            self.canonical_gold,
            self.verify_method.value,
            self.reason,
            self.grader_version,
            self.cached,
        ]
        if self.kind != "math":
            row.append(self._code_dict())
        return row

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Verdict:
        """The verdict of a `to_row` list; ValueError when it is not one."""
        code = row[-1] if len(row) == len(VERDICT_FIELDS) + 1 else None
        if code is not None:
            if not isinstance(code, Mapping):
                raise ValueError("a code verdict row ends with a dict")
            row = row[:-1]
        if len(row) != len(VERDICT_FIELDS):
            raise ValueError(f"a verdict row has {len(VERDICT_FIELDS)} values")
        (correct, status, valid, extracted, method, pred, gold, how, reason, version,
         cached) = row  # fmt: skip
        for text in (extracted, pred, gold):
            if not (text is None or isinstance(text, str)):
                raise ValueError("a verdict row's texts are strings or null")
        verdict = build_verdict(
            bool(correct),
            _member(STATUS_BY_VALUE, status, "Status"),
            bool(valid),
            extracted,
            _member(EXTRACTION_METHOD_BY_VALUE, method, "ExtractionMethod"),
            pred,
            gold,
            _member(VERIFY_METHOD_BY_VALUE, how, "VerifyMethod"),
            str(reason),
            str(version),
            bool(cached),
        )
        if code is not None:
            _set_code_fields(verdict, code)
        return verdict


# A code verdict's own fields (issue 39): in its dict and row only when kind != "math".
CODE_FIELDS: tuple[str, ...] = (
    "kind",
    "score",
    "tests_passed",
    "tests_total",
    "failure",
)
# The verdict's fields, named once: every consumer (the cache's entries, the CLI's
# output lines, the copies a batch hands to duplicate answers) takes its list here.
# Every verdict has them; a code verdict has `CODE_FIELDS` besides.
VERDICT_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(Verdict) if f.name not in CODE_FIELDS
)
# Each field's slot setter, in field order (see `build_verdict`): a field added fails
# this unpacking at import, one moved the round trip in tests/unit/test_models.
(
    _set_correct,
    _set_status,
    _set_format_valid,
    _set_extracted,
    _set_extraction_method,
    _set_canonical_pred,
    _set_canonical_gold,
    _set_verify_method,
    _set_reason,
    _set_grader_version,
    _set_cached,
) = (getattr(Verdict, name).__set__ for name in VERDICT_FIELDS)
_set_kind, _set_score, _set_tests_passed, _set_tests_total, _set_failure = (
    getattr(Verdict, name).__set__ for name in CODE_FIELDS
)
_new_object = object.__new__


def _set_code_fields(verdict: Verdict, data: Mapping[str, Any]) -> None:
    """A code verdict's fields from its dict (`from_dict`, `from_row`)."""
    kind, score, passed, total, failure = (data.get(name) for name in CODE_FIELDS)
    if not isinstance(kind, str):
        raise ValueError("a code verdict's kind is a string")
    _set_kind(verdict, kind)
    _set_score(verdict, None if score is None else float(score))
    _set_tests_passed(verdict, None if passed is None else int(passed))
    _set_tests_total(verdict, None if total is None else int(total))
    _set_failure(verdict, None if failure is None else dict(failure))


def build_verdict(
    correct: bool,
    status: Status,
    format_valid: bool,
    extracted: str | None,
    extraction_method: ExtractionMethod,
    canonical_pred: str | None,
    canonical_gold: str | None,
    verify_method: VerifyMethod,
    reason: str,
    grader_version: str,
    cached: bool,
    /,
) -> Verdict:
    """`Verdict(...)` of every field, in field order, at half its cost.

    A frozen dataclass's __init__ sets each field through `object.__setattr__`
    (1.35 us for a verdict), and verdicts are built several times a rollout outside
    the verifier: read from a process's reply, rebuilt from a cache entry, copied
    for a duplicate (issue 11). The slots' own setters skip only the frozen check,
    which is there for callers; like the constructor, nothing is validated.
    """
    verdict = _new_object(Verdict)
    _set_correct(verdict, correct)
    _set_status(verdict, status)
    _set_format_valid(verdict, format_valid)
    _set_extracted(verdict, extracted)
    _set_extraction_method(verdict, extraction_method)
    _set_canonical_pred(verdict, canonical_pred)
    _set_canonical_gold(verdict, canonical_gold)
    _set_verify_method(verdict, verify_method)
    _set_reason(verdict, reason)
    _set_grader_version(verdict, grader_version)
    _set_cached(verdict, cached)
    _set_kind(verdict, "math")  # the code fields' defaults (`_set_code_fields`)
    _set_score(verdict, None)
    _set_tests_passed(verdict, None)
    _set_tests_total(verdict, None)
    _set_failure(verdict, None)
    return verdict


class OwnFields(Protocol):
    """A response's own verdict fields (a `verifier.Prepared`, a sandbox's
    `ItemPrep`, a `Verdict`): they differ between responses with the same answer."""

    @property
    def extracted(self) -> str | None: ...

    @property
    def extraction_method(self) -> ExtractionMethod: ...

    @property
    def format_valid(self) -> bool: ...


# Read from the response itself: they differ between responses with the same answer.
PER_RESPONSE_FIELDS = ("format_valid", "extracted", "extraction_method")
# Decided by (grader version, options, canonical answer, gold): what the cache stores.
ANSWER_FIELDS = tuple(
    name for name in VERDICT_FIELDS if name not in {*PER_RESPONSE_FIELDS, "cached"}
)


# A code verdict whose first failure is one of these depends on the machine's load
# (a test that ran out of time or memory on a busy worker may pass on an idle one).
LOAD_DEPENDENT_FAILURES = frozenset({"timeout", "memory"})


def is_final(verdict: Verdict) -> bool:
    """Whether a later run may take `verdict` as it is (the cache, `--resume`): a
    status that depends on neither load nor our bugs, from a named grader version;
    for a code verdict, also no failure that depends on load (the first, or a later
    one that `failure["later"]` names)."""
    if verdict.status in TRANSIENT_STATUSES or not verdict.grader_version:
        return False
    failure = verdict.failure or {}
    return not LOAD_DEPENDENT_FAILURES.intersection(
        (failure.get("kind"), failure.get("later"))
    )


def ungraded_verdict(status: Status, reason: str, grader_version: str = "") -> Verdict:
    """A verdict for a rollout that has no grading of its own to show (a deadline's
    stand-in, a backend failure, an item that failed while being prepared): no
    extraction, not correct."""
    return Verdict(
        correct=False,
        status=status,
        format_valid=False,
        extracted=None,
        extraction_method=ExtractionMethod.NONE,
        reason=reason,
        grader_version=grader_version,
    )


def exact_gold_text(value: object) -> str:
    """A gold answer as exact text: str as is, int/Decimal/Fraction/float exactly.

    A float is written as its shortest round-trip repr (`0.1` -> "0.1"), so the text
    is the number the caller wrote. Callers pass golds from JSON, Parquet or code, and
    a number is as good a gold as its text.

    Raises:
        TypeError: bool, None, a non-finite float, or any other type.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise TypeError("a bool is not a gold answer")
    if isinstance(value, int | Fraction):
        return str(value)
    if isinstance(value, Decimal) and value.is_finite():
        return format(value, "f")
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    raise TypeError(f"gold must be str or a finite number, not {type(value).__name__}")
