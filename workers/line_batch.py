"""A fleet batch of input lines: the CLI's line mode on a fleet (issue 11).

In item mode the producer parses every JSONL line, sends each rollout, decodes each
verdict and encodes each output line: some 20 us of its CPU a rollout, on the cores
the fleet grades on. In line mode it stores a unit of raw lines
(`producer.lines.fleet_unit_payload`) and writes back the output lines a worker
rendered; the worker reads the lines as the CLI reads them, grades their rows as
one batch (the same `tasks.BatchRun`: item limits, cache, partial saves and poison
verdicts per rollout) and stores the output lines beside the batch's result,
which names them (`protocol.line_result_json`, `protocol.line_output_key`).

The lines are read and rendered with the producer's own line code
(`producer.lines`, `producer.batching`: no Celery, no SymPy): the output must be
byte for byte what the CLI writes in item mode, and that code is the format's one
definition. A unit the worker cannot grade as a batch (its lines do not add up,
too many rollouts, a text over the size limit) is answered "unfit": its producer
grades those lines in item mode.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from producer.batching import InputRow, alternative_items, choose_alternatives
from producer.lines import FLEET_UNIT_HEAD, read_fleet_unit, render_unit
from workers.contract import WireBatchRequest, batch_from_wire
from workers.errors import InvalidRequestError
from workers.models import Verdict
from workers.protocol import line_output_key, line_result_json
from workers.signing import Keyring

__all__ = ["LineBatch", "is_line_unit", "line_batch"]


def is_line_unit(payload: bytes | None) -> bool:
    """Whether a batch's stored payload is a unit of lines (else its items)."""
    return payload is not None and payload.startswith(FLEET_UNIT_HEAD)


@dataclass(frozen=True, slots=True)
class LineBatch:
    """A unit of lines as a batch: its rollouts (`request`), and its result from
    their verdicts in item order (`render`: the result's JSON text, and the output
    lines with the key to store them under, None when unfit)."""

    request: WireBatchRequest
    render: Callable[[list[Verdict]], tuple[str, tuple[str, bytes] | None]]


def line_batch(
    wire: Mapping[str, Any],
    payload: bytes,
    items_digest: str,
    keyring: Keyring | None,
) -> LineBatch:
    """The batch of the unit `payload` (`is_line_unit`) sent with task argument
    `wire`.

    Raises:
        InvalidRequestError: the task argument itself is invalid (ids, options),
            as for a batch of items.
    """
    # The task argument itself (ids, options) first: invalid, the task fails as
    # for a batch of items.
    attached = {k: v for k, v in wire.items() if k != "items_key"}
    request = batch_from_wire({**attached, "items": []}, allow_empty=True)
    rows: list[InputRow] = []
    errors: list[list[Any]] = []
    owners: list[int] = []
    unfit: str | None = None
    read = read_fleet_unit(payload)
    if read is None:
        unfit = "its line numbers, sizes or field spec do not add up"
    else:
        rows, errors = read
        items, owners = alternative_items(rows)
        wire_items = [
            {"index": index, "response": row.response, "gold": row.gold}
            for index, row in enumerate(items)
        ]
        try:  # the rollouts' bounds (count, text sizes) are those of items
            request = batch_from_wire(
                {**attached, "items": wire_items}, allow_empty=True
            )
        except InvalidRequestError as exc:
            unfit = str(exc)

    def render(verdicts: list[Verdict]) -> tuple[str, tuple[str, bytes] | None]:
        lines: dict[str, Any]
        output = None
        if unfit is not None:
            lines = {"unfit": unfit}
        else:
            chosen = choose_alternatives(len(rows), owners, verdicts)
            meta, out = render_unit(rows, errors, chosen)
            key = line_output_key(request.batch_id, os.urandom(8).hex())
            lines = {**meta, "out_key": key, "out_bytes": len(out)}
            if keyring is not None:  # the MAC then covers the lines too
                lines["out_sha256"] = hashlib.sha256(out).hexdigest()
            output = (key, out)
        text = line_result_json(
            job_id=request.job_id,
            batch_id=request.batch_id,
            lines=lines,
            items_digest=items_digest,
            keyring=keyring,
        )
        return text, output

    return LineBatch(request, render)
