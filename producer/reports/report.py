"""`gradefleet report`: accuracy, pass@k and maj@k per group of a graded file.

Rows are read once and kept as compact columns (about 50 bytes a row: group, kind
and data source ids, prompt and answer hashes, flags, a code row's test score and
first failure), so memory grows with the row count but not with text sizes; the
statistics are computed per group at the end (`producer.reports.stats`).

Every report also splits the rows by rollout kind (`kind`: "math" when a row has none,
"code" for the code grader's rows) and, within a kind, by data source (`data_source`,
else `dataset`, when rows have one). A file may hold one grader version per kind
(math and code rows are graded by different graders); two versions of one kind are
refused unless `split_versions`. pass@k counts `correct` rows for every kind; maj@k
votes on canonical answers, which code rows do not have, so code prompts are left
out of it (a code-only group has no maj@k).

The JSON form (`Report.to_dict`, schema 1) is documented in docs/grading.md (Report):
`grader_version`, `grader_versions`, `grader_versions_by_kind`, `source`, `by`, `k`,
`prompt_key`, `maj_tie_break`, `overall`, `groups[]`, `kinds[]` and `sources[]`,
each with `key`, `n`, `prompts`, `correct`, `accuracy`, `stderr`, `ci95`,
`clustered`, `pass_at`, `maj_at`, `status_rates`, `format_valid_rate`,
`samples_per_prompt`, `test_score`, `failure_rates`.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from producer.errors import InputFormatError
from producer.reports.stats import clustered_interval, majority_index, pass_at_k_array
from workers.lines.fields import SAMPLE_FIELD, FieldSpec, lookup, prompt_key
from workers.lines.records import LineError
from workers.models import Status

__all__ = [
    "DEFAULT_KIND",
    "MAJ_TIE_BREAK",
    "REPORT_SCHEMA",
    "SOURCE_FIELDS",
    "GroupStats",
    "Report",
    "ReportBuilder",
    "default_ks",
    "group_label",
    "row_kind",
    "row_source",
]

REPORT_SCHEMA = 1
MAJ_TIE_BREAK = (
    "majority over the first k samples' canonical answers (canonical_pred, else "
    "extracted); samples without an answer do not vote; a tie goes to the answer "
    "seen first in sample order; no answer at all counts as wrong"
)
STATUSES = tuple(s.value for s in Status)
_STATUS_CODE = {value: code for code, value in enumerate(STATUSES)}
MISSING = "(none)"
KIND_FIELD = "kind"
DEFAULT_KIND = "math"  # a graded row without `kind` is the math verifier's
# Where a row names its data set (verl's `data_source`, else a `dataset` column).
SOURCE_FIELDS = ("data_source", "dataset")
_FLAG_CORRECT, _FLAG_VALID, _FLAG_NO_VOTE = 1, 2, 4


def row_kind(record: Mapping[str, Any]) -> str:
    """The rollout kind of a graded row ("math" when it has no `kind`)."""
    kind = record.get(KIND_FIELD)
    return kind if isinstance(kind, str) and kind else DEFAULT_KIND


def row_source(record: Mapping[str, Any]) -> str | None:
    """The row's data source (`SOURCE_FIELDS`, first present), or None."""
    for name in SOURCE_FIELDS:
        value = record.get(name)
        if value is not None and value != "":
            return value if isinstance(value, str) else str(value)
    return None


def default_ks(max_samples: int) -> list[int]:
    """1, then powers of two up to the most samples any prompt has, and that count."""
    ks = [1]
    while ks[-1] * 2 <= max_samples:
        ks.append(ks[-1] * 2)
    if max_samples > ks[-1]:
        ks.append(max_samples)
    return ks


def group_label(key: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in key.items()) or "overall"


