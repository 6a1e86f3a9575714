"""Line mode: the embedded pool's workers read and write a JSONL file's lines.

In item mode the CLI parses every line, sends each rollout to a worker, decodes its
verdict and encodes the output line: about 30 us of the CLI's CPU per rollout, on
one core, while the workers grade on the others (issue 11). In line mode the CLI
only reads raw lines and writes what comes back; a worker parses a unit of lines,
grades its rows (the same `grade_alternatives`, `graded_record`, `dump_line` as item
mode) and returns the output lines, its totals and its malformed lines. The pool's
limits hold per item as in item mode (`workers.local.LocalPool.run_units`).

A unit crosses the pipe as a little JSON (line numbers and sizes, the field spec,
the options) and its raw lines as bytes, so the worker reads each line exactly as
item mode reads it (`parse_line`), invalid UTF-8 included; the output lines come back
as UTF-8 bytes and are written as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from producer.batching import (
    InputRow,
    LineError,
    Summary,
    dump_line_bytes,
    grade_alternatives,
    graded_record,
    parse_line,
)
from producer.fields import FieldSpec
from workers.models import GradeOptions

if TYPE_CHECKING:  # not imported at run time: it pulls in the verifier
    from workers.local import GradePairs

__all__ = [
    "LINE_UNIT_LINES",
    "LineGrader",
    "LineUnitResult",
    "grade_line_unit",
    "line_unit",
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


def grade_line_unit(unit: Any, body: bytes, grade: GradePairs) -> tuple[Any, bytes]:
    """Run in a pool worker: a unit's totals and malformed lines, and its output
    lines as UTF-8."""
    spec = FieldSpec(response=unit["spec"][0], gold=unit["spec"][1])
    options = GradeOptions.from_dict(unit["options"])
    rows: list[InputRow] = []
    errors: list[list[Any]] = []
    start = 0
    for line_no, size in zip(unit["numbers"], unit["sizes"], strict=True):
        parsed = parse_line(body[start : start + size], line_no, spec)
        start += size
        if isinstance(parsed, LineError):
            errors.append([parsed.line_no, parsed.reason])
        elif parsed is not None:
            rows.extend(parsed)

    def grade_rows(todo: Sequence[InputRow], _advance: object) -> list[Any]:
        return grade([(row.response, row.gold) for row in todo], options)

    verdicts = grade_alternatives(rows, grade_rows, lambda _n: None)
    summary = Summary()
    out = []
    storable = True
    for row, verdict in zip(rows, verdicts, strict=True):
        line = dump_line_bytes(graded_record(row, verdict))
        # Replayed from the cache, a line must say `cached`: only a line that ends
        # with the verdict's `_FRESH` and has no other (see `_replayed`) is stored.
        storable = (
            storable
            and not verdict.cached
            and line.endswith(b"%s%d}\n" % (_FRESH, row.line_no))
            and line.count(_FRESH) == 1
        )
        out.append(line)
        summary.add(verdict)
    result = {"totals": summary.totals(), "errors": errors, "storable": storable}
    return result, b"".join(out)


# How every output line ends (`graded_record` puts the verdict fields last, then
# the line number, unless the input had those keys, which keep their place): in
# JSON text these quotes can only be keys, never inside a string (escaped there).
_FRESH = b'"cached":false,"gradefleet_line":'
_CACHED = b'"cached":true,"gradefleet_line":'


def _replayed(result: dict[str, Any], out: bytes) -> tuple[dict[str, Any], bytes]:
    """A unit's stored result as a re-grade writes it: every row `cached`."""
    totals = {**result["totals"], "cached": result["totals"]["graded"]}
    return {**result, "totals": totals}, out.replace(_FRESH, _CACHED)


class LineUnitResult:
    """What a worker returned for a unit, read back in the CLI."""

    def __init__(self, result: Any, out: bytes) -> None:
        if result.get("cached"):  # taken whole from the cache
            result, out = _replayed(result, out)
        self.out = out
        self.totals: dict[str, Any] = result["totals"]
        self.errors = [
            LineError(line_no=line_no, reason=reason)
            for line_no, reason in result["errors"]
        ]


class LineGrader:
    """Grades a chunk of raw lines as units on the pool (`run_units`, which applies
    the CLI's deadline). Returns each unit's lines with its result, None where
    there is none: the caller grades those lines as rows."""

    def __init__(
        self,
        run_units: RunUnits,
        spec: FieldSpec,
        options: GradeOptions,
        unit_lines: int = LINE_UNIT_LINES,
    ) -> None:
        self._run_units = run_units
        self._spec = spec
        self._options = options
        self._unit_lines = unit_lines

    def __call__(
        self, lines: Sequence[Line], advance: Callable[[int], None]
    ) -> list[tuple[Sequence[Line], LineUnitResult | None]]:
        size = self._unit_lines
        units = [lines[start : start + size] for start in range(0, len(lines), size)]
        results = self._run_units(
            [line_unit(unit, self._spec, self._options) for unit in units],
            [len(unit) for unit in units],
            advance,
        )
        return [
            (unit, None if result is None else LineUnitResult(*result))
            for unit, result in zip(units, results, strict=True)
        ]
