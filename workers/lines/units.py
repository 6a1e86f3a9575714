"""Line mode: the workers of the embedded pool or of a fleet read and write a
JSONL file's lines.

In item mode the CLI parses every line, sends each rollout to a worker, decodes its
verdict and encodes the output line: about 30 us of the CLI's CPU per rollout, on
one core, while the workers grade on the others (issue 11). In line mode the CLI
only reads raw lines and writes what comes back; a worker parses a unit of lines,
grades its rows (the same `grade_alternatives`, `graded_record`, `dump_line` as item
mode) and returns the output lines, its totals and its malformed lines. The pool's
limits hold per item as in item mode (`workers.embedded.pool.LocalPool.run_units`).

A unit crosses the pipe as a little JSON (line numbers and sizes, the field spec,
the options) and its raw lines as bytes, so the worker reads each line exactly as
item mode reads it (`parse_line`), invalid UTF-8 included; the output lines come back
as UTF-8 bytes and are written as they are.

With the cache on, a worker also keeps each unit's row verdicts under a hash of the
unit (`workers.cache.exact`); the CLI looks a chunk's units up before it sends any,
and renders a stored one (`replay_line_unit`: parse, the same `graded_values` and
`dump_line_bytes`, every verdict `cached`; a unit of usual lines without building
rows) without grading: so a re-graded file starts no grading pool. Many stored units
are rendered on the cores of a pool that never grades (`replay_stored_unit`, no
verifier warm-up; the stored text rides undecoded after the unit's lines), few in
the CLI itself. Once a chunk had a unit the cache lacked (a new file), the grading
pool's workers look up their units themselves and render those they find
(`grade_line_unit`), so the CLI no longer hashes between chunks.

On a fleet a unit is a task: its lines are stored in Redis in place of a batch's
items (`fleet_unit_payload`), a worker's grading process reads and grades them
and renders them with `render_unit` (`workers.fleet.line_batch`), and the producer gets
the output lines back as bytes with the totals and malformed lines
(`fleet_unit_result`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson

from workers.cache.exact import stored_unit
from workers.lines.fields import FieldSpec
from workers.lines.records import (
    VERDICT_FIELDS,
    InputRow,
    LineError,
    Summary,
    dump_line_bytes,
    grade_alternatives,
    grade_in_place,
    graded_values,
    read_line,
    read_record,
    usual_layout,
    verdict_values,
)
from workers.models import STATUS_BY_VALUE, GradeOptions, Verdict

if TYPE_CHECKING:  # not imported at run time: it pulls in the verifier
    from workers.embedded.pool import GradePairs

__all__ = [
    "FLEET_UNIT_HEAD",
    "LINE_UNIT_LINES",
    "UNIT_MAX_BYTES",
    "LineGrader",
    "LineUnitResult",
    "fleet_unit_lines",
    "fleet_unit_payload",
    "fleet_unit_result",
    "grade_line_unit",
    "line_unit",
    "parse_lines",
    "read_fleet_unit",
    "render_unit",
    "replay_body",
    "replay_line_unit",
    "replay_stored_unit",
]

Line = tuple[int, bytes]
# Lines per unit: a worker's batch, as LOCAL_BATCH_SIZE rollouts are in item mode.
LINE_UNIT_LINES = 64
# (units, rollouts per unit, progress) -> a result per unit, None where none came.
RunUnits = Callable[
    [Sequence[tuple[Any, bytes]], Sequence[int], Callable[[int], None]],
    list[tuple[Any, bytes] | None],
]


def line_unit(
    lines: Sequence[Line], spec: FieldSpec, options: GradeOptions
) -> tuple[Any, bytes]:
    """The unit a worker grades `lines` from: (line number, raw bytes) each."""
    meta = {
        "numbers": [line_no for line_no, _raw in lines],
        "sizes": [len(raw) for _no, raw in lines],
        "spec": [spec.response, spec.gold],
        "options": options.to_dict(),
    }
    return meta, b"".join(raw for _no, raw in lines)


def parse_lines(
    lines: Iterable[Line], spec: FieldSpec
) -> tuple[list[InputRow], list[LineError]]:
    """The rows of raw lines, as item mode reads them, and the malformed lines."""
    rows, errors, _floats = _parsed_lines(lines, spec)
    return rows, errors


def _parsed_lines(
    lines: Iterable[Line], spec: FieldSpec
) -> tuple[list[InputRow], list[LineError], bool]:
    """`parse_lines`, and whether a row's record may hold a float (`read_line`)."""
    rows: list[InputRow] = []
    errors: list[LineError] = []
    floats = False
    for line_no, raw in lines:
        parsed, may_float = read_line(raw, line_no, spec)
        if isinstance(parsed, LineError):
            errors.append(parsed)
        elif parsed is not None:
            rows.extend(parsed)
            floats = floats or may_float
    return rows, errors, floats


