"""Request and response bodies of `gradefleet serve` (pydantic models).

Validation errors name the item index and the field (pydantic's `loc`, e.g.
`["body", "items", 3]` with "no gold field (one of gold, ground_truth, ...)"). New
request fields (a priority lane, ...) are added as optional fields with defaults, so
old clients keep working; unknown top-level fields are refused so a typo is not
silently ignored.
"""

from __future__ import annotations

import math
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from workers.lines.fields import lookup
from workers.lines.records import (
    GOLD_FIELDS,
    RESPONSE_FIELDS,
    InputRow,
    rows_from_record,
)
from workers.models import GradeOptions
from workers.wire.lanes import INTERACTIVE, Lane

__all__ = [
    "ITEM_FIELD_TYPES",
    "MAX_ITEMS",
    "GradeRequest",
    "GradeResponse",
    "GradeResult",
    "NemoGymVerifyRequest",
    "OpenRLHFRequest",
    "OpenRLHFResponse",
    "OptionsIn",
    "RolloutIn",
    "pick_row",
]

MAX_ITEMS: Final = 100_000


class OptionsIn(BaseModel):
    """Verdict-changing options (`GradeOptions`) and the fleet lane; omitted fields
    keep defaults."""

    model_config = ConfigDict(extra="forbid")

    allow_fallback: bool = True
    approximate: bool = False
    rel_tol: float = Field(default=1e-6, ge=0.0, le=1.0, allow_inf_nan=False)
    priority: Lane = Field(
        default=INTERACTIVE,
        description="On a fleet, the lane of these items: `interactive` (RL steps, "
        "taken first) or `bulk` (sweeps). Does not change verdicts.",
    )

    def to_options(self) -> GradeOptions:
        return GradeOptions(
            allow_fallback=self.allow_fallback,
            approximate=self.approximate,
            rel_tol=self.rel_tol,
        )


class RolloutIn(BaseModel):
    """One rollout: a response and a gold, under any field name the CLI accepts.

    The response is the first of `response`, `completion`, `output`, `solution_str`
    present and not null; the gold the first of `gold`, `ground_truth`, `answer`,
    `solution`, `expected_answer`, `reward_model.ground_truth`. Other fields are
    allowed and ignored (send whole rollout rows).
    """

    model_config = ConfigDict(extra="allow")

    response: str | None = None
    completion: str | None = None
    output: str | None = None
    solution_str: str | None = None
    gold: str | int | float | None = None
    # An object only as a code row's test spec (verl's shape); `pick_row` refuses
    # any other object, naming the field.
    ground_truth: str | int | float | dict[str, Any] | None = None
    answer: str | int | float | None = None
    solution: str | int | float | None = None
    expected_answer: str | int | float | None = None
    reward_model: dict[str, Any] | None = None

    _row: InputRow = PrivateAttr()

    @model_validator(mode="wrap")
    @classmethod
    def _pick_fields(cls, data: Any, handler: Any) -> RolloutIn:
        row = pick_row(data)
        model: RolloutIn = handler(data)
        model._row = row
        return model

    @property
    def pair(self) -> tuple[str, str]:
        return self._row.response, self._row.gold


def pick_row(data: Any) -> InputRow:
    """The item's response and gold by the CLI's own rules (aliases, types, length
    limit), so the CLI and the service accept the same rollouts and say the same
    thing about the others.

    Raises:
        ValueError: naming the field at fault.
    """
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    rows = rows_from_record(data, 0)
    if not isinstance(rows, list):
        raise ValueError(rows.reason)
    for name in (*RESPONSE_FIELDS, *GOLD_FIELDS):
        if isinstance(lookup(data, name), list):  # the CLI's samples and golds
            raise ValueError(
                f"field {name!r} must be a string or number, not list "
                "(one response and one gold per item)"
            )
    return rows[0]