@dataclass(slots=True, kw_only=True)
class GroupStats:
    """One row of the report (a group, or `overall`)."""

    key: dict[str, str]
    n: int
    prompts: int
    correct: int
    accuracy: float
    stderr: float
    ci95: tuple[float, float]
    clustered: bool
    pass_at: dict[int, float]
    maj_at: dict[int, float]
    status_rates: dict[str, float]
    format_valid_rate: float
    samples_per_prompt: tuple[int, int]
    # Code rows only: mean fraction of tests passed (NaN: no code row), and the
    # share of the group's rows whose first failing test failed so, per kind.
    test_score: float = math.nan
    failure_rates: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "n": self.n,
            "prompts": self.prompts,
            "correct": self.correct,
            "accuracy": _num(self.accuracy),
            "stderr": _num(self.stderr),
            "ci95": [_num(self.ci95[0]), _num(self.ci95[1])],
            "clustered": self.clustered,
            "pass_at": {str(k): _num(v) for k, v in self.pass_at.items()},
            "maj_at": {str(k): _num(v) for k, v in self.maj_at.items()},
            "status_rates": {k: _num(v) for k, v in self.status_rates.items()},
            "format_valid_rate": _num(self.format_valid_rate),
            "samples_per_prompt": {
                "min": self.samples_per_prompt[0],
                "max": self.samples_per_prompt[1],
            },
            "test_score": _num(self.test_score),
            "failure_rates": {k: _num(v) for k, v in self.failure_rates.items()},
        }


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


@dataclass(slots=True, kw_only=True)
class Report:
    """A whole report: versions, how prompts were keyed, overall and per group."""

    source: str
    grader_versions: list[str]
    by: list[str]
    ks: list[int]
    prompt_key_fields: dict[str, int]
    overall: GroupStats
    groups: list[GroupStats]
    kinds: list[GroupStats] = field(default_factory=list)
    sources: list[GroupStats] = field(default_factory=list)
    versions_by_kind: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def grader_version(self) -> str:
        return self.grader_versions[0] if len(self.grader_versions) == 1 else "mixed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "grader_version": self.grader_version,
            "grader_versions": self.grader_versions,
            "grader_versions_by_kind": self.versions_by_kind,
            "source": self.source,
            "by": self.by,
            "k": self.ks,
            "prompt_key": self.prompt_key_fields,
            "maj_tie_break": MAJ_TIE_BREAK,
            "overall": self.overall.to_dict(),
            "groups": [g.to_dict() for g in self.groups],
            "kinds": [g.to_dict() for g in self.kinds],
            "sources": [g.to_dict() for g in self.sources],
            **self.extra,
        }


