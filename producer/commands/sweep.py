"""Grade one rollout file: read it (any format `producer.files.formats` knows), one row
per sample, grade in rounds of `CHUNK_ROWS`, write every verdict in input order.

A row with several acceptable golds is graded against each (correct if any matches).
`--resume` reuses the final verdicts of an earlier output of the same input; rows a
deadline cut off come back as `timeout` stand-ins (`deadline_verdict`), are written,
and are listed by input line.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from itertools import chain
from typing import TYPE_CHECKING, Any

import click

from producer.commands.signals import raise_if_stopped
from producer.errors import DeadlinePassedError, InputFormatError
from producer.files.formats import (
    InputFormat,
    JsonlWriter,
    detect_format,
    iter_records,
    jsonl_lines,
    open_output,
)
from producer.files.overlap import BehindWriter, read_ahead, work_ahead
from workers.lines.fields import SAMPLE_FIELD, FieldSpec, resolve_samples
from workers.lines.records import (
    InputRow,
    LineError,
    Summary,
    expand_records,
    grade_alternatives,
    graded_record,
    growing_chunks,
)
from workers.lines.units import LineGrader, LineUnitResult, parse_lines
from workers.models import (
    Status,
    Verdict,
    is_final,
    ungraded_verdict,
)
from workers.sizing import CHUNK_ROWS, CHUNK_ROWS_GROWTH, FIRST_CHUNK_ROWS

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar

__all__ = [
    "DEADLINE_REASON",
    "REFUSED_REASON",
    "GradeRows",
    "Progress",
    "deadline_error",
    "deadline_verdict",
    "grade_file",
    "load_resumable",
    "refused_verdict",
]

MAX_ERRORS_SHOWN = 20
DEADLINE_REASON = "the --deadline-s passed before a result arrived"
REFUSED_REASON = "the broker refused writes before a result arrived"

Progress = Callable[[int], None]
GradeRows = Callable[[Sequence[InputRow], Progress], list[Verdict]]
RowKey = tuple[int, int | None]


def deadline_verdict() -> Verdict:
    """The stand-in for a rollout whose result did not arrive before the deadline."""
    return ungraded_verdict(Status.TIMEOUT, DEADLINE_REASON)


def refused_verdict() -> Verdict:
    """The stand-in for a rollout left without a result by a broker that refused
    writes (an `error`: `--resume` grades it again)."""
    return ungraded_verdict(Status.ERROR, REFUSED_REASON)


def _row_key(line_no: int, record: dict[str, Any]) -> RowKey:
    sample = record.get(SAMPLE_FIELD)
    return line_no, sample if isinstance(sample, int) else None


class _ErrorReport:
    """Prints the first malformed lines to stderr and counts the rest."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.count = 0

    def __call__(self, error: LineError) -> None:
        self.count += 1
        if self.count <= MAX_ERRORS_SHOWN:
            click.echo(f"gradefleet: {self.source}: {error}", err=True)

    def finish(self) -> None:
        hidden = self.count - MAX_ERRORS_SHOWN
        if hidden > 0:
            click.echo(f"gradefleet: ... and {hidden} more malformed lines", err=True)


def _count_lines(path: str) -> int | None:
    """Non-blank lines of a regular JSONL file (the progress bar's length)."""
    if path == "-" or not os.path.isfile(path):
        return None
    with open(path, "rb") as handle:
        if detect_format(handle.read(4)) is not InputFormat.JSONL:
            return None
        handle.seek(0)
        return sum(1 for line in handle if line.strip())


@contextmanager
def _progress(total: int | None, enabled: bool) -> Iterator[Progress]:
    if not enabled:
        yield lambda _n: None
        return
    bar: ProgressBar[int] = click.progressbar(
        length=total, label="grading", file=sys.stderr, show_pos=True, width=30
    )
    with bar:
        yield bar.update


def load_resumable(
    output_path: str, spec: FieldSpec
) -> dict[RowKey, tuple[str, Verdict]]:
    """(response, verdict) of an earlier output, by (input line, sample). Transient
    verdicts (`timeout`, `memory_limit`, `error`) are left out, so they are graded
    again, and a row is reused only if its response text is the same."""
    if output_path == "-" or not os.path.isfile(output_path):
        return {}
    kept: dict[RowKey, tuple[str, Verdict]] = {}
    for item in iter_records(output_path):
        if isinstance(item, LineError):
            continue
        record = item[1]
        line_no = record.get("gradefleet_line")
        if not isinstance(line_no, int):
            raise InputFormatError(f"--resume: {output_path} is not a graded file")
        try:
            verdict = Verdict.from_dict(record)
            texts = resolve_samples(record, spec).texts
        except (KeyError, ValueError):  # FieldError is a ValueError
            continue
        if not is_final(verdict):
            continue
        kept[_row_key(line_no, record)] = (texts[0], verdict.replace(cached=True))
    return kept


