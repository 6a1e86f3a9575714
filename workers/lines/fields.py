"""Which fields of an input record hold the response(s), the gold(s), the id and the
prompt key, and how one record becomes one rollout per sample (pure).

Each role has an alias table (`RESPONSE_FIELDS`, `GOLD_FIELDS`, `ID_FIELDS`,
`PROMPT_FIELDS`): the first field present and usable wins, in table order; a
`FieldSpec` override (a dotted path such as `reward_model.ground_truth`) replaces a
table. `alias_table_text()` is what `gradefleet grade --help` prints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from workers.code.item import CODE_EXTRA_ALIASES, CODE_TEST_ALIASES
from workers.models import exact_gold_text
from workers.wire.contract import text_error

__all__ = [
    "GOLD_FIELDS",
    "ID_FIELDS",
    "PROMPT_FIELDS",
    "PROMPT_TEXT_FIELDS",
    "RESPONSE_FIELDS",
    "SAMPLE_FIELD",
    "FieldError",
    "FieldSpec",
    "Samples",
    "alias_table_text",
    "lookup",
    "prompt_key",
    "record_id",
    "resolve_golds",
    "resolve_samples",
    "sample_records",
]

# Precedence is the tuple order. A list value is several samples of one prompt
# (Qwen's `code`, verl's `responses`; lm-eval's `resps` is a list of lists).
RESPONSE_FIELDS = (
    "response",
    "responses",
    "completion",
    "completions",
    "output",
    "outputs",
    "solution_str",
    "code",
    "resps",
)
# A list value is a set of acceptable golds (correct if any matches). A worked
# solution is fine: the verifier grades against its last \boxed{}. A bool `label` is
# a correctness label (what `audit` reads), not a gold, so it is skipped.
GOLD_FIELDS = (
    "gold",
    "ground_truth",
    "answer",
    "gt",
    "target",
    "expected_answer",
    "reward_model.ground_truth",  # verl's nested layout
    "solution",
    "label",
)
# A rollout's id (diff joins on it, with `sample_idx`).
ID_FIELDS = ("id", "unique_id", "problem_id", "idx", "doc_id", "uid", "prompt_id")
# What makes two rollouts samples of one prompt (clustered errors, pass@k, maj@k):
# an explicit key, else a hash of the prompt text, else the input line number.
PROMPT_FIELDS = (
    "uid",
    "prompt_id",
    "problem_id",
    "unique_id",
    "idx",
    "doc_id",
    "extra_info.index",
)
PROMPT_TEXT_FIELDS = ("prompt", "question", "problem", "query", "input")
SAMPLE_FIELD = "sample_idx"
LINE_FIELD = "gradefleet_line"


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldSpec:
    """Dotted-path overrides of the alias tables (None: use the table)."""

    response: str | None = None
    gold: str | None = None
    id: str | None = None
    prompt: str | None = None

    def responses(self) -> tuple[str, ...]:
        return (self.response,) if self.response else RESPONSE_FIELDS

    def golds(self) -> tuple[str, ...]:
        return (self.gold,) if self.gold else GOLD_FIELDS

    def ids(self) -> tuple[str, ...]:
        return (self.id,) if self.id else ID_FIELDS


def alias_table_text() -> str:
    """The alias tables as `--help` prints them (click rewraps plain paragraphs)."""
    return "\b\n" + "\n".join(
        [
            "response (a list = several samples):",
            "  " + ", ".join(RESPONSE_FIELDS),
            "gold (a list = acceptable golds; a solution = its last \\boxed{}):",
            "  " + ", ".join(GOLD_FIELDS),
            "id: " + ", ".join(ID_FIELDS),
            "prompt key: " + ", ".join(PROMPT_FIELDS),
            "  else a hash of " + ", ".join(PROMPT_TEXT_FIELDS) + ", else the line",
            "code tests (a row with one is graded as code; its gold is unused):",
            *_wrapped(CODE_TEST_ALIASES),
            "  with " + ", ".join(CODE_EXTRA_ALIASES),
        ]
    )


def _wrapped(names: tuple[str, ...], width: int = 76) -> list[str]:
    """`names` comma-joined on indented lines of at most about `width` characters."""
    lines: list[str] = []
    line = ""
    for name in names:
        piece = f"{name}, " if name != names[-1] else name
        if line and len(line) + len(piece) > width:
            lines.append("  " + line.rstrip())
            line = ""
        line += piece
    return [*lines, "  " + line]


def lookup(record: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or None when any part is missing."""
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _set_path(record: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path in `record`, copying the nested dicts on the way."""
    parts = path.split(".")
    node = record
    for part in parts[:-1]:
        child = dict(node[part])
        node[part] = child
        node = child
    node[parts[-1]] = value


@dataclass(frozen=True, slots=True)
class Samples:
    """The response field's name and its sample texts (one unless it was a list)."""

    field: str
    texts: tuple[str, ...]
    is_list: bool


class FieldError(ValueError):
    """A record's fields cannot be used (the message is the line's reason)."""


def _first(record: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, Any]:
    for name in names:
        value = lookup(record, name)
        if value is not None:
            return name, value
    return "", None


def _check_length(name: str, text: str) -> str:
    if (error := text_error(text, "")) is not None:
        raise FieldError(f"field {name!r}: {error}")
    return text


def resolve_samples(record: Mapping[str, Any], spec: FieldSpec) -> Samples:
    """The response text(s) of a record.

    Raises:
        FieldError: no response field, or a value that is not text (or a list of it).
    """
    names = spec.responses()
    name, value = _first(record, names)
    if not name:
        raise FieldError(f"no response field (one of {', '.join(names)})")
    if isinstance(value, str):
        return Samples(name, (_check_length(name, value),), is_list=False)
    if not isinstance(value, list):
        kind = type(value).__name__
        raise FieldError(f"field {name!r} must be a string or a list, not {kind}")
    # lm-eval's `resps` holds one list of generations per request.
    flat = [x for item in value for x in (item if isinstance(item, list) else [item])]
    if not flat:
        raise FieldError(f"field {name!r} is an empty list (no samples)")
    for position, text in enumerate(flat):
        if not isinstance(text, str):
            kind = type(text).__name__
            raise FieldError(f"field {name!r}[{position}] must be a string, not {kind}")
        _check_length(name, text)
    return Samples(name, tuple(flat), is_list=True)


def _one_gold(name: str, value: object) -> str:
    try:
        return _check_length(name, exact_gold_text(value))
    except TypeError:
        kind = type(value).__name__
        raise FieldError(
            f"field {name!r} must be a string or number, not {kind}"
        ) from None


def resolve_golds(record: Mapping[str, Any], spec: FieldSpec) -> tuple[str, list[str]]:
    """The gold field's name and its acceptable golds (first one first).

    Raises:
        FieldError: no gold field, an empty list, or a value that is not text/number.
    """
    names = spec.golds()
    for name in names:
        value = lookup(record, name)
        if value is None or (isinstance(value, bool) and name == "label"):
            continue  # a `label: true/false` marks correctness; it is not a gold
        if isinstance(value, list):
            if not value:
                raise FieldError(f"field {name!r} is an empty list of golds")
            return name, [_one_gold(name, item) for item in value]
        return name, [_one_gold(name, value)]
    raise FieldError(f"no gold field (one of {', '.join(names)})")


def sample_records(
    record: dict[str, Any],
    samples: Samples,
    gold_field: str,
    keep: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """One record per sample: the response field holds that sample's text, other
    top-level lists of the same length (Qwen's `pred`, `score`) that sample's item,
    and `sample_idx` its position. A single-text record is returned as is. The
    gold field and the fields in `keep` (a code row's tests) are never split."""
    if not samples.is_list:
        return [record]
    count = len(samples.texts)
    parallel = [
        key
        for key, value in record.items()
        if isinstance(value, list)
        and len(value) == count
        and key != gold_field.split(".")[0]
        and key not in keep
    ]
    out: list[dict[str, Any]] = []
    for index, text in enumerate(samples.texts):
        copy = dict(record)
        for key in parallel:
            copy[key] = record[key][index]
        _set_path(copy, samples.field, text)
        copy[SAMPLE_FIELD] = index
        out.append(copy)
    return out


def _key_text(value: object) -> str | None:
    if value is None or isinstance(value, bool | float):
        return None if value is None else json.dumps(value)
    if isinstance(value, str | int | Decimal | Fraction):
        return str(value)
    return json.dumps(value, sort_keys=True, default=str)


def record_id(record: Mapping[str, Any], spec: FieldSpec) -> str | None:
    """The rollout id (with `#sample_idx` when present), or None."""
    _, value = _first(record, spec.ids())
    text = _key_text(value)
    if text is None:
        return None
    sample = record.get(SAMPLE_FIELD)
    return text + (f"#{sample}" if isinstance(sample, int) else "")


def prompt_key(record: Mapping[str, Any], spec: FieldSpec) -> tuple[str, str]:
    """(how the key was found, the key): `idx`, `prompt-hash` or `line`."""
    names = (spec.prompt,) if spec.prompt else PROMPT_FIELDS
    name, value = _first(record, names)
    text = _key_text(value)
    if text is not None:
        return name, text
    if not spec.prompt:
        name, value = _first(record, PROMPT_TEXT_FIELDS)
        if value is not None:
            blob = json.dumps(value, sort_keys=True, default=str).encode()
            return "prompt-hash", hashlib.blake2b(blob, digest_size=12).hexdigest()
    return "line", str(record.get(LINE_FIELD))