class ReportBuilder:
    """Collects graded rows (`add`) and computes the report (`build`).

    Args:
        by: dotted field paths to group by (missing values group as "(none)").
        spec: overrides of the prompt-key field.
        split_versions: group by grader version first instead of refusing a file
            graded by several versions of one kind.
    """

    def __init__(
        self,
        by: Sequence[str] = (),
        *,
        spec: FieldSpec | None = None,
        split_versions: bool = False,
    ) -> None:
        self.by = (["grader_version"] if split_versions else []) + list(by)
        self.spec = spec or FieldSpec()
        self._group_ids: dict[tuple[str, ...], int] = {}
        self._kind_ids: dict[tuple[str, ...], int] = {}
        self._source_ids: dict[tuple[str, ...], int] = {}
        self._group = array("i")
        self._kind = array("i")
        self._source = array("i")
        self._prompt = array("q")
        self._order = array("q")
        self._answer = array("q")
        self._flags = array("b")  # _FLAG_CORRECT, _FLAG_VALID, _FLAG_NO_VOTE
        self._status = array("b")
        self._score = array("d")  # a code row's fraction of tests passed, else NaN
        self._failure = array("h")  # index in _failure_kinds, -1: none
        self._failure_kinds: dict[str, int] = {}
        self._has_source = False
        self.versions: Counter[str] = Counter()
        self.kind_versions: dict[str, Counter[str]] = {}
        self.prompt_key_fields: Counter[str] = Counter()

    def add(self, line_no: int, record: Mapping[str, Any]) -> None:
        """Take one graded row.

        Raises:
            InputFormatError: the row has no verdict (`status`, `correct`).
        """
        status = record.get("status")
        if status not in _STATUS_CODE or not isinstance(record.get("correct"), bool):
            raise InputFormatError(
                f"row {line_no} has no verdict (`status`, `correct`): report reads "
                "the output of `gradefleet grade`"
            )
        kind = row_kind(record)
        version = record.get("grader_version") or ""
        if version:
            self.versions[version] += 1
            counts = self.kind_versions.get(kind)
            if counts is None:
                counts = self.kind_versions[kind] = Counter()
            counts[version] += 1
        key = tuple(_key_value(record, name) for name in self.by)
        self._group.append(self._group_ids.setdefault(key, len(self._group_ids)))
        self._add_kind(kind, record)
        how, prompt = prompt_key(record, self.spec)
        self.prompt_key_fields[how] += 1
        answer = record.get("canonical_pred") or record.get("extracted")
        sample = record.get(SAMPLE_FIELD)
        self._prompt.append(hash((how, prompt)))
        self._order.append(sample if isinstance(sample, int) else len(self._order))
        self._answer.append(0 if answer is None else (hash(str(answer)) or 1))
        self._flags.append(
            bool(record["correct"]) * _FLAG_CORRECT
            | bool(record.get("format_valid")) * _FLAG_VALID
            | (kind != DEFAULT_KIND) * _FLAG_NO_VOTE
        )
        self._status.append(_STATUS_CODE[status])

    def _add_kind(self, kind: str, record: Mapping[str, Any]) -> None:
        """The row's kind, (kind, data source) and code figures."""
        source = row_source(record)
        if source is not None:
            self._has_source = True
        kind_ids = self._kind_ids
        key = (kind,)
        self._kind.append(kind_ids.get(key) or kind_ids.setdefault(key, len(kind_ids)))
        pair = (kind, MISSING if source is None else source)
        source_ids = self._source_ids
        self._source.append(
            source_ids.get(pair) or source_ids.setdefault(pair, len(source_ids))
        )
        if kind == DEFAULT_KIND:  # math rows have neither (the common case: fast)
            self._score.append(math.nan)
            self._failure.append(-1)
            return
        score = record.get("score")
        ok = isinstance(score, int | float) and not isinstance(score, bool)
        self._score.append(float(score) if ok else math.nan)  # type: ignore[arg-type]
        failure = record.get("failure")
        name = failure.get("kind") if isinstance(failure, Mapping) else None
        if isinstance(name, str):
            code = self._failure_kinds.setdefault(name, len(self._failure_kinds))
            self._failure.append(code)
        else:
            self._failure.append(-1)

    def add_all(self, items: Iterable[tuple[int, dict[str, Any]] | LineError]) -> int:
        """Add every record; returns how many lines were unreadable (skipped)."""
        bad = 0
        for item in items:
            if isinstance(item, LineError):
                bad += 1
            else:
                self.add(*item)
        return bad

    def check_versions(self) -> None:
        """Raises InputFormatError when rows of several grader versions of one kind
        would mix (one version per kind is how a mixed math/code file is graded)."""
        if "grader_version" in self.by:
            return
        for kind, versions in sorted(self.kind_versions.items()):
            if len(versions) > 1:
                listed = ", ".join(f"{v} ({n:,} rows)" for v, n in versions.items())
                raise InputFormatError(
                    f"{kind} rows graded by several grader versions ({listed}): "
                    "re-grade them with one, or pass --split-versions to report "
                    "each on its own"
                )

    def build(self, source: str, ks: Sequence[int] | None = None) -> Report:
        """The report over every row added so far (see `check_versions`)."""
        self.check_versions()
        # Every table reads its per-prompt votes from one table without groups.
        # Tables are made one at a time (each holds a few arrays a row).
        base = _PromptTable(self, array("i", bytes(4 * len(self._group))))
        table = self._table(self._group, self._group_ids, base)
        chosen = sorted(set(ks)) if ks else default_ks(table.max_samples)
        failures = list(self._failure_kinds)
        overall = table.stats({}, None, chosen, failures)
        groups = table.all_stats(self._group_ids, self.by, chosen, failures)
        del table
        kinds = self._table(self._kind, self._kind_ids, base).all_stats(
            self._kind_ids, [KIND_FIELD], chosen, failures
        )
        sources = (
            self._table(self._source, self._source_ids, base).all_stats(
                self._source_ids, [KIND_FIELD, "data_source"], chosen, failures
            )
            if self._has_source
            else []
        )
        return Report(
            source=source,
            grader_versions=sorted(self.versions),
            by=self.by,
            ks=chosen,
            prompt_key_fields=dict(self.prompt_key_fields),
            overall=overall,
            groups=groups if self.by else [],
            kinds=kinds,
            sources=sources,
            versions_by_kind={
                kind: sorted(versions)
                for kind, versions in sorted(self.kind_versions.items())
            },
        )

    def _table(
        self, groups: array[int], ids: Mapping[Any, int], base: _PromptTable
    ) -> _PromptTable:
        """The rows by `groups` (the base itself when there is one group or none)."""
        return base if len(ids) <= 1 else _PromptTable(self, groups, base)


