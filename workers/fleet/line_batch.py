"""A fleet batch of input lines: the CLI's line mode on a fleet (issue 11).

In item mode the producer parses every JSONL line, sends each rollout, decodes each
verdict and encodes each output line: some 20 us of its CPU a rollout, on the cores
the fleet grades on. In line mode it stores a unit of raw lines
(`workers.lines.units.fleet_unit_payload`) and writes back the output lines a worker
rendered; the worker stores them beside the batch's result, which names them
(`protocol.line_result_json`, `protocol.line_output_key`).

A unit is graded whole in the task's grading process (`grade_fleet_unit`, run by
the runtime's `LocalPool`, as the embedded pool grades its units): it reads the
lines, grades their rows and renders the output there, so the task's process
never sees a rollout, only the payload going in and the output lines coming back
(before, it parsed the lines, sent every rollout to its sandbox child, decoded
every verdict and rendered: half its CPU a rollout). The pool keeps the item
deadline and memory cap; verdicts of a slow unit are kept as they come
(`UnitGrading.keep`) and saved like a batch's partial verdicts, so a lost worker
costs what a batch of items costs, and a re-delivery answers them from there.

A unit read in the task's process instead (`LineUnit.batch`: its rows as a batch of
items, graded through the sandbox by `tasks.BatchRun`) serves the rare rest: poison
verdicts after too many deliveries, a soft time limit, a unit whose grading process
was lost too often with no item to blame.

The lines are read and rendered with the CLI's own line code, kept below both sides
(`workers.lines.units`, `workers.lines.records`: no Celery, no SymPy): the output must
be byte for byte what the CLI writes in item mode, and that code is the format's one
definition. A unit the worker cannot grade as a batch (its lines do not add up,
too many rollouts, a text over the size limit) is answered "unfit": its producer
grades those lines in item mode. So is a unit holding code rows on a node that
does not take code (`--kinds math`): units go to the math queues, and in item mode
the producer sends each kind's rollouts to that kind's queues (`workers.wire.lanes`),
so the code rows reach the code workers.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.code.item import is_code_gold
from workers.embedded.pool import Unit, UnitGrading
from workers.fleet.code_metrics import code_tally, take_foreign_starts
from workers.lines.records import InputRow, alternative_items, choose_alternatives
from workers.lines.units import (
    FLEET_UNIT_HEAD,
    fleet_unit_lines,
    read_fleet_unit,
    render_unit,
)
from workers.models import GradeOptions, Verdict
from workers.sizing import FIRST_CHUNK_ITEMS, SAVE_AFTER_S, next_chunk_items
from workers.wire.contract import (
    WireBatchRequest,
    WireItem,
    batch_from_wire,
    pairs_error,
)
from workers.wire.protocol import line_output_key, line_result_json
from workers.wire.signing import Keyring

__all__ = [
    "GradedSummary",
    "LineBatch",
    "LineUnit",
    "grade_fleet_unit",
    "graded_summary",
    "is_line_unit",
    "line_unit_task",
]

_UNFIT_SHAPE = "its line numbers, sizes or field spec do not add up"
_UNFIT_CODE = "it holds code rows and this worker takes math only (--kinds)"


def is_line_unit(payload: bytes | None) -> bool:
    """Whether a batch's stored payload is a unit of lines (else its items)."""
    return payload is not None and payload.startswith(FLEET_UNIT_HEAD)


# What a task counts in its metrics of the items graded (`metrics.items_counted`):
# {status value: count}, the count without a valid format, the seconds of each,
# the kind and code counts (`code_metrics.code_tally`), and the code sandbox's
# starts in the grading process ([role, seconds] pairs).
GradedSummary = dict[str, Any]


def graded_summary(graded: Sequence[tuple[Verdict, float]]) -> GradedSummary:
    """The `GradedSummary` of (verdict, seconds) pairs (JSON)."""
    statuses = collections.Counter(verdict.status.value for verdict, _s in graded)
    return {
        "statuses": dict(statuses),
        "format_invalid": sum(not verdict.format_valid for verdict, _s in graded),
        "durations_s": [seconds for _v, seconds in graded],
        "code": code_tally(verdict for verdict, _s in graded),
        "sandbox_starts": take_foreign_starts(),
    }


@dataclass(frozen=True, slots=True)
class _ReadUnit:
    """A unit's lines read as item mode reads them: its rows and malformed lines,
    and its rollouts (a row per acceptable gold, `alternative_items`) in the
    order they are graded and numbered."""

    rows: list[InputRow]
    errors: list[list[Any]]
    pairs: list[tuple[str, str]]
    owners: list[int]

    def render(self, verdicts: Sequence[Verdict]) -> tuple[dict[str, Any], bytes]:
        """Its result meta and output lines from its rollouts' verdicts."""
        chosen = choose_alternatives(len(self.rows), self.owners, verdicts)
        return render_unit(self.rows, self.errors, chosen)


def _read_unit(payload: bytes, *, code: bool = True) -> _ReadUnit | str:
    """The unit `payload` read, or why it is unfit for a batch (`code`: whether this
    worker takes code rows)."""
    read = read_fleet_unit(payload)
    if read is None:
        return _UNFIT_SHAPE
    rows, errors = read
    items, owners = alternative_items(rows)
    pairs = [(row.response, row.gold) for row in items]
    if not code and any(is_code_gold(gold) for _response, gold in pairs):
        return _UNFIT_CODE
    unfit = pairs_error(pairs)
    return unfit if unfit is not None else _ReadUnit(rows, errors, pairs, owners)