def _reusable(row: InputRow, kept: dict[RowKey, tuple[str, Verdict]]) -> bool:
    if not kept:  # no --resume: no row key to build, a row each, twice
        return False
    stored = kept.get(_row_key(row.line_no, row.record))
    return stored is not None and stored[0] == row.response


def grade_file(
    input_path: str,
    output_path: str,
    grade_rows: GradeRows,
    *,
    spec: FieldSpec,
    show_progress: bool,
    resume: bool = False,
    overlap: bool = False,
    grade_lines: LineGrader | None = None,
) -> Summary:
    """Grade `input_path` into `output_path` and return the run's totals.

    With `grade_lines` (the embedded pool or a fleet), JSONL in and out without
    `resume` goes in line mode (`workers.lines.units`): the workers parse the lines and
    write the output lines, and this process only moves bytes. Otherwise this
    process reads rows and writes verdicts. With `overlap`, the next chunk is read
    and the previous one written in threads while two are graded
    (`producer.files.overlap`): for a fleet, which grades elsewhere while this process
    waits on sockets, and whose client takes calls from two threads. Without it
    (the default), in turn: for the embedded pool, which takes one call at a time
    and whose workers share this machine's cores (the threads' GIL hand-offs cost
    more CPU than the overlap saves, issue 11).

    Rows the deadline cut off are written as `timeout`; their input lines are in
    `summary.late_lines` (see `deadline_error`).
    """
    summary = Summary()
    errors = _ErrorReport("<stdin>" if input_path == "-" else input_path)
    kept = load_resumable(output_path, spec) if resume else {}
    late_lines: list[int] = []
    lines = None
    if grade_lines is not None and not resume and not output_path.endswith(".parquet"):
        lines = jsonl_lines(input_path)
    with ExitStack() as stack:
        chunks, total = _chunks(input_path, spec, lines, show_progress, overlap)
        out = stack.enter_context(open_output(output_path))
        advance = stack.enter_context(_progress(total, show_progress))

        def write(chunk: tuple[list[InputRow], list[Verdict], int]) -> None:
            rows, verdicts, resumed = chunk
            for row, verdict in zip(rows, verdicts, strict=True):
                if verdict.reason == DEADLINE_REASON:
                    late_lines.append(row.line_no)
                out.write(graded_record(row, verdict))
                summary.add(verdict)
            summary.resumed += resumed

        if lines is not None:
            assert grade_lines is not None
            assert isinstance(out, JsonlWriter)
            if overlap:
                advance = _one_at_a_time(advance)  # two grading threads report

            def grade_chunk(chunk: list[Any]) -> list[Any]:
                raise_if_stopped()
                return _grade_line_chunk(chunk, grade_lines, advance)

            graded_chunks: Iterator[tuple[list[Any], list[Any]]]
            if overlap:  # as the row path's (`_grade_row_chunks`)
                graded_chunks = work_ahead(read_ahead(chunks), grade_chunk)
            else:
                graded_chunks = ((chunk, grade_chunk(chunk)) for chunk in chunks)
            for chunk, graded in graded_chunks:
                raise_if_stopped()
                bad = _write_line_chunk(
                    chunk, graded, grade_rows, spec, out, write, summary, advance
                )
                for error in sorted(bad, key=lambda error: error.line_no):
                    errors(error)
            raise_if_stopped()
            return _finish(summary, errors, late_lines)

        put: Callable[[Any], None] = write  # in turn, in this thread
        if overlap:  # order is kept either way
            put = stack.enter_context(BehindWriter(write)).put
        _grade_row_chunks(chunks, grade_rows, kept, overlap, errors, advance, put)
        raise_if_stopped()  # before the output is renamed into place
    return _finish(summary, errors, late_lines)


def _grade_row_chunks(
    chunks: Iterator[list[Any]],
    grade_rows: GradeRows,
    kept: dict[RowKey, tuple[str, Verdict]],
    overlap: bool,
    errors: Callable[[LineError], None],
    advance: Progress,
    put: Callable[[Any], None],
) -> None:
    """The row path: grade each chunk's rows (but those `--resume` keeps), report
    its malformed lines, and `put` its rows and verdicts, in input order. With
    `overlap` (a fleet), the next chunk is read in a thread and two chunks are
    graded at once (`work_ahead`: a job's tail no longer idles the fleet)."""

    def grade_chunk(chunk: list[Any]) -> list[Verdict]:
        raise_if_stopped()
        todo = [row for row in chunk if _graded_here(row, kept)]
        return grade_alternatives(todo, grade_rows, advance) if todo else []

    graded_chunks: Iterator[tuple[list[Any], list[Verdict]]]
    if overlap:
        advance = _one_at_a_time(advance)  # two grading threads report progress
        graded_chunks = work_ahead(read_ahead(chunks), grade_chunk)
    else:
        graded_chunks = ((chunk, grade_chunk(chunk)) for chunk in chunks)
    for chunk, graded_verdicts in graded_chunks:
        raise_if_stopped()
        rows = [row for row in chunk if isinstance(row, InputRow)]
        for bad_row in chunk:
            if isinstance(bad_row, LineError):
                errors(bad_row)
                advance(1)
        graded = iter(graded_verdicts)
        verdicts = [
            kept[_row_key(row.line_no, row.record)][1]
            if _reusable(row, kept)
            else next(graded)
            for row in rows
        ]
        put((rows, verdicts, len(rows) - len(graded_verdicts)))