def _key_value(record: Mapping[str, Any], path: str) -> str:
    if path == KIND_FIELD:
        return row_kind(record)
    value = lookup(record, path)
    if value is None or value == "":
        return MISSING
    return value if isinstance(value, str) else str(value)


class _PromptTable:
    """The rows sorted by (group, prompt, sample) with NumPy, so each group's prompts
    and rows are contiguous slices; per-prompt counts by `reduceat`. `groups` gives
    each row's group (the `--by` groups, the kinds, or (kind, data source)).

    maj@k is a Python loop over prompts, so a grouped table takes it from `base` (the
    same rows without groups) for every prompt whose rows all fell in one group
    (same first row, same size: the same rows in the same order)."""

    def __init__(
        self,
        builder: ReportBuilder,
        groups: array[int],
        base: _PromptTable | None = None,
    ) -> None:
        import numpy as np

        group = np.frombuffer(groups, dtype=np.int32)
        prompt = np.frombuffer(builder._prompt, dtype=np.int64)
        order = np.frombuffer(builder._order, dtype=np.int64)
        rows = np.lexsort((order, prompt, group))
        group, prompt = group[rows], prompt[rows]
        flags = np.frombuffer(builder._flags, dtype=np.int8)[rows]
        self.answers = np.frombuffer(builder._answer, dtype=np.int64)[rows]
        self.status = np.frombuffer(builder._status, dtype=np.int8)[rows]
        self.scores = np.frombuffer(builder._score, dtype=np.float64)[rows]
        self.failures = np.frombuffer(builder._failure, dtype=np.int16)[rows]
        self.row_group = group
        self.correct_rows = flags & _FLAG_CORRECT
        self.valid_rows = flags >> 1 & 1
        self.no_vote_rows = flags >> 2 & 1
        if len(rows):
            new = np.flatnonzero(
                (group[1:] != group[:-1]) | (prompt[1:] != prompt[:-1])
            )
            self.starts = np.concatenate(([0], new + 1)).astype(np.int64)
        else:
            self.starts = np.zeros(0, dtype=np.int64)
        self.sizes = np.diff(np.concatenate((self.starts, [len(rows)])))
        self.group = group[self.starts]
        self.correct = (
            np.add.reduceat(self.correct_rows, self.starts, dtype=np.int64)
            if len(rows)
            else self.sizes
        )
        self.max_samples = int(self.sizes.max()) if len(self.sizes) else 0
        self._pass: dict[int, Any] = {}
        self._maj: dict[int, Any] = {}
        # Row (input order) -> its prompt; for a grouped table, its prompts' base
        # prompts and whether they are the same rows.
        self.base = base
        if base is None:
            self.prompt_of_row = np.empty(len(rows), dtype=np.int64)
            self.prompt_of_row[rows] = np.repeat(np.arange(len(self.sizes)), self.sizes)
        else:
            self.base_prompt = base.prompt_of_row[rows[self.starts]]
            self.same_as_base = base.sizes[self.base_prompt] == self.sizes

    def _pass_at(self, k: int) -> Any:
        if k not in self._pass:
            self._pass[k] = pass_at_k_array(self.sizes, self.correct, k)
        return self._pass[k]

    def _maj_at(self, k: int) -> Any:
        """Per prompt; NaN for a prompt without k samples or of a kind that has no
        canonical answers to vote on (code)."""
        import numpy as np

        if k in self._maj:
            return self._maj[k]
        todo = self.sizes >= k
        out = np.full(len(self.sizes), np.nan)
        if self.base is not None:
            same = self.same_as_base
            out[same] = self.base._maj_at(k)[self.base_prompt[same]]
            todo &= ~same
        answers, correct = self.answers, self.correct_rows
        for i in np.flatnonzero(todo).tolist():
            start = int(self.starts[i])
            if self.no_vote_rows[start]:
                continue
            votes = answers[start : start + k].tolist()
            winner = majority_index([str(a) if a else None for a in votes])
            out[i] = 0.0 if winner is None else float(correct[start + winner])
        self._maj[k] = out
        return out

    def _slices(self, group: int | None) -> tuple[slice, slice]:
        """This group's prompts and rows (everything for `overall`)."""
        if group is None:
            return slice(None), slice(None)
        first, last = (int(x) for x in self.group.searchsorted([group, group + 1]))
        row_first = int(self.starts[first]) if first < len(self.starts) else 0
        row_last = (
            int(self.starts[last]) if last < len(self.starts) else len(self.status)
        )
        return slice(first, last), slice(row_first, row_last)

    def all_stats(
        self,
        ids: Mapping[tuple[str, ...], int],
        names: Sequence[str],
        ks: Sequence[int],
        failure_kinds: Sequence[str],
    ) -> list[GroupStats]:
        """One `GroupStats` a group id, in key order."""
        return [
            self.stats(dict(zip(names, key, strict=True)), gid, ks, failure_kinds)
            for key, gid in sorted(ids.items())
        ]

    def stats(
        self,
        key: dict[str, str],
        group: int | None,
        ks: Sequence[int],
        failure_kinds: Sequence[str] = (),
    ) -> GroupStats:
        import numpy as np

        mine, rows = self._slices(group)
        sizes = self.sizes[mine].astype(np.float64)
        correct = self.correct[mine].astype(np.float64)
        n, successes = int(sizes.sum()), int(correct.sum())
        interval = clustered_interval(
            n,
            successes,
            len(sizes),
            sum_c2=float((correct**2).sum()),
            sum_cn=float((correct * sizes).sum()),
            sum_n2=float((sizes**2).sum()),
        )
        counts = np.bincount(self.status[rows], minlength=len(STATUSES))
        valid = int(self.valid_rows[rows].sum())
        test_score, failure_rates = self._code_figures(rows, n, failure_kinds)
        return GroupStats(
            key=key,
            n=n,
            prompts=len(sizes),
            correct=successes,
            accuracy=interval.value,
            stderr=interval.stderr,
            ci95=(interval.low, interval.high),
            clustered=bool(n and sizes.max() > 1),
            pass_at=self._means(self._pass_at, mine, ks),
            maj_at=self._means(self._maj_at, mine, ks),
            status_rates={
                s: int(counts[c]) / n if n else math.nan for c, s in enumerate(STATUSES)
            },
            format_valid_rate=valid / n if n else math.nan,
            samples_per_prompt=(int(sizes.min()), int(sizes.max())) if n else (0, 0),
            test_score=test_score,
            failure_rates=failure_rates,
        )

    def _code_figures(
        self, rows: slice, n: int, failure_kinds: Sequence[str]
    ) -> tuple[float, dict[str, float]]:
        """Mean fraction of tests passed over rows that have one, and the share of
        rows (of the whole group) by first-failure kind."""
        import numpy as np

        scores = self.scores[rows]
        scored = scores[~np.isnan(scores)]
        mean = float(scored.mean()) if len(scored) else math.nan
        failures = self.failures[rows]
        found = np.bincount(failures[failures >= 0], minlength=len(failure_kinds))
        rates = {
            name: int(found[code]) / n
            for code, name in enumerate(failure_kinds)
            if code < len(found) and found[code]
        }
        return mean, rates

    def _means(
        self, per_prompt: Callable[[int], Any], mine: slice, ks: Sequence[int]
    ) -> dict[int, float]:
        """The metric averaged over the group's prompts with at least k samples
        (and, for maj@k, a kind that votes)."""
        import numpy as np

        out: dict[int, float] = {}
        sizes = self.sizes[mine]
        for k in ks:
            values = per_prompt(k)[mine][sizes >= k]
            values = values[~np.isnan(values)]
            if len(values):
                out[k] = float(values.mean())
        return out
