"""`gradefleet diff A B`: the verdicts that changed between two gradings of the same
rollouts (say, before and after a verifier change), with a paired test.

Rows are joined on their id (`workers.lines.fields.record_id`, with `sample_idx`) when
every row of both files has a distinct one, else on their position in the file; a
pair whose response texts differ stops the diff (the files do not line up).
`cached` is ignored; a flip is a change of `correct` or `status`.

Pairs are also counted per rollout kind (`kind`, "math" when absent) and per (kind,
data source) when rows name one (`data_source`, `dataset`). A flip of a code row
names its first failing test on each side (`workers.code.describe`): the flipped rows
are read again for their tests, so no test data is held for the whole file.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from producer.errors import InputFormatError
from producer.files.formats import iter_records
from producer.reports.report import (
    DEFAULT_KIND,
    MISSING,
    group_label,
    row_kind,
    row_source,
)
from producer.reports.stats import mcnemar_p, paired_delta
from workers.lines.fields import (
    FieldError,
    FieldSpec,
    record_id,
    resolve_golds,
    resolve_samples,
)
from workers.lines.records import LineError

__all__ = ["DiffResult", "Graded", "diff_files", "first_failures", "read_graded"]


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
    kind: str = DEFAULT_KIND
    data_source: str | None = None
    failure: dict[str, Any] | None = None
    tests: tuple[int | None, int | None] = (None, None)  # passed, total (code)


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
                **_code_fields(record),
            )
        )
    return rows


def _code_fields(record: dict[str, Any]) -> dict[str, Any]:
    failure = record.get("failure")
    return {
        "kind": row_kind(record),
        "data_source": row_source(record),
        "failure": failure if isinstance(failure, dict) else None,
        "tests": (record.get("tests_passed"), record.get("tests_total")),
    }


def first_failures(path: str, failures: dict[int, dict[str, Any]]) -> dict[int, str]:
    """Line number -> its first failing test as text, for the given lines of `path`
    (their `failure`), read again for the rows' tests."""
    from workers.code.describe import describe_failure

    found: dict[int, str] = {}
    if not failures:
        return found
    for item in iter_records(path):
        if isinstance(item, LineError) or item[0] not in failures:
            continue
        text = describe_failure(item[1], failures[item[0]])
        if text is not None:
            found[item[0]] = text
    return found


@dataclass(slots=True)
class KindCounts:
    """A kind's (or a kind and data source's) pairs and flips."""

    paired: int = 0
    correct_a: int = 0
    correct_b: int = 0
    lost: int = 0
    gained: int = 0
    flipped: int = 0

    def add(self, a: Graded, b: Graded) -> None:
        self.paired += 1
        self.correct_a += a.correct
        self.correct_b += b.correct
        self.lost += a.correct and not b.correct
        self.gained += b.correct and not a.correct
        self.flipped += (a.correct, a.status) != (b.correct, b.status)

    def to_dict(self, key: dict[str, str]) -> dict[str, Any]:
        n = self.paired
        return {
            "key": key,
            "paired": n,
            "accuracy": {
                "a": self.correct_a / n if n else 0.0,
                "b": self.correct_b / n if n else 0.0,
            },
            "correct_to_wrong": self.lost,
            "wrong_to_correct": self.gained,
            "flipped": self.flipped,
            "mcnemar_p": mcnemar_p(self.lost, self.gained),
        }


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
    kinds: dict[str, KindCounts] = field(default_factory=dict)
    sources: dict[tuple[str, str], KindCounts] = field(default_factory=dict)
    # Line -> first failing test, of the flipped code rows (A's and B's lines).
    failing_a: dict[int, str] = field(default_factory=dict)
    failing_b: dict[int, str] = field(default_factory=dict)

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
            "kinds": [
                counts.to_dict({"kind": kind})
                for kind, counts in sorted(self.kinds.items())
            ],
            "sources": [
                counts.to_dict({"kind": kind, "data_source": source})
                for (kind, source), counts in sorted(self.sources.items())
            ],
            "flips": [self._flip(a, b) for a, b in self.flips],
        }

    def _flip(self, a: Graded, b: Graded) -> dict[str, Any]:
        flip = _flip_dict(a, b)
        if a.kind != DEFAULT_KIND or b.kind != DEFAULT_KIND:
            flip["first_failure"] = {
                "a": self.failing_a.get(a.line_no),
                "b": self.failing_b.get(b.line_no),
            }
            flip["tests_passed"] = {"a": a.tests[0], "b": b.tests[0]}
            flip["tests_total"] = {"a": a.tests[1], "b": b.tests[1]}
        return flip


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
        "kind": a.kind,
        "data_source": a.data_source,
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
    kinds: dict[str, KindCounts] = {}
    sources: dict[tuple[str, str], KindCounts] = {}
    for a, b in pairs:
        kinds.setdefault(a.kind, KindCounts()).add(a, b)
        if a.data_source is not None:
            sources.setdefault((a.kind, a.data_source), KindCounts()).add(a, b)
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
        kinds=kinds,
        sources=sources,
        failing_a=first_failures(
            path_a, {a.line_no: a.failure for a, _ in flips if a.failure}
        ),
        failing_b=first_failures(
            path_b, {b.line_no: b.failure for _, b in flips if b.failure}
        ),
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
    lines += _kind_lines(data)
    for a, b in result.flips[:max_flips]:
        lines += _flip_lines(result, a, b)
    if len(result.flips) > max_flips:
        lines.append(f"  ... and {len(result.flips) - max_flips} more (see --json)")
    return "\n".join(lines) + "\n"


def _kind_lines(data: dict[str, Any]) -> list[str]:
    """Per kind (when there are several) and per (kind, data source)."""
    rows = (
        data["sources"] if len(data["kinds"]) < 2 else data["kinds"] + data["sources"]
    )
    lines = ["by kind / data source:"] if rows else []
    for row in rows:
        acc = row["accuracy"]
        lines.append(
            f"  {group_label(row['key'])}: paired {row['paired']:,}, accuracy A "
            f"{100 * acc['a']:.2f}% B {100 * acc['b']:.2f}%, flipped {row['flipped']:,}"
            f" ({row['correct_to_wrong']} correct→wrong, "
            f"{row['wrong_to_correct']} wrong→correct)"
        )
    return lines


def _flip_lines(result: DiffResult, a: Graded, b: Graded) -> list[str]:
    name = a.rid or f"line {a.line_no}"
    if a.kind == DEFAULT_KIND and b.kind == DEFAULT_KIND:
        return [
            f"  {name}: {direction(a, b)}  gold={a.gold!r}  "
            f"A={a.extracted!r} ({a.reason})  B={b.extracted!r} ({b.reason})"
        ]
    lines = [f"  {name} [{a.kind}]: {direction(a, b)}  A: {a.reason}  B: {b.reason}"]
    for side, row, failing in (("A", a, result.failing_a), ("B", b, result.failing_b)):
        text = failing.get(row.line_no)
        if text:
            lines.append(f"    {side} first failing {text}")
    return lines