def _one_at_a_time(advance: Progress) -> Progress:
    """`advance` behind a lock (click's progress bar is not thread-safe)."""
    lock = threading.Lock()

    def locked(count: int) -> None:
        with lock:
            advance(count)

    return locked


def _graded_here(row: InputRow | LineError, kept: dict[Any, Any]) -> bool:
    """A row to grade: not a malformed line, nor a row `--resume` keeps."""
    return isinstance(row, InputRow) and not _reusable(row, kept)


def _chunks(
    input_path: str,
    spec: FieldSpec,
    lines: Iterator[tuple[int, bytes] | LineError] | None,
    show_progress: bool,
    overlap: bool,
) -> tuple[Iterator[list[Any]], int | None]:
    """The input in growing chunks (of `lines`, else of rows), and the progress
    bar's length (lines; None when unknown or rows are not one per line). With
    `overlap` (rows graded while the chunk before is written), the file's last
    chunk goes in two (`growing_chunks`'s `split_tail`)."""
    if lines is not None:
        chunks: Iterator[list[Any]] = growing_chunks(
            lines, FIRST_CHUNK_ROWS, CHUNK_ROWS_GROWTH, CHUNK_ROWS, split_tail=overlap
        )
        return chunks, _count_lines(input_path) if show_progress else None
    rows_in = expand_records(iter_records(input_path), spec)
    chunks = growing_chunks(
        rows_in, FIRST_CHUNK_ROWS, CHUNK_ROWS_GROWTH, CHUNK_ROWS, split_tail=overlap
    )
    first = next(chunks, [])
    good = [row for row in first if isinstance(row, InputRow)]
    one_per_line = len({row.line_no for row in good}) == len(good)
    total = _count_lines(input_path) if show_progress and one_per_line else None
    return chain([first], chunks), total


def _grade_line_chunk(
    chunk: list[tuple[int, bytes] | LineError],
    grade_lines: LineGrader,
    advance: Progress,
) -> list[tuple[Sequence[tuple[int, bytes]], LineUnitResult | None]]:
    """Grade one chunk in line mode: each unit's lines with its result."""
    advance(sum(1 for item in chunk if isinstance(item, LineError)))
    lines = [item for item in chunk if not isinstance(item, LineError)]
    return grade_lines(lines, advance) if lines else []


def _write_line_chunk(
    chunk: list[tuple[int, bytes] | LineError],
    graded: list[tuple[Sequence[tuple[int, bytes]], LineUnitResult | None]],
    grade_rows: GradeRows,
    spec: FieldSpec,
    out: JsonlWriter,
    write: Callable[[tuple[list[InputRow], list[Verdict], int]], None],
    summary: Summary,
    advance: Progress,
) -> list[LineError]:
    """Write one chunk graded in line mode; returns its malformed lines. A unit
    without a result (no worker could run it, or a deadline) goes as rows, here."""
    bad = [item for item in chunk if isinstance(item, LineError)]
    for unit, result in graded:
        if result is None:
            rows, unit_bad = parse_lines(unit, spec)
            bad += unit_bad
            write((rows, grade_alternatives(rows, grade_rows, lambda _n: None), 0))
            advance(len(unit))
            continue
        out.write_lines(result.out)
        summary.add_totals(result.totals)
        bad += result.errors
    return bad


def _finish(summary: Summary, errors: _ErrorReport, late_lines: list[int]) -> Summary:
    errors.finish()
    summary.input_errors = errors.count
    summary.late_lines = sorted(set(late_lines))
    return summary


def deadline_error(summary: Summary) -> DeadlinePassedError:
    """What the CLI raises (exit 6) after writing a file the deadline cut short."""
    from producer.client.job import format_ranges

    return DeadlinePassedError(
        "results for some rollouts did not arrive by the deadline; they are written "
        f"as timeout (input lines {format_ranges(summary.late_lines)}); "
        "--resume grades just those"
    )
