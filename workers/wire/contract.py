"""The task message between producers and workers: task name, queue, batch shape.

Pure stdlib: the producer imports this module without pulling in any worker code.
Redis keys and the result envelope are in `workers.wire.protocol`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import orjson

from workers.errors import InvalidRequestError
from workers.models import CODE_GOLD_PREFIX, GradeOptions
from workers.wire.protocol import SCHEMA_VERSION, batch_items_key, indexes_read_alike
from workers.wire.signing import Keyring, items_digest

__all__ = [
    "GRADE_BATCH",
    "KEY_STATS_FIELD",
    "KINDS_STATS_FIELD",
    "MAX_BATCH_TEXT_CHARS",
    "MAX_CODE_GOLD_CHARS",
    "MAX_TEXT_CHARS",
    "QUEUE",
    "WireBatch",
    "WireBatchRequest",
    "WireItem",
    "attach_items",
    "batch_from_wire",
    "batch_sizes",
    "batch_to_wire",
    "detach_items",
    "items_reference",
    "pairs_error",
    "sign_task",
    "task_mac_ok",
    "text_error",
    "wire_items_digest",
]

GRADE_BATCH = "gradefleet.grade_batch"
QUEUE = "gradefleet"
# The field of a worker's `stats` reply (Celery's control bus) that says whether it
# holds the fleet key: `{"keyed": bool, "signing_key_id": str | None}` (the id every
# tag already carries, never the key). `gradefleet status` shows it.
KEY_STATS_FIELD = "gradefleet_fleet_key"
# The field of the same reply that lists the rollout kinds whose queues the worker
# consumes (`workers.wire.lanes`): what `/readyz` of a service on a fleet reads to
# say whether code can be graded. A worker from before kinds omits it (it took math's
# queues only, the only ones there were).
KINDS_STATS_FIELD = "gradefleet_kinds"
# Bounds that keep one message from exhausting a worker before grading even starts.
MAX_ITEMS_PER_BATCH = 10_000
MAX_TEXT_CHARS = 1_000_000
# A code rollout's gold holds its tests (stdin/stdout pairs can be megabytes): the
# bound of a file's line (`lines.records.MAX_LINE_BYTES`), not a math answer's.
MAX_CODE_GOLD_CHARS = 4_000_000
# A batch's rollouts (responses and golds) stop at this many characters, whatever
# the batch size (a batch of one may hold more): its stored JSON, at most ~6 bytes a
# character (\uXXXX escapes), stays under `MAX_PAYLOAD_BYTES`.
MAX_BATCH_TEXT_CHARS = 8_000_000
MAX_ID_CHARS = 200
# Items stored by reference: read with GETRANGE up to this many bytes, so a bigger
# value is refused without being read whole.
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024


def text_error(response: str, gold: str) -> str | None:
    """Why a rollout's text is refused (over `MAX_TEXT_CHARS`, a code gold over
    `MAX_CODE_GOLD_CHARS`), else None: the one size check, made by the producer at
    its entry and by the worker at the wire."""
    if len(response) > MAX_TEXT_CHARS:
        return f"text of {len(response):,} characters (limit {MAX_TEXT_CHARS:,})"
    limit = MAX_CODE_GOLD_CHARS if gold.startswith(CODE_GOLD_PREFIX) else MAX_TEXT_CHARS
    if len(gold) > limit:
        return f"text of {len(gold):,} characters (limit {limit:,})"
    return None


def batch_sizes(text_chars: Iterable[int], max_items: int) -> Iterator[int]:
    """The sizes of the batches that rollouts, given in order as their response's
    and gold's characters, are cut into: at most `max_items` each, and at most
    `MAX_BATCH_TEXT_CHARS` characters unless a batch of one (a batch of code
    rollouts with megabytes of tests each would otherwise pass `MAX_PAYLOAD_BYTES`
    and be refused whole). Lazy: the first size reads no further than it needs."""
    taken = used = 0
    for chars in text_chars:
        if taken and (taken >= max_items or used + chars > MAX_BATCH_TEXT_CHARS):
            yield taken
            taken = used = 0
        taken += 1
        used += chars
    if taken:
        yield taken


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
    mac: NotRequired[str]  # `sign_task`: binds ids, items and options
    # The producer keeps its job's board entry (`protocol.job_entry_key`) alive
    # while it lives: a worker skips the batch at once when the entry is gone.
    kept_alive: NotRequired[bool]


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
    kept_alive: bool = False,
) -> WireBatch:
    """Build the task argument from `(index, response, gold)` triples."""
    wire: WireBatch = {
        "schema": SCHEMA_VERSION,
        "job_id": job_id,
        "batch_id": batch_id,
        "attempt": attempt,
        "enqueued_at": enqueued_at,
        "options": options.to_dict(),
        "items": [{"index": i, "response": r, "gold": g} for i, r, g in items],
    }
    if kept_alive:
        wire["kept_alive"] = True
    return wire


def detach_items(wire: WireBatch) -> tuple[WireBatch, bytes]:
    """`wire` with its items replaced by `items_key`, and the items' JSON (UTF-8).

    Why: a batch of 256 real rollouts is ~120 KB. Inline, Celery's consumer decodes
    it, re-encodes it into the unacked hash, and pipes it to the pool process; by
    reference, only a few hundred bytes go through Celery and the grading process
    reads the items once, with one GET.
    """
    detached = wire.copy()
    items = detached.pop("items", [])
    detached["items_key"] = batch_items_key(wire["batch_id"])
    try:
        # orjson: a quarter of `json.dumps`'s CPU for real rollouts (70 vs 240 us
        # for 64 of them), paid by the producer's one publishing thread per batch.
        # Kept as bytes: decoding real (non-ASCII) text to hash and store it as a
        # str cost more than encoding it (1.9 us a rollout, issue 11).
        return detached, orjson.dumps(items)
    except orjson.JSONEncodeError:
        # Model text may hold lone surrogates, which UTF-8 cannot carry: then
        # ASCII-only JSON (escapes), which any JSON reader decodes to the same.
        return detached, json.dumps(items).encode("ascii")


def _task_mac_parts(
    job_id: str, batch_id: str, digest: str, options: Mapping[str, Any]
) -> tuple[str, str, str, str]:
    return (job_id, batch_id, digest, json.dumps(options, sort_keys=True))


def sign_task(wire: WireBatch, items_json: bytes | str, keyring: Keyring) -> WireBatch:
    """`wire` with a MAC over its job id, batch id, items and options: a worker with
    the key grades no message that was not built by a holder of the key, and no
    items but those the MAC names (`task_mac_ok`)."""
    parts = _task_mac_parts(
        wire["job_id"], wire["batch_id"], items_digest(items_json), wire["options"]
    )
    return {**wire, "mac": keyring.sign("task", *parts)}


def task_mac_ok(
    request: WireBatchRequest, mac: object, digest: str, keyring: Keyring
) -> bool:
    """Whether `mac` signs this request's ids and options with items of `digest`."""
    parts = _task_mac_parts(
        request.job_id, request.batch_id, digest, request.options.to_dict()
    )
    return keyring.verify(mac, "task", *parts)