def _unit_rows(unit: Any, body: bytes) -> tuple[list[InputRow], list[list[Any]], bool]:
    """A unit's rows, its malformed lines as [line number, reason] (JSON), and
    whether a row's record may hold a float."""
    spec = FieldSpec(response=unit["spec"][0], gold=unit["spec"][1])
    rows, errors, floats = _parsed_lines(_unit_lines(unit, body), spec)
    return rows, [[error.line_no, error.reason] for error in errors], floats


def _unit_lines(unit: Any, body: bytes) -> Iterator[Line]:
    start = 0
    for line_no, size in zip(unit["numbers"], unit["sizes"], strict=True):
        yield line_no, body[start : start + size]
        start += size


def _render(
    rows: Sequence[InputRow], value_rows: Sequence[Sequence[Any]], floats: bool
) -> tuple[dict[str, Any], bytes]:
    """The output lines of rows with their verdicts (`verdict_values`), and their
    totals; `floats`: whether a row's record may hold a float."""
    graded = (
        graded_values(row, values) for row, values in zip(rows, value_rows, strict=True)
    )
    return _rendered(value_rows, graded, floats)


def _rendered(
    value_rows: Sequence[Sequence[Any]], graded: Iterable[dict[str, Any]], floats: bool
) -> tuple[dict[str, Any], bytes]:
    """The totals of verdicts given as `verdict_values`, and their output objects
    as lines (`floats`: whether one may hold a float; verdicts hold none)."""
    summary = Summary()
    summary.count_values(value_rows)
    dump = partial(dump_line_bytes, floats=floats)
    return summary.totals(), b"".join(map(dump, graded))


def grade_line_unit(unit: Any, body: bytes, grade: GradePairs) -> tuple[Any, bytes]:
    """Run in a pool worker: a unit's totals and malformed lines, and its output
    lines as UTF-8. The result also carries, under "store", what builds each
    row's final verdict as the cache keeps it (see `replay_line_unit`): built
    only with the cache on. A unit the worker found in the cache (the pool's
    `UnitGrading.stored`, when it looks units up itself) is rendered from that
    instead, when it fits, and offers nothing to store."""
    stored = getattr(grade, "stored", None)  # a plain GradePairs has none
    if stored is not None:
        replayed = replay_line_unit(unit, body, stored)
        if replayed is not None:
            return replayed
    options = GradeOptions.from_dict(unit["options"])
    rows, errors, floats = _unit_rows(unit, body)

    def grade_rows(todo: Sequence[InputRow], _advance: object) -> list[Any]:
        return grade([(row.response, row.gold) for row in todo], options)

    verdicts = grade_alternatives(rows, grade_rows, lambda _n: None)
    value_rows = [verdict_values(verdict) for verdict in verdicts]
    totals, out = _render(rows, value_rows, floats)

    def keep() -> dict[str, Any]:
        return {"fields": _STORED_FIELDS, "rows": value_rows}

    return {"totals": totals, "errors": errors, "store": keep}, out


def render_unit(
    rows: Sequence[InputRow], errors: list[list[Any]], verdicts: Sequence[Verdict]
) -> tuple[dict[str, Any], bytes]:
    """A unit's result as `grade_line_unit` gives it (without what the cache
    keeps), from its rows' verdicts: a fleet's line-mode task renders with this."""
    totals, out = _render(
        rows, [verdict_values(verdict) for verdict in verdicts], floats=True
    )
    return {"totals": totals, "errors": errors}, out


# A fleet line unit's stored payload begins with this, then its JSON (line numbers,
# sizes, field spec) on one line, then the lines: a worker tells it from a batch's
# items (a JSON list) by its first bytes, and the digest the task's MAC signs
# covers all of it.
FLEET_UNIT_HEAD = b"gradefleet-lines:1\n"


def fleet_unit_payload(unit: Any, body: bytes) -> bytes:
    """The payload a fleet worker grades a `line_unit` from (`read_fleet_unit`;
    the options travel with the task, signed)."""
    meta = {"numbers": unit["numbers"], "sizes": unit["sizes"], "spec": unit["spec"]}
    return FLEET_UNIT_HEAD + orjson.dumps(meta) + b"\n" + body


