"""JSONL rollouts in and graded records out: line errors, chunking, output (pure).

Input: one JSON object per line; `workers.lines.fields` says which fields hold the
response(s) and gold(s) (a list of responses is one row per sample). Blank lines are
skipped. A line that cannot be used becomes a `LineError` and every other line is still
graded. Output: the input object (one per sample) plus `VERDICT_FIELDS` and
`gradefleet_line` (the 1-based input line number, so output can be joined back).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from fractions import Fraction
from itertools import islice
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson

from workers import models
from workers.code.item import (
    CODE_NESTED_FIELDS,
    CODE_ROW_FIELDS,
    TRIGGER_FIELDS,
    encode_code_gold,
    is_code_row,
)
from workers.lines.fields import (
    GOLD_FIELDS,
    LINE_FIELD,
    RESPONSE_FIELDS,
    FieldError,
    FieldSpec,
    resolve_golds,
    resolve_samples,
    sample_records,
)
from workers.models import Status, Verdict
from workers.wire.contract import text_error

__all__ = [
    "GOLD_FIELDS",
    "IO_BUFFER_BYTES",
    "LINE_FIELD",
    "MAX_LINE_BYTES",
    "RESPONSE_FIELDS",
    "VERDICT_FIELDS",
    "InputRow",
    "LineError",
    "Summary",
    "alternative_items",
    "atomic_output",
    "atomic_path",
    "choose_alternatives",
    "dump_line",
    "dump_line_bytes",
    "expand_records",
    "grade_alternatives",
    "grade_in_place",
    "graded_record",
    "graded_values",
    "growing_chunks",
    "parse_line",
    "parse_record",
    "read_line",
    "read_lines",
    "read_record",
    "read_records",
    "read_rows",
    "rows_from_record",
    "usual_layout",
    "verdict_values",
]

T = TypeVar("T")
# Input and output files are read and written this much at a time: with 8 KiB (the
# default), a 60 MB file took 7,500 reads and as many writes, each a hand-off of
# the GIL among the CLI's threads (31,000 futex calls on 60,760 rollouts, issue 11).
IO_BUFFER_BYTES = 1 << 20
DEFAULT_SPEC = FieldSpec()

# The verdict fields written to each output line: the canonical answer too (`report`
# votes over it for maj@k, so "1/2" and "0.5" count as one answer); the gold's
# canonical form stays internal.
VERDICT_FIELDS = tuple(
    name for name in models.VERDICT_FIELDS if name != "canonical_gold"
)
_VALUE_COUNT = len(VERDICT_FIELDS)
# Where `Verdict.to_row` holds the field the output leaves out.
_CANONICAL_GOLD_IN_ROW = models.VERDICT_FIELDS.index("canonical_gold")
_CORRECT_AT, _FORMAT_VALID_AT, _CACHED_AT, _STATUS_AT = (
    VERDICT_FIELDS.index(name)
    for name in ("correct", "format_valid", "cached", "status")
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# A record with one of these fields may be a code row (`workers.code.item`).
_CODE_TRIGGERS = TRIGGER_FIELDS
_CODE_KEPT = frozenset({*CODE_ROW_FIELDS, *CODE_NESTED_FIELDS, *TRIGGER_FIELDS})
# Longer lines are rejected without being held in memory (a CoT is ~1-20 KB).
MAX_LINE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class InputRow:
    """One usable input line: the fields to grade and the original object."""

    line_no: int
    response: str
    gold: str
    record: dict[str, Any]
    # Further acceptable golds (a list-valued gold field): correct if any matches.
    alt_golds: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LineError:
    """One input line that could not be used, with a reason for the user."""

    line_no: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.reason}"


def rows_from_record(
    record: dict[str, Any], line_no: int, spec: FieldSpec = DEFAULT_SPEC
) -> list[InputRow] | LineError:
    """One row per sample of `record` (see `workers.lines.fields`), or the line's
    error."""
    if (
        spec.response is None
        and spec.gold is None
        and usual_layout(record)
        and _CODE_TRIGGERS.isdisjoint(record)
    ):
        # The row the tables below resolve it to, without walking them (issue 11:
        # 5.5 of the CLI's ~30 us a row).
        return [
            InputRow(
                line_no=line_no,
                response=record["response"],
                gold=record["gold"],
                record=record,
            )
        ]
    if spec.gold is None and is_code_row(record):
        return _code_rows(record, line_no, spec)
    try:
        samples = resolve_samples(record, spec)
        gold_field, golds = resolve_golds(record, spec)
    except FieldError as exc:
        return LineError(line_no=line_no, reason=str(exc))
    return [
        InputRow(
            line_no=line_no,
            response=text,
            gold=golds[0],
            alt_golds=tuple(golds[1:]),
            record=sample_record,
        )
        for text, sample_record in zip(
            samples.texts, sample_records(record, samples, gold_field), strict=True
        )
    ]


def _code_rows(
    record: dict[str, Any], line_no: int, spec: FieldSpec
) -> list[InputRow] | LineError:
    """A code row's rows: one per sample, each graded against the row's tests (the
    gold is `encode_code_gold` of the whole record: pass@k over its samples)."""
    gold = encode_code_gold(record)
    try:
        samples = resolve_samples(record, spec)
    except FieldError as exc:
        return LineError(line_no=line_no, reason=str(exc))
    if (error := text_error("", gold)) is not None:
        return LineError(line_no=line_no, reason=f"code tests: {error}")
    copies = sample_records(record, samples, "", keep=_CODE_KEPT)
    return [
        InputRow(line_no=line_no, response=text, gold=gold, record=copy)
        for text, copy in zip(samples.texts, copies, strict=True)
    ]


def usual_layout(record: dict[str, Any]) -> bool:
    """Whether `record` is one rollout in the usual layout: one text under
    "response" and one under "gold" (the first names of their alias tables), within
    the size bound; with the default field spec, its one row is then these texts."""
    response, gold = record.get("response"), record.get("gold")
    return (
        type(response) is str
        and type(gold) is str
        and text_error(response, gold) is None
    )


def _has_float(value: object) -> bool:
    """Whether a parsed JSON value holds a float anywhere."""
    if isinstance(value, dict) and all(type(v) is str for v in value.values()):
        return False  # the usual record, all text: no walk (a row's read, each line)
    return _any_float(value, lambda _: True)


def _any_float(value: object, test: Callable[[float], bool]) -> bool:
    """Whether a float for which `test` holds sits anywhere in `value` (parsed JSON;
    iteratively: no depth limit)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and test(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_record(raw: bytes, line_no: int) -> dict[str, Any] | LineError | None:
    """One raw JSONL line as an object, a LineError, or None for a blank line."""
    return read_record(raw, line_no)[0]


def read_record(
    raw: bytes, line_no: int
) -> tuple[dict[str, Any] | LineError | None, bool]:
    """`parse_record`, and whether the object may hold a float: not when orjson
    read it (a line with one is read again by the stdlib), so that its output line
    needs no look for a NaN written as null (`dump_line_bytes`' `floats`)."""
    if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte order mark some editors write
    try:  # orjson: several times the stdlib's speed, on the CLI's one core
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass  # NaN, a lone surrogate, bad UTF-8 or JSON: the stdlib reads it below
    else:
        # orjson reads an integer beyond 64 bits as a float: a line with any float
        # is read again by the stdlib, so every line reads as `json.loads` reads it.
        if isinstance(record, dict) and not _has_float(record):
            return record, False
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason = f"invalid UTF-8 at byte {exc.start}"
        return LineError(line_no=line_no, reason=reason), False
    if not text.strip():
        return None, False
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        reason = f"invalid JSON: {exc.msg} at column {exc.colno}"
        return LineError(line_no=line_no, reason=reason), False
    except RecursionError:
        reason = "invalid JSON: nested too deeply"
        return LineError(line_no=line_no, reason=reason), False
    if not isinstance(record, dict):
        kind = type(record).__name__
        reason = f"expected a JSON object, got {kind}"
        return LineError(line_no=line_no, reason=reason), False
    return record, True


def parse_line(
    raw: bytes, line_no: int, spec: FieldSpec = DEFAULT_SPEC
) -> list[InputRow] | LineError | None:
    """Parse one raw line (bytes, newline included or not) into one row per sample;
    None for a blank line."""
    return read_line(raw, line_no, spec)[0]


def read_line(
    raw: bytes, line_no: int, spec: FieldSpec = DEFAULT_SPEC
) -> tuple[list[InputRow] | LineError | None, bool]:
    """`parse_line`, and whether its rows' records may hold a float (`read_record`:
    a row's record is the line's object or a part of it)."""
    record, floats = read_record(raw, line_no)
    if record is None or isinstance(record, LineError):
        return record, False
    return rows_from_record(record, line_no, spec), floats


def read_lines(
    stream: IO[bytes], *, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, bytes] | LineError]:
    """Yield `(line_no, raw line)`, or an error for a line over `max_line_bytes`,
    which is never held in memory whole (streaming)."""
    line_no = 0
    while True:
        raw = stream.readline(max_line_bytes + 1)
        if not raw:
            return
        line_no += 1
        if len(raw) > max_line_bytes:
            while raw and not raw.endswith(b"\n"):  # drain the rest of the long line
                raw = stream.readline(max_line_bytes)
            yield LineError(
                line_no=line_no, reason=f"line longer than {max_line_bytes} bytes"
            )
            continue
        yield line_no, raw


