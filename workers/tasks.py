"""The `gradefleet.grade_batch` task: wire in, grade what is not yet graded, wire out.

Redelivery-safe: verdicts are saved to a Redis hash per batch as they are made, so a
re-delivered batch grades only what is missing; an attempt counter turns a batch that
keeps killing its worker into `error` verdicts instead of an endless loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded

from workers.app import WorkerRuntime, get_runtime
from workers.batch import GradeItem
from workers.contract import (
    GRADE_BATCH,
    MAX_PAYLOAD_BYTES,
    WireBatchRequest,
    attach_items,
    batch_from_wire,
    items_reference,
    job_done_key,
    result_to_wire,
)
from workers.lanes import INTERACTIVE, lane_of_queue
from workers.models import ExtractionMethod, Status, Verdict
from workers.verifier import GRADER_VERSION

__all__ = ["attempts_key", "grade_batch", "partial_key", "run_batch"]

# Verdicts graded so far are saved once SAVE_AFTER_S of grading is unsaved: a lost
# worker costs at most that much plus one chunk. A fast batch saves nothing (its
# verdicts go straight into the result, stored in the round trip that drops whatever
# was saved); one with slow items saves after each slow chunk.
# Chunks start small and grow x4 while they are fast (fewer round trips: a 512-item
# batch takes 16 + 64 + 256 + 176, 4 chunks, where doubling took 6; each chunk costs a
# cache MGET and store and a sandbox exchange); after a slow one they drop to a couple
# of items, so little graded work is at stake when a worker is lost or the backstop
# interrupts a chunk.
FIRST_CHUNK_ITEMS = 16
CHUNK_GROWTH = 4
SLOW_CHUNK_ITEMS = 2
MAX_CHUNK_ITEMS = 256
CHUNK_TARGET_S = 0.25
SAVE_AFTER_S = 0.25
# A running batch writes a PROGRESS state this often (the producer's sign of life:
# no news for `resend_after_s`, 10 s by default, means the batch is re-sent).
HEARTBEAT_INTERVAL_S = 1.0


# Batch bookkeeping keys live next to the task that owns them (the cache keys are in
# workers/cache.py); both use the versioned `gradefleet:v1:` prefix.
def attempts_key(batch_id: str) -> str:
    """Counter of started-but-unfinished deliveries of one batch."""
    return f"gradefleet:v1:attempts:{batch_id}"


def partial_key(batch_id: str) -> str:
    """Hash index -> verdict JSON of a batch's items graded so far."""
    return f"gradefleet:v1:partial:{batch_id}"


@dataclass(frozen=True, slots=True)
class ResultSlot:
    """Celery's result key of this task, written by the task itself.

    The task stores its STARTED and SUCCESS states with one plain SET each, in the
    same pipelines as the batch bookkeeping, instead of through Celery's backend
    (which does a GET, then SETEX + PUBLISH, per state: 4 round trips per batch).
    The value has Celery's layout, so Celery tools and the producer read it as usual;
    failures are still stored by Celery (`task_store_errors_even_if_ignored`).
    """

    client: redis.Redis[bytes]
    key: bytes
    ttl_s: int
    task_id: str
    done_key: str  # the job's list of finished batch ids (`contract.job_done_key`)

    def meta(self, status: str, result_json: str) -> str:
        """Celery's meta layout around a result given as JSON text."""
        done = datetime.now(UTC).isoformat() if status == "SUCCESS" else None
        return (
            f'{{"status": {json.dumps(status)}, "result": {result_json}, '
            f'"traceback": null, "children": [], "date_done": {json.dumps(done)}, '
            f'"task_id": {json.dumps(self.task_id)}}}'
        )


