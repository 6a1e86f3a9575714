"""The wire contract between producers and workers: task name, queue, JSON shapes.

Pure stdlib: the producer imports this module without pulling in any worker code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from workers.errors import InvalidRequestError
from workers.models import GradeOptions, Verdict

__all__ = [
    "GRADE_BATCH",
    "MAX_AUTO_BATCH_SIZE",
    "QUEUE",
    "SCHEMA_VERSION",
    "WireBatch",
    "WireBatchRequest",
    "WireItem",
    "WireResult",
    "WireResultItem",
    "attach_items",
    "batch_from_wire",
    "batch_items_key",
    "batch_size_for",
    "batch_to_wire",
    "detach_items",
    "items_reference",
    "job_board_key",
    "job_done_key",
    "job_entry_key",
    "result_to_wire",
    "results_from_wire",
]

GRADE_BATCH = "gradefleet.grade_batch"
QUEUE = "gradefleet"
SCHEMA_VERSION = 1
# Rollouts per task, by measurement (tests/bench/bench_fleet.py --batch-sizes; 10,000
# real rollouts, 2 workers x 1 process, cold cache, 2 shared cores):
#   batch             64     128     256     512
#   rollouts/s      4168    5604    6118    7287
# A task costs a few ms of Celery/Redis work, so bigger batches go faster; but a job
# must also make enough tasks for every worker of a larger fleet to get some, and a
# few more to even out the tail (10,000 rollouts in 512s on 16 workers: a second wave
# of 4 tasks while 12 workers idle). So the size follows the job: JOB_BATCHES tasks
# per job, each of MIN_BATCH_SIZE to MAX_AUTO_BATCH_SIZE items (an 8,192-rollout RL
# step: 32 tasks of 256; 100,000 rollouts: 196 tasks of 512).
JOB_BATCHES = 32
MIN_BATCH_SIZE = 16
MAX_AUTO_BATCH_SIZE = 512


def batch_size_for(rollouts: int) -> int:
    """Rollouts per task for a job of `rollouts` (see the table above)."""
    return max(MIN_BATCH_SIZE, min(MAX_AUTO_BATCH_SIZE, -(-rollouts // JOB_BATCHES)))


def job_done_key(job_id: str) -> str:
    """A Redis list, next to the result keys, where a worker pushes a batch's id once
    its result is stored: the producer blocks on it (BLPOP) instead of polling."""
    return f"gradefleet:v1:done:{job_id}"


def job_board_key() -> str:
    """A Redis sorted set (broker): ids of jobs whose producer is watching them,
    scored by submission time (`producer.board`)."""
    return "gradefleet:v1:jobs"


def job_entry_key(job_id: str) -> str:
    """A Redis hash (broker): one job's lane and progress, for `gradefleet status`;
    it expires unless its producer refreshes it (`producer.board`)."""
    return f"gradefleet:v1:job:{job_id}"


# Bounds that keep one message from exhausting a worker before grading even starts.
MAX_ITEMS_PER_BATCH = 10_000
MAX_TEXT_CHARS = 1_000_000
MAX_ID_CHARS = 200
# Items stored by reference: read with GETRANGE up to this many bytes, so a bigger
# value is refused without being read whole.
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024


class WireItem(TypedDict):
    """One rollout inside a batch; `index` is its position in the producer's input."""

    index: int
    response: str
    gold: str


class WireBatch(TypedDict):
    """The single argument of the `gradefleet.grade_batch` task.

    Items travel either inline (`items`) or by reference (`items_key`, always
    `batch_items_key(batch_id)`): the producer stores their JSON in the broker's Redis
    and the message stays a few hundred bytes (see `detach_items`).
    """

    schema: int
    job_id: str
    batch_id: str
    attempt: NotRequired[int]
    enqueued_at: float
    options: dict[str, Any]
    items: NotRequired[list[WireItem]]
    items_key: NotRequired[str]


class WireResultItem(TypedDict):
    """One graded rollout: its input index and `Verdict.to_dict()`."""

    index: int
    verdict: dict[str, Any]


class WireResult(TypedDict):
    """What the task returns (stored by Celery in the result backend)."""

    schema: int
    job_id: str
    batch_id: str
    results: list[WireResultItem]


@dataclass(frozen=True, slots=True, kw_only=True)
class WireBatchRequest:
    """A validated batch, as the worker sees it."""

    job_id: str
    batch_id: str
    attempt: int
    enqueued_at: float
    options: GradeOptions
    items: tuple[WireItem, ...]


def batch_to_wire(
    *,
    job_id: str,
    batch_id: str,
    items: Sequence[tuple[int, str, str]],
    options: GradeOptions,
    enqueued_at: float,
    attempt: int = 1,
) -> WireBatch:
    """Build the task argument from `(index, response, gold)` triples."""
    return {
        "schema": SCHEMA_VERSION,
        "job_id": job_id,
        "batch_id": batch_id,
        "attempt": attempt,
        "enqueued_at": enqueued_at,
        "options": options.to_dict(),
        "items": [{"index": i, "response": r, "gold": g} for i, r, g in items],
    }


def batch_items_key(batch_id: str) -> str:
    """The Redis string (in the broker's Redis) holding a batch's items as JSON."""
    return f"gradefleet:v1:items:{batch_id}"