def read_records(
    stream: IO[bytes], *, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, dict[str, Any]] | LineError]:
    """Yield `(line_no, object)` or an error per non-blank line (streaming, bounded
    per line)."""
    for item in read_lines(stream, max_line_bytes=max_line_bytes):
        if isinstance(item, LineError):
            yield item
            continue
        line_no, raw = item
        record = parse_record(raw, line_no)
        if isinstance(record, LineError):
            yield record
        elif record is not None:
            yield line_no, record


def expand_records(
    records: Iterable[tuple[int, dict[str, Any]] | LineError],
    spec: FieldSpec = DEFAULT_SPEC,
) -> Iterator[InputRow | LineError]:
    """A row per sample of each record; errors pass through."""
    for item in records:
        if isinstance(item, LineError):
            yield item
            continue
        rows = rows_from_record(item[1], item[0], spec)
        if isinstance(rows, LineError):
            yield rows
        else:
            yield from rows


def read_rows(
    stream: IO[bytes],
    *,
    spec: FieldSpec = DEFAULT_SPEC,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[InputRow | LineError]:
    """Yield a row per sample, or an error per unusable non-blank line (streaming,
    bounded per line)."""
    return expand_records(read_records(stream, max_line_bytes=max_line_bytes), spec)


def growing_chunks(
    items: Iterable[T], first: int, growth: int, most: int, *, split_tail: bool = False
) -> Iterator[list[T]]:
    """Split `items` into lists of `first`, `first * growth`, ... up to `most` items
    each, in order.

    With `split_tail`, the last list (known by coming up short) of at least
    `2 * first` items is cut in two, its last quarter (at least `first`) on its
    own: a caller that writes each list once it is graded while the next is being
    graded (a fleet run) then has only that quarter left to write at the end.
    """
    if not 1 <= first <= most or growth < 1:
        raise ValueError(f"bad chunk sizes: {first}, x{growth}, up to {most}")
    iterator = iter(items)
    size = first
    while chunk := list(islice(iterator, size)):
        if split_tail and 2 * first <= len(chunk) < size:
            cut = len(chunk) - max(first, len(chunk) // 4)
            yield chunk[:cut]
            yield chunk[cut:]
            return
        yield chunk
        size = min(size * growth, most)


def grade_alternatives(
    rows: Sequence[InputRow],
    grade_rows: Callable[[Sequence[InputRow], Callable[[int], None]], list[Verdict]],
    advance: Callable[[int], None],
) -> list[Verdict]:
    """Grade each row against every acceptable gold: the first correct verdict, else
    the verdict against the first gold."""
    if not any(row.alt_golds for row in rows):
        return grade_rows(rows, advance)
    items, owners = alternative_items(rows)
    verdicts = grade_rows(items, lambda _n: None)
    advance(len(rows))
    return choose_alternatives(len(rows), owners, verdicts)


def alternative_items(rows: Sequence[InputRow]) -> tuple[list[InputRow], list[int]]:
    """A row per (row, acceptable gold), and the position of the row each came from
    (`grade_alternatives`, in two steps for a fleet's line-mode task)."""
    items: list[InputRow] = []
    owners: list[int] = []
    for position, row in enumerate(rows):
        if not row.alt_golds:
            items.append(row)
            owners.append(position)
            continue
        for gold in (row.gold, *row.alt_golds):
            items.append(dataclasses.replace(row, gold=gold, alt_golds=()))
            owners.append(position)
    return items, owners


def choose_alternatives(
    count: int, owners: Sequence[int], verdicts: Sequence[Verdict]
) -> list[Verdict]:
    """Each of `count` rows' verdict from those of its `alternative_items`: the
    first correct, else the one against its first gold."""
    chosen: list[Verdict | None] = [None] * count
    for owner, verdict in zip(owners, verdicts, strict=True):
        best = chosen[owner]
        if best is None or (verdict.correct and not best.correct):
            chosen[owner] = verdict
    return [v for v in chosen if v is not None]


def graded_record(row: InputRow, verdict: Verdict) -> dict[str, Any]:
    """The output object: input fields, then verdict fields (these win on clashes)."""
    return graded_values(row, verdict_values(verdict))


def verdict_values(verdict: Verdict) -> list[Any]:
    """A verdict's output fields' values, in `VERDICT_FIELDS` order (JSON types):
    its `to_row` without the gold's canonical form."""
    values = verdict.to_row()
    del values[_CANONICAL_GOLD_IN_ROW]
    return values


def graded_values(row: InputRow, values: Sequence[Any]) -> dict[str, Any]:
    """`graded_record` from a verdict's `verdict_values` (a line-mode worker's, or
    a row the cache kept)."""
    return grade_in_place(dict(row.record), row.line_no, values)


def grade_in_place(
    record: dict[str, Any], line_no: int, values: Sequence[Any]
) -> dict[str, Any]:
    """`record` (a line's own object, shared with no other row) made the output
    object of its one row: `graded_values` without the copy."""
    if len(values) == _VALUE_COUNT:
        record.update(zip(VERDICT_FIELDS, values, strict=True))
    else:  # a code verdict's values end with the dict of its own fields
        record.update(zip(VERDICT_FIELDS, values[:-1], strict=True))
        record.update(values[-1])
    record[LINE_FIELD] = line_no
    return record


def _json_default(value: object) -> object:
    # Values JSON has no type for, as Parquet input brings them (decimal, timestamp,
    # binary columns): written as text rather than failing the whole file.
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal | Fraction | timedelta):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def dump_line(record: Mapping[str, Any]) -> str:
    """One JSONL line (UTF-8 kept readable, newline included).

    Written by orjson (compact, several times faster than the stdlib: the CLI
    encodes every line on one core), with the stdlib's text for every value JSON has
    no type for (`_json_default`). What orjson cannot write as the stdlib reads it
    back goes through the stdlib instead: a lone surrogate (input JSON may carry
    `"\\ud800"`, and the verdict's `extracted` may echo it) is written as its JSON
    escape, which reads back as the same string and keeps the line valid JSON; an
    integer beyond 64 bits as it is; NaN or Infinity as the stdlib writes them
    (orjson would write null).
    """
    return dump_line_bytes(record).decode()


def dump_line_bytes(record: Mapping[str, Any], *, floats: bool = True) -> bytes:
    """`dump_line` as UTF-8 (what a line-mode worker sends back). `floats=False`:
    the caller knows `record` holds no float (`read_record`; verdict fields hold
    none), so no NaN can hide behind a null (looking was ~0.7 us a line, about a
    tenth of a re-graded line's rendering; issue 11)."""
    try:
        line = orjson.dumps(record, default=_json_default, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: a lone surrogate, a huge integer
        return _stdlib_line(record).encode()
    if floats and b"null" in line and _has_non_finite_float(record):
        return _stdlib_line(record).encode()
    return line + b"\n"


# Dates, times and str/int subclasses go to `_json_default` or the stdlib, as before.
_ORJSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
# Built once: `json.dumps` with a non-default argument builds an encoder per call.
_LINE_JSON = json.JSONEncoder(ensure_ascii=False, default=_json_default).encode


def _stdlib_line(record: Mapping[str, Any]) -> str:
    line = _LINE_JSON(record)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = _LONE_SURROGATE.sub(_escape_surrogate, line)
    return line + "\n"


def _has_non_finite_float(value: Any) -> bool:
    """Whether a NaN or an infinity sits anywhere in `value` (parsed JSON)."""
    return _any_float(value, lambda item: not math.isfinite(item))


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[IO[str]]:
    """Open `path` for writing so readers see the old file or the whole new one.

    Writes to a temporary file in the same directory and renames it into place only
    if the block finishes without an exception. `-` means standard output.
    """
    if path == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    with (
        atomic_path(path) as tmp_name,
        open(
            tmp_name, "w", encoding="utf-8", newline="\n", buffering=IO_BUFFER_BYTES
        ) as handle,
    ):
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary file's name beside `path`, renamed onto `path` only if the block
    finishes without an exception (else removed)."""
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or "."
    )
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
    os.close(fd)
    try:
        yield tmp_name
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def _rate(count: int, total: int) -> str:
    return f"{count / total:.1%}" if total else "n/a"


@dataclass(slots=True, kw_only=True)
class Summary:
    """Running totals over graded rows, rendered as the CLI's closing table."""

    graded: int = 0
    correct: int = 0
    format_valid: int = 0
    cached: int = 0
    input_errors: int = 0
    resumed: int = 0
    wall_s: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    # Input lines of rows written as `timeout` because the deadline passed first.
    late_lines: list[int] = field(default_factory=list)

    def add(self, verdict: Verdict) -> None:
        self.graded += 1
        self.correct += verdict.correct
        self.format_valid += verdict.format_valid
        self.cached += verdict.cached
        self.statuses[verdict.status.value] += 1

    def count_values(self, value_rows: Sequence[Sequence[Any]]) -> None:
        """`add` for verdicts given as their `verdict_values`, all at once."""
        self.graded += len(value_rows)
        self.correct += sum(values[_CORRECT_AT] for values in value_rows)
        self.format_valid += sum(values[_FORMAT_VALID_AT] for values in value_rows)
        self.cached += sum(values[_CACHED_AT] for values in value_rows)
        self.statuses.update(values[_STATUS_AT] for values in value_rows)

    def totals(self) -> dict[str, Any]:
        """The verdict totals as JSON (a line-mode worker's, see `add_totals`)."""
        return {
            "graded": self.graded,
            "correct": self.correct,
            "format_valid": self.format_valid,
            "cached": self.cached,
            "statuses": dict(self.statuses),
        }

    def add_totals(self, totals: dict[str, Any]) -> None:
        """Add the verdict totals of rows counted elsewhere (`totals()`)."""
        self.graded += totals["graded"]
        self.correct += totals["correct"]
        self.format_valid += totals["format_valid"]
        self.cached += totals["cached"]
        self.statuses.update(totals["statuses"])

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs in display order; every status is listed."""
        n = self.graded
        throughput = f"{n / self.wall_s:,.1f} rollouts/s" if self.wall_s > 0 else "n/a"
        rows = [
            ("rollouts graded", f"{n:,}"),
            ("accuracy", _rate(self.correct, n)),
            ("format valid", _rate(self.format_valid, n)),
        ]
        rows += [(f"  {s.value}", _rate(self.statuses[s.value], n)) for s in Status]
        rows += [
            ("cache hit rate", _rate(self.cached, n)),
            ("input errors", f"{self.input_errors:,}"),
            *([("resumed from output", f"{self.resumed:,}")] if self.resumed else []),
            ("throughput", throughput),
            ("wall time", f"{self.wall_s:.2f} s"),
        ]
        return rows

    def render(self) -> str:
        """A two-column plain-text table (no colours, safe to paste in a log)."""
        rows = self.rows()
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {value}" for label, value in rows) + "\n"