def wire_items_digest(data: Mapping[str, Any], payload: bytes | None) -> str:
    """The digest of a batch's items: of the stored payload (by reference), else of
    the inline items as the producer encodes them (`detach_items`)."""
    if payload is not None:
        return items_digest(payload)
    return items_digest(json.dumps(data.get("items")))


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
        items = _read_items(payload)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequestError(f"items payload is not JSON: {exc}") from exc
    attached = {k: v for k, v in data.items() if k != "items_key"}
    attached["items"] = items
    return attached


def _read_items(payload: bytes) -> Any:
    """The stored items as `json.loads` reads them, at orjson's speed where that
    gives the same (5x the stdlib on real items: ~5 us a rollout of a worker's CPU;
    see `protocol.indexes_read_alike`)."""
    try:
        items = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)
    return items if indexes_read_alike(items) else json.loads(payload)


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
    if (error := text_error(response, gold)) is not None:
        raise InvalidRequestError(f"item {position}: {error}")
    return {"index": index, "response": response, "gold": gold}


def pairs_error(pairs: Sequence[tuple[str, str]]) -> str | None:
    """Why a batch of these (response, gold) pairs is refused (too many, a text
    over the size limit), else None: the wire's bounds on items, for rollouts a
    worker reads itself (`workers.fleet.line_batch`)."""
    if len(pairs) > MAX_ITEMS_PER_BATCH:
        return _too_many(len(pairs))
    for position, (response, gold) in enumerate(pairs):
        if (error := text_error(response, gold)) is not None:
            return f"item {position}: {error}"
    return None


def _too_many(count: int) -> str:
    return f"batch has {count} items > {MAX_ITEMS_PER_BATCH}"


def _items_from_wire(raw: object, *, allow_empty: bool) -> tuple[WireItem, ...]:
    if not isinstance(raw, list) or not (raw or allow_empty):
        raise InvalidRequestError("items must be a non-empty list")
    if len(raw) > MAX_ITEMS_PER_BATCH:
        raise InvalidRequestError(_too_many(len(raw)))
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


def batch_from_wire(data: object, *, allow_empty: bool = False) -> WireBatchRequest:
    """Validate a task argument strictly (`allow_empty`: a batch of input lines,
    `workers.fleet.line_batch`, may hold no rollout, all its lines malformed).

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
        items=_items_from_wire(data.get("items"), allow_empty=allow_empty),
    )
