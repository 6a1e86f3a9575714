"""Line mode: the embedded pool's workers read and write a JSONL file's lines.

In item mode the CLI parses every line, sends each rollout to a worker, decodes its
verdict and encodes the output line: about 30 us of the CLI's CPU per rollout, on
one core, while the workers grade on the others (issue 11). In line mode the CLI
only reads raw lines and writes what comes back; a worker parses a unit of lines,
grades its rows (the same `grade_alternatives`, `graded_record`, `dump_line` as item
mode) and returns the output lines, its totals and its malformed lines. The pool's
limits hold per item as in item mode (`workers.local.LocalPool.run_units`).

A unit crosses a pipe as JSON: its lines are sent as text decoded with
`surrogateescape`, so the worker gets every byte back, invalid UTF-8 included, and
reads each line exactly as item mode reads it (`parse_line`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from producer.batching import (
    InputRow,
    LineError,
    Summary,
    dump_line,
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
RunUnits = Callable[[Sequence[Any], Sequence[int], Callable[[int], None]], list[Any]]


def line_unit(lines: Sequence[Line], spec: FieldSpec, options: GradeOptions) -> Any:
    """The unit (JSON) a worker grades `lines` from: (line number, raw bytes) each."""
    return {
        "numbers": [line_no for line_no, _raw in lines],
        "lines": [raw.decode("utf-8", "surrogateescape") for _no, raw in lines],
        "spec": [spec.response, spec.gold],
        "options": options.to_dict(),
    }


def grade_line_unit(unit: Any, grade: GradePairs) -> Any:
    """Run in a pool worker: a unit's output lines, totals and malformed lines."""
    spec = FieldSpec(response=unit["spec"][0], gold=unit["spec"][1])
    options = GradeOptions.from_dict(unit["options"])
    rows: list[InputRow] = []
    errors: list[list[Any]] = []
    for line_no, text in zip(unit["numbers"], unit["lines"], strict=True):
        parsed = parse_line(text.encode("utf-8", "surrogateescape"), line_no, spec)
        if isinstance(parsed, LineError):
            errors.append([parsed.line_no, parsed.reason])
        elif parsed is not None:
            rows.extend(parsed)

    def grade_rows(todo: Sequence[InputRow], _advance: object) -> list[Any]:
        return grade([(row.response, row.gold) for row in todo], options)

    verdicts = grade_alternatives(rows, grade_rows, lambda _n: None)
    summary = Summary()
    out = []
    for row, verdict in zip(rows, verdicts, strict=True):
        out.append(dump_line(graded_record(row, verdict)))
        summary.add(verdict)
    return {"out": "".join(out), "totals": summary.totals(), "errors": errors}


class LineUnitResult:
    """What a worker returned for a unit, read back in the CLI."""

    def __init__(self, result: Any) -> None:
        self.out: str = result["out"]
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
            (unit, None if result is None else LineUnitResult(result))
            for unit, result in zip(units, results, strict=True)
        ]