def detach_items(wire: WireBatch) -> tuple[WireBatch, str]:
    """`wire` with its items replaced by `items_key`, and the items' JSON text.

    Why: a batch of 256 real rollouts is ~120 KB. Inline, Celery's consumer decodes
    it, re-encodes it into the unacked hash, and pipes it to the pool process; by
    reference, only a few hundred bytes go through Celery and the grading process
    reads the items once, with one GET.
    """
    detached = wire.copy()
    items = detached.pop("items", [])
    detached["items_key"] = batch_items_key(wire["batch_id"])
    # ASCII-only JSON: model text may hold lone surrogates, which UTF-8 cannot carry.
    return detached, json.dumps(items)


def items_reference(data: Mapping[str, Any]) -> str | None:
    """The Redis key of a batch's items when they travel by reference, else None.

    Raises:
        InvalidRequestError: `items_key` is not `batch_items_key(batch_id)` (a
            message never picks which key a worker reads).
    """
    if "items_key" not in data:
        return None
    key = batch_items_key(_require_id(data, "batch_id"))
    if data["items_key"] != key:
        raise InvalidRequestError(f"items_key must be {key!r}")
    return key


def attach_items(data: Mapping[str, Any], payload: bytes | None) -> dict[str, Any]:
    """The wire `data` with its items read from `payload` (the stored JSON).

    Raises:
        InvalidRequestError: the payload is missing (it expired, or the producer
            finished or abandoned the job), over `MAX_PAYLOAD_BYTES`, or not JSON.
    """
    if not payload:
        raise InvalidRequestError(
            f"the items of batch {data.get('batch_id')} are not in Redis: they "
            "expired, or the producer finished or abandoned the job"
        )
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise InvalidRequestError(f"items payload over {MAX_PAYLOAD_BYTES} bytes")
    try:
        items = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequestError(f"items payload is not JSON: {exc}") from exc
    attached = {k: v for k, v in data.items() if k != "items_key"}
    attached["items"] = items
    return attached


def _require_id(data: Mapping[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise InvalidRequestError(f"{name} must be a non-empty string ≤ {MAX_ID_CHARS}")
    return value


def _item_from_wire(raw: object, position: int) -> WireItem:
    if not isinstance(raw, Mapping):
        raise InvalidRequestError(f"item {position} is not an object")
    index, response, gold = raw.get("index"), raw.get("response"), raw.get("gold")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise InvalidRequestError(f"item {position}: index must be an int ≥ 0")
    if not isinstance(response, str) or not isinstance(gold, str):
        raise InvalidRequestError(f"item {position}: response and gold must be str")
    longest = max(len(response), len(gold))
    if longest > MAX_TEXT_CHARS:
        raise InvalidRequestError(f"item {position}: text of {longest} chars")
    return {"index": index, "response": response, "gold": gold}


def _items_from_wire(raw: object) -> tuple[WireItem, ...]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequestError("items must be a non-empty list")
    if len(raw) > MAX_ITEMS_PER_BATCH:
        raise InvalidRequestError(f"batch has {len(raw)} items > {MAX_ITEMS_PER_BATCH}")
    items = tuple(_item_from_wire(item, pos) for pos, item in enumerate(raw))
    if len({item["index"] for item in items}) != len(items):
        raise InvalidRequestError("duplicate item indexes in batch")
    return items


def _options_from_wire(raw: object) -> GradeOptions:
    if raw is not None and not isinstance(raw, Mapping):
        raise InvalidRequestError("options must be an object")
    try:
        return GradeOptions.from_dict(raw)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"bad options: {exc}") from exc


def batch_from_wire(data: object) -> WireBatchRequest:
    """Validate a task argument strictly.

    Raises:
        InvalidRequestError: wrong schema version, types, sizes or duplicate indexes.
    """
    if not isinstance(data, Mapping):
        raise InvalidRequestError("batch must be a JSON object")
    if data.get("schema") != SCHEMA_VERSION:
        raise InvalidRequestError(f"unsupported schema {data.get('schema')!r}")
    attempt = data.get("attempt", 1)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise InvalidRequestError("attempt must be an int ≥ 1")
    enqueued_at = data.get("enqueued_at")
    if not isinstance(enqueued_at, int | float) or isinstance(enqueued_at, bool):
        raise InvalidRequestError("enqueued_at must be a number (unix seconds)")
    if not math.isfinite(enqueued_at):
        raise InvalidRequestError("enqueued_at must be finite")
    return WireBatchRequest(
        job_id=_require_id(data, "job_id"),
        batch_id=_require_id(data, "batch_id"),
        attempt=attempt,
        enqueued_at=float(enqueued_at),
        options=_options_from_wire(data.get("options")),
        items=_items_from_wire(data.get("items")),
    )


def result_to_wire(
    *, job_id: str, batch_id: str, results: Sequence[tuple[int, Verdict]]
) -> WireResult:
    """Build the task's return value, items sorted by index."""
    return {
        "schema": SCHEMA_VERSION,
        "job_id": job_id,
        "batch_id": batch_id,
        "results": [
            {"index": index, "verdict": verdict.to_dict()}
            for index, verdict in sorted(results, key=lambda pair: pair[0])
        ],
    }


def results_from_wire(data: object) -> list[tuple[int, Verdict]]:
    """Parse a task result into `(index, Verdict)` pairs.

    Raises:
        InvalidRequestError: the payload does not match `WireResult`.
    """
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA_VERSION:
        raise InvalidRequestError("result is not a schema-1 object")
    raw = data.get("results")
    if not isinstance(raw, list):
        raise InvalidRequestError("result has no results list")
    pairs: list[tuple[int, Verdict]] = []
    for item in raw:
        try:
            pairs.append((int(item["index"]), Verdict.from_dict(item["verdict"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequestError(f"malformed result item: {exc!r}") from exc
    return pairs