# The JSON types each declared field of `RolloutIn` takes (besides null): an item
# whose declared fields all have these types is valid exactly when `pick_row`
# accepts it (what `producer.serve.grade_route`'s fast path relies on).
_TEXT: Final = (str,)
_GOLD: Final = (str, int, float)
ITEM_FIELD_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "response": _TEXT,
    "completion": _TEXT,
    "output": _TEXT,
    "solution_str": _TEXT,
    "gold": _GOLD,
    "ground_truth": (*_GOLD, dict),
    "answer": _GOLD,
    "solution": _GOLD,
    "expected_answer": _GOLD,
    "reward_model": (dict,),
}
assert set(ITEM_FIELD_TYPES) == set(RolloutIn.model_fields)
# Every declared field is one of the CLI's aliases (the others arrive as extras).
assert set(RolloutIn.model_fields) <= set(RESPONSE_FIELDS) | {
    f.split(".")[0] for f in GOLD_FIELDS
}


class GradeRequest(BaseModel):
    """`POST /v1/grade`."""

    model_config = ConfigDict(extra="forbid")

    items: list[RolloutIn] = Field(max_length=MAX_ITEMS)
    options: OptionsIn = Field(default_factory=OptionsIn)
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        allow_inf_nan=False,
        description="Unfinished items come back as `timeout` after this long "
        "(the `X-Gradefleet-Deadline-S` header works too; the smaller wins).",
    )


class GradeResult(BaseModel):
    """One verdict (the fields the CLI writes, and more) plus its reward."""

    correct: bool
    status: str
    format_valid: bool
    extracted: str | None
    extraction_method: str
    canonical_pred: str | None
    canonical_gold: str | None
    verify_method: str
    reason: str
    grader_version: str
    cached: bool
    score: float = Field(
        description="The reward (a code item's: 1 when all passed, or the fraction "
        "passed with GRADEFLEET_CODE_PARTIAL_CREDIT=1)."
    )
    kind: str = Field(default="math", description="`code` for a code item.")
    tests_passed: int | None = Field(default=None, description="code items only")
    tests_total: int | None = Field(default=None, description="code items only")
    failure: dict[str, Any] | None = Field(
        default=None, description="code items only: the first failing test"
    )


class GradeResponse(BaseModel):
    results: list[GradeResult]
    grader_version: str


class OpenRLHFRequest(BaseModel):
    """OpenRLHF's remote reward request (`--reward.remote_url`)."""

    model_config = ConfigDict(extra="allow")

    query: list[str] = Field(max_length=MAX_ITEMS)
    prompts: list[str] | None = None
    labels: list[str | int | float | None] | None = None

    @model_validator(mode="after")
    def _aligned(self) -> OpenRLHFRequest:
        for name in ("prompts", "labels"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self.query):
                raise ValueError(
                    f"{name} has {len(value)} entries, query has {len(self.query)}"
                )
        if self.labels is None:
            raise ValueError("labels (the gold answers) are required")
        return self


class OpenRLHFResponse(BaseModel):
    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, list[Any]]


def _all_finite(value: Any, depth: int = 0) -> bool:
    """No NaN or Infinity anywhere (Python's JSON parser accepts them; a reply
    echoing them could not be encoded). Deeper than 64 levels counts as bad."""
    if depth > 64:
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return all(_all_finite(v, depth + 1) for v in value)
    return True


class NemoGymVerifyRequest(BaseModel):
    """NeMo Gym's resources-server verify request (extra fields echoed): math
    (`expected_answer`) or `code_gen` (`verifier_metadata.unit_tests`)."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _echoable(cls, data: Any) -> Any:
        if not _all_finite(data):
            raise ValueError("NaN, Infinity or nesting deeper than 64 in the request")
        return data

    response: dict[str, Any]
    expected_answer: str | int | float | None = None
    question: str | None = None
    verifier_metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _has_a_gold(self) -> NemoGymVerifyRequest:
        tests = (self.verifier_metadata or {}).get("unit_tests")
        if self.expected_answer is None and tests is None:
            raise ValueError(
                "expected_answer (math) or verifier_metadata.unit_tests (code_gen)"
                " is required"
            )
        return self
