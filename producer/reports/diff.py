"""`gradefleet diff A B`: the verdicts that changed between two gradings of the same
rollouts (say, before and after a verifier change), with a paired test.

Rows are joined on their id (`workers.lines.fields.record_id`, with `sample_idx`) when
every row of both files has a distinct one, else on their position in the file; a
pair whose response texts differ stops the diff (the files do not line up).
`cached` is ignored; a flip is a change of `correct` or `status`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from producer.errors import InputFormatError
from producer.files.formats import iter_records
from producer.reports.report import MISSING, group_label
from producer.reports.stats import mcnemar_p, paired_delta
from workers.lines.fields import (
    FieldError,
    FieldSpec,
    record_id,
    resolve_golds,
    resolve_samples,
)
from workers.lines.records import LineError

__all__ = ["DiffResult", "Graded", "diff_files", "read_graded"]


@dataclass(frozen=True, slots=True)
class Graded:
    """What diff and audit need of one graded row."""

    line_no: int
    rid: str | None
    group: tuple[str, ...]
    correct: bool
    status: str
    extracted: str | None
    gold: str | None
    reason: str
    version: str
    text_digest: bytes
    record: dict[str, Any] | None = None


def read_graded(
    path: str, spec: FieldSpec, by: Sequence[str], *, keep_record: bool = False
) -> list[Graded]:
    """Every graded row of `path` (JSONL or Parquet), in file order.

    Raises:
        InputFormatError: a row without a verdict, or an unreadable line.
    """
    from workers.lines.fields import lookup

    rows: list[Graded] = []
    for item in iter_records(path):
        if isinstance(item, LineError):
            raise InputFormatError(f"{path}: {item}")
        line_no, record = item
        status, correct = record.get("status"), record.get("correct")
        if not isinstance(status, str) or not isinstance(correct, bool):
            raise InputFormatError(
                f"{path}: row {line_no} has no verdict (`status`, `correct`)"
            )
        try:
            text = resolve_samples(record, spec).texts[0]
        except FieldError:
            text = ""
        try:
            gold: str | None = resolve_golds(record, spec)[1][0]
        except FieldError:
            gold = None
        group = tuple(
            MISSING if lookup(record, name) is None else str(lookup(record, name))
            for name in by
        )
        rows.append(
            Graded(
                line_no=line_no,
                rid=record_id(record, spec),
                group=group,
                correct=correct,
                status=status,
                extracted=record.get("extracted"),
                gold=gold,
                reason=str(record.get("reason", "")),
                version=str(record.get("grader_version") or ""),
                text_digest=hashlib.blake2b(text.encode(), digest_size=8).digest(),
                record=record if keep_record else None,
            )
        )
    return rows


@dataclass(slots=True, kw_only=True)
class DiffResult:
    """Pairs, flips, counts by direction per group, and the paired statistics."""

    joined_on: str
    paired: int
    only_in_a: int
    only_in_b: int
    versions_a: list[str]
    versions_b: list[str]
    accuracy_a: float
    accuracy_b: float
    lost: int  # correct -> not correct
    gained: int  # not correct -> correct
    flips: list[tuple[Graded, Graded]]
    by: list[str]
    directions: dict[tuple[str, ...], Counter[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        delta = paired_delta(self.lost, self.gained, self.paired)
        return {
            "schema": 1,
            "joined_on": self.joined_on,
            "paired": self.paired,
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            "grader_versions": {"a": self.versions_a, "b": self.versions_b},
            "accuracy": {"a": self.accuracy_a, "b": self.accuracy_b},
            "delta": {
                "value": delta.value,
                "stderr": delta.stderr,
                "ci95": [delta.low, delta.high],
            },
            "mcnemar": {
                "correct_to_wrong": self.lost,
                "wrong_to_correct": self.gained,
                "p_value": mcnemar_p(self.lost, self.gained),
                "test": "exact binomial, two-sided",
            },
            "by": self.by,
            "directions": [
                {"key": dict(zip(self.by, key, strict=True)), "counts": dict(counts)}
                for key, counts in sorted(self.directions.items())
            ],
            "flips": [_flip_dict(a, b) for a, b in self.flips],
        }


def direction(a: Graded, b: Graded) -> str:
    return f"{a.status}→{b.status}"


def _flip_dict(a: Graded, b: Graded) -> dict[str, Any]:
    return {
        "id": a.rid,
        "line_a": a.line_no,
        "line_b": b.line_no,
        "gold": a.gold,
        "extracted": {"a": a.extracted, "b": b.extracted},
        "status": {"a": a.status, "b": b.status},
        "correct": {"a": a.correct, "b": b.correct},
        "reason": {"a": a.reason, "b": b.reason},
        "grader_version": {"a": a.version, "b": b.version},
        "direction": direction(a, b),
    }


def _keys(rows: list[Graded]) -> list[str] | None:
    ids = [row.rid for row in rows]
    if any(rid is None for rid in ids) or len(set(ids)) != len(ids):
        return None
    return [rid for rid in ids if rid is not None]


def diff_files(
    path_a: str, path_b: str, spec: FieldSpec, by: Sequence[str]
) -> DiffResult:
    """Join the two files and compare every pair.

    Raises:
        InputFormatError: a pair's responses differ (the files do not line up).
    """
    rows_a = read_graded(path_a, spec, by)
    rows_b = read_graded(path_b, spec, by)
    keys_a, keys_b = _keys(rows_a), _keys(rows_b)
    if keys_a is not None and keys_b is not None:
        joined_on = "id"
        index_b = dict(zip(keys_b, rows_b, strict=True))
        pairs = [
            (a, index_b[k]) for k, a in zip(keys_a, rows_a, strict=True) if k in index_b
        ]
        only_a = len(rows_a) - len(pairs)
        only_b = len(rows_b) - len(pairs)
    else:
        joined_on = "position"
        pairs = list(zip(rows_a, rows_b, strict=False))
        only_a = max(0, len(rows_a) - len(rows_b))
        only_b = max(0, len(rows_b) - len(rows_a))
    for a, b in pairs:
        if a.text_digest != b.text_digest:
            raise InputFormatError(
                f"row {a.line_no} of {path_a} and row {b.line_no} of {path_b} have "
                f"different responses (joined on {joined_on}): the files do not line "
                "up; pass --id-field with a field that identifies each rollout"
            )
    flips = [(a, b) for a, b in pairs if (a.correct, a.status) != (b.correct, b.status)]
    directions: dict[tuple[str, ...], Counter[str]] = {}
    for a, b in flips:
        directions.setdefault(a.group, Counter())[direction(a, b)] += 1
    paired = len(pairs)
    return DiffResult(
        joined_on=joined_on,
        paired=paired,
        only_in_a=only_a,
        only_in_b=only_b,
        versions_a=sorted({r.version for r in rows_a if r.version}),
        versions_b=sorted({r.version for r in rows_b if r.version}),
        accuracy_a=sum(a.correct for a, _ in pairs) / paired if paired else 0.0,
        accuracy_b=sum(b.correct for _, b in pairs) / paired if paired else 0.0,
        lost=sum(a.correct and not b.correct for a, b in pairs),
        gained=sum(b.correct and not a.correct for a, b in pairs),
        flips=flips,
        by=list(by),
        directions=directions,
    )


def render_diff(result: DiffResult, *, max_flips: int = 50) -> str:
    """The terminal form: totals, directions per group, the paired test, flips."""
    data = result.to_dict()
    delta, test = data["delta"], data["mcnemar"]
    lines = [
        f"paired {result.paired:,} rollouts (joined on {result.joined_on}); "
        f"only in A: {result.only_in_a:,}, only in B: {result.only_in_b:,}",
        f"grader A: {', '.join(result.versions_a) or 'unknown'}",
        f"grader B: {', '.join(result.versions_b) or 'unknown'}",
        f"accuracy A {100 * result.accuracy_a:.2f}%  B {100 * result.accuracy_b:.2f}%"
        f"  delta {100 * delta['value']:+.2f} pts "
        f"(95% CI {100 * delta['ci95'][0]:+.2f} to {100 * delta['ci95'][1]:+.2f})",
        f"McNemar: {result.lost} correct→wrong, {result.gained} wrong→correct, "
        f"exact p = {test['p_value']:.4g}",
        f"flipped: {len(result.flips):,}",
    ]
    for key, counts in sorted(result.directions.items()):
        label = group_label(dict(zip(result.by, key, strict=True)))
        listed = ", ".join(f"{d}: {n}" for d, n in counts.most_common())
        lines.append(f"  {label}: {listed}")
    for a, b in result.flips[:max_flips]:
        lines.append(
            f"  {a.rid or f'line {a.line_no}'}: {direction(a, b)}  gold={a.gold!r}  "
            f"A={a.extracted!r} ({a.reason})  B={b.extracted!r} ({b.reason})"
        )
    if len(result.flips) > max_flips:
        lines.append(f"  ... and {len(result.flips) - max_flips} more (see --json)")
    return "\n".join(lines) + "\n"
