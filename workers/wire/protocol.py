"""The Redis side of the wire: every key a batch goes through, and the result envelope.

Pure stdlib (the producer imports it without worker code). Every Redis key name of
ours, and of Celery's and kombu's that we read or write, is spelled here and nowhere
else (checked by tests/unit/test_protocol.py). docs/operations.md's key table
("What Redis holds") lists them.

A batch's result travels in Celery's result-key layout (the "task meta"): the worker
writes STARTED and SUCCESS itself (`task_meta`), PROGRESS through Celery's
`update_state` (`progress_meta`), and Celery writes FAILURE; the producer reads all
four with `read_task_meta`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

import orjson

from workers.errors import InvalidRequestError
from workers.models import Verdict
from workers.wire.signing import Keyring

__all__ = [
    "KEY_PREFIX",
    "RUNNING_STATES",
    "SCHEMA_VERSION",
    "SUCCESS_META_HEAD",
    "TASK_META_PREFIX",
    "UNACKED_KEY",
    "TaskMeta",
    "WireResult",
    "WireResultItem",
    "attempts_key",
    "batch_items_key",
    "claim_key",
    "indexes_read_alike",
    "job_board_key",
    "job_done_key",
    "job_entry_key",
    "line_output_key",
    "line_result_json",
    "partial_key",
    "priority_queue_keys",
    "progress_meta",
    "read_task_meta",
    "result_json",
    "result_key",
    "result_rejection",
    "result_to_wire",
    "results_from_wire",
    "task_meta",
    "task_meta_key",
]

SCHEMA_VERSION = 1
# Our keys: versioned, so a change of layout never reads an older one.
KEY_PREFIX = "gradefleet:v1:"
# Celery's Redis result backend (`KeyValueStoreBackend.task_keyprefix`).
TASK_META_PREFIX = "celery-task-meta-"
# kombu's Redis transport: delivered-but-unacked messages, one hash for all queues.
UNACKED_KEY = "unacked"
# kombu's priority lists sit beside the plain queue list as "<queue>\x06\x16<step>".
_PRIORITY_SEP = "\x06\x16"
_PRIORITY_STEPS = (3, 6, 9)
RUNNING_STATES = frozenset({"STARTED", "PROGRESS"})


def batch_items_key(batch_id: str) -> str:
    """String (broker's Redis): a batch's items as JSON, stored by the producer."""
    return f"{KEY_PREFIX}items:{batch_id}"


def job_done_key(job_id: str) -> str:
    """List (result backend): ids of a job's batches whose result is stored; the
    producer blocks on it (BLPOP) instead of polling."""
    return f"{KEY_PREFIX}done:{job_id}"


def job_board_key() -> str:
    """Sorted set (broker's Redis): ids of the jobs whose producer is waiting on
    them, scored by submission time (`producer.client.board`, read by `gradefleet
    status`)."""
    return f"{KEY_PREFIX}jobs"


def job_entry_key(job_id: str) -> str:
    """Hash (broker's Redis): one job's lane and progress; it expires unless its
    producer keeps refreshing it (`producer.client.board`)."""
    return f"{KEY_PREFIX}job:{job_id}"


def attempts_key(batch_id: str) -> str:
    """Counter (broker's Redis): started-but-unfinished deliveries of one batch."""
    return f"{KEY_PREFIX}attempts:{batch_id}"


def claim_key(batch_id: str) -> str:
    """String (broker's Redis): the token of the delivery grading a batch now, with a
    short TTL its heartbeat refreshes (`tasks.claim_batch`): a copy delivered
    meanwhile does not grade the batch a second time."""
    return f"{KEY_PREFIX}claim:{batch_id}"


def partial_key(batch_id: str) -> str:
    """Hash (broker's Redis): index -> verdict JSON of a batch's items graded so far."""
    return f"{KEY_PREFIX}partial:{batch_id}"


def line_output_key(batch_id: str, token: str) -> str:
    """String (result backend): the output lines of one delivery of a batch of
    input lines (`line_result_json` names it; a token per delivery, so a copy
    graded twice never mixes its lines with the other's result)."""
    return f"{KEY_PREFIX}lines:{batch_id}:{token}"


def result_key(digest: str, namespace: str = "gradefleet") -> str:
    """String (cache Redis): one cached result, by `cache.cache_key()` digest."""
    return f"{namespace}:v1:result:{digest}"


def task_meta_key(task_id: str) -> str:
    """String (result backend): Celery's result key of one task (= one batch)."""
    return TASK_META_PREFIX + task_id


def priority_queue_keys(queue: str) -> list[str]:
    """The plain list of `queue` and kombu's priority lists beside it."""
    return [queue, *(f"{queue}{_PRIORITY_SEP}{step}" for step in _PRIORITY_STEPS)]


# --- the result envelope ---------------------------------------------------------


class WireResultItem(TypedDict):
    """One graded rollout: its input index and `Verdict.to_dict()`."""

    index: int
    verdict: dict[str, Any]


class WireResult(TypedDict):
    """A batch's SUCCESS result (inside the task meta's `result`).

    `items_digest` names the exact items graded (`signing.items_digest`); `mac`
    (with a fleet key) signs ids, digest and verdicts (`result_mac_ok`).
    """

    schema: int
    job_id: str
    batch_id: str
    items_digest: NotRequired[str]
    results: list[WireResultItem]
    mac: NotRequired[str]


def _result_items(results: Sequence[tuple[int, Verdict]]) -> list[WireResultItem]:
    return [
        {"index": index, "verdict": verdict.to_dict()}
        for index, verdict in sorted(results, key=lambda pair: pair[0])
    ]


def _result_mac_parts(
    job_id: str, batch_id: str, digest: str, items_text: str
) -> tuple[str, str, str, str]:
    # `items_text`: the verdicts as `json.dumps` writes them. The producer re-encodes
    # what it parsed, which gives the same text (keys keep their order, values are
    # str, bool, int or None).
    return (job_id, batch_id, digest, items_text)


def result_to_wire(
    *,
    job_id: str,
    batch_id: str,
    results: Sequence[tuple[int, Verdict]],
    items_digest: str | None = None,
    keyring: Keyring | None = None,
) -> WireResult:
    """Build a batch's result, items sorted by index (signed with a keyring)."""
    wire: WireResult = {
        "schema": SCHEMA_VERSION,
        "job_id": job_id,
        "batch_id": batch_id,
        "results": _result_items(results),
    }
    if items_digest is not None:
        wire["items_digest"] = items_digest
        if keyring is not None:
            items_text = json.dumps(wire["results"])
            parts = _result_mac_parts(job_id, batch_id, items_digest, items_text)
            wire["mac"] = keyring.sign("result", *parts)
    return wire


def result_json(
    *,
    job_id: str,
    batch_id: str,
    results: Sequence[tuple[int, Verdict]],
    items_digest: str | None = None,
    keyring: Keyring | None = None,
) -> str:
    """`json.dumps(result_to_wire(...))`, with the verdicts encoded once: their
    text is both signed and stored (it was encoded for each: ~2.5 us a rollout)."""
    items_text = json.dumps(_result_items(results))
    fields = {"schema": SCHEMA_VERSION, "job_id": job_id, "batch_id": batch_id}
    text = json.dumps(fields)[:-1] + f', "results": {items_text}'
    if items_digest is not None:
        text += f', "items_digest": {json.dumps(items_digest)}'
        if keyring is not None:
            parts = _result_mac_parts(job_id, batch_id, items_digest, items_text)
            text += f', "mac": {json.dumps(keyring.sign("result", *parts))}'
    return text + "}"


def line_result_json(
    *,
    job_id: str,
    batch_id: str,
    lines: Mapping[str, Any],
    items_digest: str,
    keyring: Keyring | None = None,
) -> str:
    """The result of a batch of input lines (a fleet's line mode: the CLI stores
    the lines, `workers.lines.units.fleet_unit_payload`, and the worker renders them):
    `lines` holds the totals and malformed lines and names the key of the output
    lines (`line_output_key`: bytes as the CLI writes them, never escaped into
    this JSON and read back), with their size and, with a keyring, their SHA-256;
    or it says why the worker did not grade them ("unfit"). Signed with a
    keyring, as `result_json`, under a purpose of its own."""
    fields = {
        "schema": SCHEMA_VERSION,
        "job_id": job_id,
        "batch_id": batch_id,
        "results": [],
        "items_digest": items_digest,
        "lines": lines,
    }
    text = json.dumps(fields)
    if keyring is None:
        return text
    parts = _lines_mac_parts(job_id, batch_id, items_digest, lines)
    return text[:-1] + f', "mac": {json.dumps(keyring.sign(_LINES_PURPOSE, *parts))}}}'


# A line result's MAC is of its own kind: a verdicts result's MAC never passes for one.
_LINES_PURPOSE = "result-lines"


def _lines_mac_parts(
    job_id: str, batch_id: str, digest: str, lines: object
) -> tuple[str, str, str, str]:
    # The lines object as `json.dumps` writes it with sorted keys: the producer
    # writes the same text from what it parsed, however the result was encoded.
    return (job_id, batch_id, digest, json.dumps(lines, sort_keys=True))


def result_rejection(
    data: object,
    *,
    job_id: str,
    batch_id: str,
    items_digest: str | None,
    keyring: Keyring | None,
) -> str | None:
    """Why a SUCCESS result must not be accepted for `batch_id`, else None.

    It must name the batch and the digest of the items the producer sent (a result
    of other items under this batch's id, e.g. from a forged task, is refused) and,
    with a keyring, carry a valid MAC (a result written straight into Redis is).
    """
    if not isinstance(data, Mapping) or data.get("batch_id") != batch_id:
        return "result is for another batch"
    if data.get("job_id") != job_id:
        return "result is for another job"
    digest = data.get("items_digest")
    if items_digest is not None and digest is not None and digest != items_digest:
        return "result is for other items than were sent"
    if keyring is None:
        return None
    if not isinstance(digest, str) or digest != items_digest:
        return "result names no items digest"
    if "lines" in data:
        parts = _lines_mac_parts(job_id, batch_id, digest, data["lines"])
        if not keyring.verify(data.get("mac"), _LINES_PURPOSE, *parts):
            return "result MAC does not verify"
        return None
    items_text = json.dumps(data.get("results"))
    parts = _result_mac_parts(job_id, batch_id, digest, items_text)
    if not keyring.verify(data.get("mac"), "result", *parts):
        return "result MAC does not verify"
    return None


def results_from_wire(data: object) -> list[tuple[int, Verdict]]:
    """Parse a batch's result into `(index, Verdict)` pairs.

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


# How a SUCCESS written by `task_meta` begins: a worker reads this many bytes to
# learn that a batch is finished without reading its result.
SUCCESS_META_HEAD = '{"status": "SUCCESS"'


def task_meta(status: str, result_json_text: str, task_id: str) -> str:
    """Celery's task-meta layout around a result given as JSON text (STARTED and
    SUCCESS, written by the task itself in its bookkeeping pipelines)."""
    done = datetime.now(UTC).isoformat() if status == "SUCCESS" else None
    return (
        f'{{"status": {json.dumps(status)}, "result": {result_json_text}, '
        f'"traceback": null, "children": [], "date_done": {json.dumps(done)}, '
        f'"task_id": {json.dumps(task_id)}}}'
    )


def progress_meta(*, done: int, total: int, beat: int) -> dict[str, int]:
    """The `meta` of a PROGRESS state (written through Celery's `update_state`).

    `beat` makes every heartbeat a new value: the producer counts a *change* of the
    result key as a sign of life, and `done` alone stands still while a slow chunk
    is graded.
    """
    return {"done": done, "total": total, "beat": beat}


@dataclass(frozen=True, slots=True)
class TaskMeta:
    """What a batch's result key says: its state, and the verdicts (SUCCESS with a
    readable result) or why it failed (FAILURE, or a SUCCESS that cannot be read).
    `envelope` is the SUCCESS result as stored (for `result_rejection`)."""

    status: str
    results: list[tuple[int, Verdict]] | None = None
    failure: str | None = None
    envelope: Mapping[str, Any] | None = field(default=None, compare=False)
    # A line batch's output (`line_result_json`), as the result holds it.
    lines: Mapping[str, Any] | None = None

    @property
    def running(self) -> bool:
        return self.status in RUNNING_STATES


def indexes_read_alike(items: object) -> bool:
    """Whether orjson read `items` (a batch's items, or a result's) as `json.loads`
    does: a list of objects whose indexes are ints.

    orjson refuses NaN and escaped lone surrogates (model text and verdict text may
    hold one), and reads an integer beyond 64 bits as a float; of an item's fields
    only `index` is a number, so orjson's reading is kept when every index is an int
    and the stdlib reads the payload otherwise.
    """
    return type(items) is list and all(
        type(item) is dict and type(item.get("index")) is int for item in items
    )


def _read_json(payload: bytes | str) -> Any:
    """A result key's value as `json.loads` reads it, at orjson's speed where that
    reads the same (half the stdlib's CPU, on the producer's one core: issue 11;
    see `indexes_read_alike`)."""
    try:
        meta = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)
    result = meta.get("result") if type(meta) is dict else None
    items = result.get("results") if type(result) is dict else None
    if type(items) is list and not indexes_read_alike(items):
        return json.loads(payload)
    return meta


def read_task_meta(payload: bytes | str) -> TaskMeta:
    """Parse a result key's value (any state; never raises on a bad result)."""
    try:
        meta = _read_json(payload)
    except ValueError:
        return TaskMeta(status="", failure="result key holds no JSON")
    if not isinstance(meta, Mapping):
        return TaskMeta(status="", failure="result key holds no object")
    status = str(meta.get("status", ""))
    if status == "SUCCESS":
        result = meta.get("result")
        try:
            pairs = results_from_wire(result)
        except InvalidRequestError as exc:
            return TaskMeta(status, failure=str(exc))
        assert isinstance(result, Mapping)  # results_from_wire checked it
        lines = result.get("lines")
        return TaskMeta(
            status,
            results=pairs,
            envelope=result,
            lines=lines if isinstance(lines, Mapping) else None,
        )
    if status == "FAILURE":
        result = meta.get("result")
        result = result if isinstance(result, Mapping) else {}
        return TaskMeta(
            status, failure=f"{result.get('exc_type')}: {result.get('exc_message')}"
        )
    return TaskMeta(status)