def fleet_unit_result(lines: Any) -> tuple[Any, bytes] | None:
    """A unit's result (as `grade_line_unit` gives it) from the `lines` of a fleet
    worker's result with its output lines as "out" (`producer.client.job`); None when
    the worker found the unit unfit (or the result is not what
    `workers.fleet.line_batch` stores): its lines are graded as rows."""
    if not isinstance(lines, dict):
        return None
    out, totals, errors = lines.get("out"), lines.get("totals"), lines.get("errors")
    if not (
        isinstance(out, bytes)
        and isinstance(totals, dict)
        and isinstance(errors, list)
        and all(
            isinstance(error, list)
            and len(error) == 2
            and type(error[0]) is int
            and isinstance(error[1], str)
            for error in errors
        )
    ):
        return None
    return {"totals": totals, "errors": errors}, out


def read_fleet_unit(payload: bytes) -> tuple[list[InputRow], list[list[Any]]] | None:
    """The rows and malformed lines ([line number, reason]) of a
    `fleet_unit_payload`, read as item mode reads them; None when it is not one
    (or is one that does not add up)."""
    split = _fleet_unit_split(payload)
    if split is None:
        return None
    meta, body = split
    rows, errors, _floats = _unit_rows(meta, body)
    return rows, errors


def fleet_unit_lines(payload: bytes) -> int | None:
    """The number of lines of a `fleet_unit_payload` (its head read, not its
    lines); None when it is not one (or is one that does not add up)."""
    split = _fleet_unit_split(payload)
    return None if split is None else len(split[0]["numbers"])


def _fleet_unit_split(payload: bytes) -> tuple[Any, bytes] | None:
    """A `fleet_unit_payload`'s JSON and its lines, None when they do not fit."""
    if not payload.startswith(FLEET_UNIT_HEAD):
        return None
    head_end = payload.find(b"\n", len(FLEET_UNIT_HEAD))
    if head_end < 0:
        return None
    try:
        meta = orjson.loads(payload[len(FLEET_UNIT_HEAD) : head_end])
    except orjson.JSONDecodeError:
        return None
    body = payload[head_end + 1 :]
    if not _fits(meta, len(body)):
        return None
    return meta, body


def _fits(meta: Any, body_bytes: int) -> bool:
    """Whether a fleet unit's JSON is what `fleet_unit_payload` writes for a body
    of `body_bytes`."""
    if not isinstance(meta, dict):
        return False
    numbers, sizes, spec = meta.get("numbers"), meta.get("sizes"), meta.get("spec")
    return (
        isinstance(numbers, list)
        and isinstance(sizes, list)
        and len(numbers) == len(sizes)
        and all(type(n) is int for n in numbers)
        and all(type(n) is int and n >= 0 for n in sizes)
        and sum(sizes) == body_bytes
        and isinstance(spec, list)
        and len(spec) == 2
        and all(name is None or isinstance(name, str) for name in spec)
    )


# What the cache keeps of each row's verdict: what its output line shows, as a
# list (names once a unit, not once a row), `cached` too (set when replayed):
# leaving it out cost a new list a row, a third of a worker's store (issue 11: 32
# of 87 ms of CPU on 60,760 rollouts). Rows kept without it (fields of an older
# gradefleet) do not fit: their units are graded again and stored anew.
_STORED_FIELDS = list(VERDICT_FIELDS)
_STATUS_AT = _STORED_FIELDS.index("status")
_CACHED_AT = _STORED_FIELDS.index("cached")


def _replayed_values(stored: list[Any]) -> list[Any]:
    stored[_CACHED_AT] = True  # a list of its own, freshly decoded
    return stored


def replay_line_unit(
    unit: Any, body: bytes, stored: str | bytes
) -> tuple[Any, bytes] | None:
    """A unit's result from what the cache kept of it (`ExactLayer.lookup_units`:
    its JSON), as a worker would write it with every verdict `cached`; None if it
    does not fit the unit."""
    kept = stored_unit(stored)
    if not (
        isinstance(kept, dict)
        and kept.get("fields") == _STORED_FIELDS
        and isinstance(kept.get("rows"), list)
        and all(_is_stored_row(values) for values in kept["rows"])
    ):
        return None  # not what this code stores: graded again
    value_rows = list(map(_replayed_values, kept["rows"]))
    usual = _usual_records(unit, body)
    if usual is not None:  # the usual file: no `InputRow`s (~1.5 us a row)
        records, floats = usual
        if len(records) != len(value_rows):
            return None
        graded = (
            grade_in_place(record, line_no, values)
            for record, line_no, values in zip(
                records, unit["numbers"], value_rows, strict=True
            )
        )
        totals, out = _rendered(value_rows, graded, floats)
        return {"totals": totals, "errors": []}, out
    rows, errors, floats = _unit_rows(unit, body)
    if len(rows) != len(value_rows):
        return None
    totals, out = _render(rows, value_rows, floats)
    return {"totals": totals, "errors": errors}, out