class BatchProgress:
    """A batch's attempt counter, saved verdicts and (optionally) result state."""

    def __init__(
        self,
        client: redis.Redis[bytes],
        batch_id: str,
        ttl_s: int,
        slot: ResultSlot | None = None,
    ) -> None:
        self._redis = client
        self._attempts = attempts_key(batch_id)
        self._partial = partial_key(batch_id)
        self._ttl_s = ttl_s
        self._slot = slot

    def _result_pipe(self, main: Any) -> Any:
        """The pipeline for the result key: `main` when both live in one Redis."""
        if self._slot is None or self._slot.client is self._redis:
            return main
        return self._slot.client.pipeline(transaction=False)

    def begin(self) -> tuple[int, dict[int, Verdict]]:
        """Count this delivery, mark it STARTED; return (deliveries incl. this, saved).

        STARTED is set only if the key is absent (NX): it never hides a stored result.
        """
        pipe = self._redis.pipeline(transaction=False)
        pipe.incr(self._attempts)
        pipe.expire(self._attempts, self._ttl_s)
        pipe.hgetall(self._partial)
        if self._slot is not None:
            other = self._result_pipe(pipe)
            meta = self._slot.meta("STARTED", json.dumps({"pid": os.getpid()}))
            other.set(self._slot.key, meta, ex=self._slot.ttl_s, nx=True)
            if other is not pipe:
                other.execute()
        attempts, _, saved = pipe.execute()[:3]
        verdicts: dict[int, Verdict] = {}
        for index, raw in saved.items():
            try:
                verdict = Verdict.from_dict(json.loads(raw))
            except (KeyError, TypeError, ValueError):
                continue  # unreadable (another version?): grade that item again
            verdicts[int(index)] = verdict
        return int(attempts), verdicts

    def save(self, pairs: Sequence[tuple[int, Verdict]]) -> None:
        """Save verdicts: one hash field per item index (value: verdict JSON)."""
        if not pairs:
            return
        mapping: dict[str | bytes, bytes | float | int | str] = {
            str(index): json.dumps(verdict.to_dict()) for index, verdict in pairs
        }
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(self._partial, mapping=mapping)
        pipe.expire(self._partial, self._ttl_s)
        pipe.execute()

    def finish(self, result_json: str | None = None) -> None:
        """This delivery ended cleanly: store the result (JSON text) as SUCCESS (with
        a slot), drop the saved verdicts (the result holds them all) and stop counting
        it towards poisoning, in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        other = pipe
        if self._slot is not None and result_json is not None:
            other = self._result_pipe(pipe)
            meta = self._slot.meta("SUCCESS", result_json)
            other.set(self._slot.key, meta, ex=self._slot.ttl_s)
            # After the SET, in the same pipeline: a producer woken by this id
            # always finds the result.
            other.rpush(self._slot.done_key, self._slot.task_id)
            other.expire(self._slot.done_key, self._slot.ttl_s)
        pipe.decr(self._attempts)
        pipe.expire(self._attempts, self._ttl_s)
        pipe.delete(self._partial)
        if other is not pipe:
            other.execute()  # the result first: a lost DECR only ages out
        pipe.execute()


def _stand_in(status: Status, reason: str) -> Verdict:
    return Verdict(
        correct=False,
        status=status,
        format_valid=False,
        extracted=None,
        extraction_method=ExtractionMethod.NONE,
        reason=reason,
        grader_version=GRADER_VERSION,
    )


def _answer_all(
    runtime: WorkerRuntime,
    items: Sequence[GradeItem],
    done: dict[int, Verdict],
    verdict: Verdict,
    progress: BatchProgress,
) -> None:
    pairs = [(item.index, verdict) for item in items if item.index not in done]
    for index, _ in pairs:
        done[index] = verdict
        runtime.observer.item_graded(verdict, 0.0)
    progress.save(pairs)
    runtime.observer.commit()


def _grade_in_chunks(
    runtime: WorkerRuntime,
    request: WireBatchRequest,
    todo: Sequence[GradeItem],
    done: dict[int, Verdict],
    progress: BatchProgress,
) -> None:
    start, size = 0, FIRST_CHUNK_ITEMS
    unsaved: list[tuple[int, Verdict]] = []
    saved_at = time.monotonic()
    while start < len(todo):
        chunk_started = time.monotonic()
        pairs = runtime.grader.grade(todo[start : start + size], request.options)
        done.update(pairs)
        unsaved += pairs
        start += size
        now = time.monotonic()
        if start < len(todo) and now - saved_at >= SAVE_AFTER_S:
            progress.save(unsaved)
            runtime.observer.commit()
            unsaved, saved_at = [], now
        fast = now - chunk_started < CHUNK_TARGET_S
        size = min(size * CHUNK_GROWTH, MAX_CHUNK_ITEMS) if fast else SLOW_CHUNK_ITEMS


def run_batch(
    runtime: WorkerRuntime,
    request: WireBatchRequest,
    task: Task[Any, Any] | None = None,
    *,
    lane: str = INTERACTIVE,
) -> list[tuple[int, Verdict]]:
    """Grade a validated batch; every item gets a verdict, in the batch's order.

    With a `task`, its STARTED and SUCCESS states (the SUCCESS result is the
    `WireResult`) are written to Celery's result key here (see `ResultSlot`).
    """
    started = time.monotonic()
    runtime.observer.discard()  # left by a batch that failed: never stored
    ttl_s = 2 * runtime.settings.visibility_timeout_s
    slot = None if task is None else _result_slot(runtime, task, request.job_id)
    progress = BatchProgress(runtime.redis, request.batch_id, ttl_s, slot)
    attempts, done = progress.begin()
    todo = [
        GradeItem(index=it["index"], response=it["response"], gold=it["gold"])
        for it in request.items
        if it["index"] not in done
    ]
    beat = (
        contextlib.nullcontext()
        if task is None
        else _Heartbeat(task, len(request.items), lambda: len(done))
    )
    with beat:
        _grade_or_stand_in(runtime, request, todo, done, progress, attempts)
    progress.finish(_result_json(request, done))
    runtime.observer.commit()
    runtime.metrics.batch_done(
        size=len(request.items), duration_s=time.monotonic() - started, lane=lane
    )
    return [(it["index"], done[it["index"]]) for it in request.items]


def _result_json(request: WireBatchRequest, done: dict[int, Verdict]) -> str:
    """The `WireResult` of exactly this batch's indexes, as JSON text (one encoder
    pass over all of them: half the time of encoding each verdict on its own)."""
    results = [(item["index"], done[item["index"]]) for item in request.items]
    return json.dumps(
        result_to_wire(
            job_id=request.job_id, batch_id=request.batch_id, results=results
        )
    )


def _result_slot(
    runtime: WorkerRuntime, task: Task[Any, Any], job_id: str
) -> ResultSlot:
    backend: Any = task.backend
    task_id = str(task.request.id)
    return ResultSlot(
        client=runtime.results_redis,
        key=bytes(backend.get_key_for_task(task_id)),
        ttl_s=int(backend.expires or runtime.settings.visibility_timeout_s),
        task_id=task_id,
        done_key=job_done_key(job_id),
    )


def _grade_or_stand_in(
    runtime: WorkerRuntime,
    request: WireBatchRequest,
    todo: Sequence[GradeItem],
    done: dict[int, Verdict],
    progress: BatchProgress,
    attempts: int,
) -> None:
    try:
        if todo and attempts > runtime.settings.max_attempts:
            poison = _stand_in(Status.ERROR, f"poison batch: {attempts} attempts")
            _answer_all(runtime, todo, done, poison, progress)
        else:
            _grade_in_chunks(runtime, request, todo, done, progress)
    except SoftTimeLimitExceeded:
        # Backstop only (item deadlines normally end a batch long before it).
        runtime.reset_sandbox()
        late = _stand_in(Status.TIMEOUT, "batch time limit reached before this item")
        _answer_all(runtime, todo, done, late, progress)


class _Heartbeat:
    """While a batch runs, a thread writes a PROGRESS state every interval.

    It is the producer's sign of life: a batch with no news for `resend_after_s` is
    re-sent. A thread (not per-item hooks) so that it also beats while one slow item
    is being graded, and dies with the process when the worker is lost.
    """

    def __init__(
        self, task: Task[Any, Any], total: int, done: Callable[[], int]
    ) -> None:
        self._task = task
        # Read here, in the task's thread: `task.request` is thread-local, and in the
        # heartbeat thread its id is None (every beat used to fail on that).
        self._task_id = str(task.request.id)
        self._total = total
        self._done = done
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="gradefleet-heartbeat", daemon=True
        )

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        beat = 0
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            beat += 1
            # `beat` makes every heartbeat a new value: the producer counts a *change*
            # of the result key as a sign of life, and `done` alone stands still
            # while a slow chunk is graded. Best effort: a missed heartbeat at worst
            # makes the producer re-send.
            meta = {"done": self._done(), "total": self._total, "beat": beat}
            with contextlib.suppress(redis.RedisError, OSError):
                self._task.update_state(
                    task_id=self._task_id, state="PROGRESS", meta=meta
                )


# The result is stored by `run_batch` itself (ignore_result: Celery's backend would
# store it again); errors are still stored by Celery (store_errors_even_if_ignored).
@shared_task(name=GRADE_BATCH, bind=True, ignore_result=True)
def grade_batch(self: Task[Any, Any], wire: dict[str, Any]) -> None:
    """Grade one wire batch (see `workers.contract`); the `WireResult` is stored in
    the task's result key by `run_batch`."""
    runtime = get_runtime()
    key = items_reference(wire)
    if key is not None:  # items stored by the producer (`contract.detach_items`)
        # GETRANGE, not GET: an oversized value is refused without being read whole
        # (the stubs leave `getrange` untyped, hence the raw command).
        payload = runtime.redis.execute_command("GETRANGE", key, 0, MAX_PAYLOAD_BYTES)
        wire = attach_items(wire, payload)
    request = batch_from_wire(wire)
    lane = _lane(self)
    runtime.metrics.queue_wait(time.time() - request.enqueued_at, lane=lane)
    with runtime.metrics.busy():
        run_batch(runtime, request, self, lane=lane)


def _lane(task: Task[Any, Any]) -> str:
    """The lane of the queue this delivery came from (kombu's routing key is the
    queue's name); work from a queue of no lane counts as interactive."""
    info = task.request.delivery_info or {}
    return lane_of_queue(str(info.get("routing_key", ""))) or INTERACTIVE