def grade_fleet_unit(unit: Any, payload: bytes, grade: UnitGrading) -> Unit:
    """Run in a task's grading process (a `LocalPool` worker): a unit's result
    meta ("lines": totals and malformed lines; "rollouts"; "graded": the
    `GradedSummary` of what was graded since the last `keep`) and its output
    lines; or {"unfit": why} and no lines.

    `unit` holds the task's options and whether this worker takes code rows
    ("code"). Items are graded in growing chunks, as a
    batch's are; once `SAVE_AFTER_S` of grading is unkept, the verdicts so far are
    kept (with their summary, for the task to save and count). Grading is counted
    in the items' own seconds, not the unit's wall time: on a busy machine that
    passes 0.25 s while a unit of usual rollouts spent a fraction of it grading,
    and a keep costs the task's process a verdict decoded, encoded and stored per
    rollout. A culprit counts the time it cost the process lost on it: a unit sent
    again after a hang keeps the hang's verdict with its chunk, so a lost task
    does not wait out that deadline again.
    """
    read = _read_unit(payload, code=unit.get("code", True))
    if isinstance(read, str):
        return {"unfit": read}, b""
    pairs = read.pairs
    options = GradeOptions.from_dict(unit["options"])
    verdicts: list[Verdict] = []
    unkept: dict[int, Verdict] = {}
    counted = 0  # of grade.graded: those summed up in a keep
    unkept_s, summed = 0.0, 0  # seconds of those graded since, and how many
    start, size = 0, FIRST_CHUNK_ITEMS
    while start < len(pairs):
        end = min(start + size, len(pairs))
        # An earlier attempt's culprit ends its chunk: kept with it (its deadline
        # is at stake), so with several hangs in one chunk each attempt keeps one
        # more instead of grading the chunk again and keeping nothing.
        end = min((p + 1 for p in grade.culprits if start <= p < end), default=end)
        for verdict in grade(pairs[start:end], options):
            unkept[len(verdicts)] = verdict
            verdicts.append(verdict)
        start = end
        graded = grade.graded
        chunk_s = sum(seconds for _v, seconds in graded[summed:])
        summed = len(graded)
        unkept_s += chunk_s
        if start < len(pairs) and unkept_s >= SAVE_AFTER_S:
            grade.keep(unkept, graded_summary(graded[counted:]))
            unkept, counted, unkept_s = {}, len(graded), 0.0
        size = next_chunk_items(size, chunk_s)
    lines, out = read.render(verdicts)
    result = {
        "lines": lines,
        "rollouts": len(pairs),
        "graded": graded_summary(grade.graded[counted:]),
    }
    return result, out


@dataclass(frozen=True, slots=True)
class LineBatch:
    """A unit of lines as a batch: its rollouts (`request`), and its result from
    their verdicts in item order (`render`: the result's JSON text, and the output
    lines with the key to store them under, None when unfit)."""

    request: WireBatchRequest
    render: Callable[[list[Verdict]], tuple[str, tuple[str, bytes] | None]]


@dataclass(frozen=True, slots=True)
class LineUnit:
    """A unit of lines as its task receives it: ids and options (`head`, a request
    without rollouts: none is read here unless `batch` is called) and the payload."""

    head: WireBatchRequest
    payload: bytes
    items_digest: str
    keyring: Keyring | None
    # Its lines, from its head (at least 1): its rollouts are not counted here.
    lines: int
    # Whether this worker takes code rows (else a unit holding any is unfit).
    code: bool = True

    def result(
        self, lines: Mapping[str, Any], out: bytes | None
    ) -> tuple[str, tuple[str, bytes] | None]:
        """The task's result JSON from a unit's result meta (or {"unfit": why}) and
        its output lines, with the key to store those under (None when unfit)."""
        request = self.head
        output = None
        lines = dict(lines)
        if out is not None:
            key = line_output_key(request.batch_id, os.urandom(8).hex())
            lines.update(out_key=key, out_bytes=len(out))
            if self.keyring is not None:  # the MAC then covers the lines too
                lines["out_sha256"] = hashlib.sha256(out).hexdigest()
            output = (key, out)
        text = line_result_json(
            job_id=request.job_id,
            batch_id=request.batch_id,
            lines=lines,
            items_digest=self.items_digest,
            keyring=self.keyring,
        )
        return text, output

    def batch(self) -> LineBatch:
        """The unit read here, as a batch of its rollouts (item indexes: their
        order in `grade_fleet_unit`)."""
        read = _read_unit(self.payload, code=self.code)
        if isinstance(read, str):  # no rollouts: the result says why
            unfit = read
            return LineBatch(self.head, lambda _v: self.result({"unfit": unfit}, None))
        wire_items = tuple(
            WireItem(index=index, response=response, gold=gold)
            for index, (response, gold) in enumerate(read.pairs)
        )
        request = dataclasses.replace(self.head, items=wire_items)
        return LineBatch(request, lambda verdicts: self.result(*read.render(verdicts)))


def line_unit_task(
    wire: Mapping[str, Any],
    payload: bytes,
    items_digest: str,
    keyring: Keyring | None,
    *,
    code: bool = True,
) -> LineUnit:
    """The unit `payload` (`is_line_unit`) sent with task argument `wire`; `code`:
    whether this worker takes code rows.

    Raises:
        InvalidRequestError: the task argument itself is invalid (ids, options),
            as for a batch of items.
    """
    attached = {k: v for k, v in wire.items() if k != "items_key"}
    head = batch_from_wire({**attached, "items": []}, allow_empty=True)
    lines = max(1, fleet_unit_lines(payload) or 0)
    return LineUnit(head, payload, items_digest, keyring, lines, code)