def _usual_records(unit: Any, body: bytes) -> tuple[list[dict[str, Any]], bool] | None:
    """Each line's object when, read with the default field spec, every line of
    the unit is one rollout in the usual layout (`usual_layout`), and whether one
    may hold a float (`read_record`); else None."""
    if unit["spec"] != [None, None]:
        return None
    records = []
    floats = False
    for line_no, raw in _unit_lines(unit, body):
        record, may_float = read_record(raw, line_no)
        if not (isinstance(record, dict) and usual_layout(record)):
            return None
        records.append(record)
        floats = floats or may_float
    return records, floats


def replay_stored_unit(unit: Any, body: bytes, _grade: GradePairs) -> tuple[Any, bytes]:
    """Run in a replay pool's worker (a `UnitFn` that never grades):
    `replay_line_unit` of a unit whose body is its lines followed by what the
    cache kept of it (`replay_body`); {"unfit": true} when that does not fit the
    unit (it is graded then)."""
    lines_end = sum(unit["sizes"])
    replayed = replay_line_unit(unit, body[:lines_end], body[lines_end:])
    return replayed if replayed is not None else ({"unfit": True}, b"")


def replay_body(body: bytes, stored: str | bytes) -> bytes:
    """The body of a unit sent to `replay_stored_unit`: the stored JSON rides
    after the lines as it was read (never decoded and encoded again here)."""
    return body + (stored.encode() if isinstance(stored, str) else stored)


def _is_stored_row(values: Any) -> bool:
    return (
        isinstance(values, list)
        and len(values) == len(_STORED_FIELDS)
        and values[_STATUS_AT] in STATUS_BY_VALUE
    )


class LineUnitResult:
    """What a worker returned for a unit, read back in the CLI."""

    def __init__(self, result: Any, out: bytes) -> None:
        self.out = out
        self.totals: dict[str, Any] = result["totals"]
        self.errors = [
            LineError(line_no=line_no, reason=reason)
            for line_no, reason in result["errors"]
        ]


# A unit's lines stop at this many bytes too: a fleet stores each unit in Redis
# and reads at most `contract.MAX_PAYLOAD_BYTES` of it (lines may be 4 MB each).
UNIT_MAX_BYTES = 8 * 1024 * 1024


def _cut(lines: Sequence[Line], size: int, max_bytes: int) -> list[Sequence[Line]]:
    """`lines` in order, cut into units of at most `size` lines and, but for a
    unit of one line, `max_bytes` bytes."""
    units: list[Sequence[Line]] = []
    start = used = 0
    for end, (_no, raw) in enumerate(lines):
        if end > start and (end - start >= size or used + len(raw) > max_bytes):
            units.append(lines[start:end])
            start, used = end, 0
        used += len(raw)
    if start < len(lines):
        units.append(lines[start:])
    return units


class LineGrader:
    """Grades a chunk of raw lines as units on the pool (`run_units`, which applies
    the CLI's deadline). Returns each unit's lines with its result, None where
    there is none: the caller grades those lines as rows."""

    def __init__(
        self,
        run_units: RunUnits,
        spec: FieldSpec,
        options: GradeOptions,
        unit_lines: int | Callable[[int], int] = LINE_UNIT_LINES,
    ) -> None:
        self._run_units = run_units
        self._spec = spec
        self._options = options
        # Lines per unit, or a function of the chunk's line count (a fleet's task
        # size follows its job, `sizing.batch_size_for`).
        self._unit_lines = unit_lines

    def __call__(
        self, lines: Sequence[Line], advance: Callable[[int], None]
    ) -> list[tuple[Sequence[Line], LineUnitResult | None]]:
        size = self._unit_lines
        if callable(size):
            size = size(len(lines))
        units = _cut(lines, size, UNIT_MAX_BYTES)
        results = self._run_units(
            [line_unit(unit, self._spec, self._options) for unit in units],
            [len(unit) for unit in units],
            advance,
        )
        return [
            (unit, None if result is None else LineUnitResult(*result))
            for unit, result in zip(units, results, strict=True)
        ]
