"""The `gradefleet.grade_batch` task: wire in, grade what is not yet graded, wire out.

Redelivery-safe: verdicts are saved to a Redis hash per batch as they are made, so a
re-delivered batch grades only what is missing; an attempt counter turns a batch that
keeps killing its worker into `error` verdicts instead of an endless loop.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded

from workers.app import WorkerRuntime, get_runtime
from workers.batch import GradeItem
from workers.contract import (
    GRADE_BATCH,
    WireBatchRequest,
    WireResult,
    batch_from_wire,
    result_to_wire,
)
from workers.models import ExtractionMethod, Status, Verdict
from workers.verifier import GRADER_VERSION

__all__ = ["attempts_key", "grade_batch", "partial_key", "run_batch"]

# Verdicts are saved after every chunk: a lost worker costs at most one chunk's work.
# Chunks start small and double while they are fast (fewer round trips); after a
# slow one they drop to a couple of items, so little graded work is at stake when a
# worker is lost or the backstop interrupts a chunk.
FIRST_CHUNK_ITEMS = 16
SLOW_CHUNK_ITEMS = 2
MAX_CHUNK_ITEMS = 256
CHUNK_TARGET_S = 0.25
# A running batch writes a PROGRESS state at most this often (the producer's sign
# of life: no news for `resend_after_s` means the batch is re-sent).
HEARTBEAT_INTERVAL_S = 1.0


# Batch bookkeeping keys live next to the task that owns them (the cache keys are in
# workers/cache.py); both use the versioned `gradefleet:v1:` prefix.
def attempts_key(batch_id: str) -> str:
    """Counter of started-but-unfinished deliveries of one batch."""
    return f"gradefleet:v1:attempts:{batch_id}"


def partial_key(batch_id: str) -> str:
    """Hash index -> verdict JSON of a batch's items graded so far."""
    return f"gradefleet:v1:partial:{batch_id}"


class BatchProgress:
    """A batch's attempt counter and saved verdicts in Redis."""

    def __init__(self, client: redis.Redis[bytes], batch_id: str, ttl_s: int) -> None:
        self._redis = client
        self._attempts = attempts_key(batch_id)
        self._partial = partial_key(batch_id)
        self._ttl_s = ttl_s

    def begin(self) -> tuple[int, dict[int, Verdict]]:
        """Count this delivery; return (unfinished deliveries incl. this, saved)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.incr(self._attempts)
        pipe.expire(self._attempts, self._ttl_s)
        pipe.hgetall(self._partial)
        attempts, _, saved = pipe.execute()
        verdicts: dict[int, Verdict] = {}
        for index, raw in saved.items():
            try:
                verdicts[int(index)] = Verdict.from_dict(json.loads(raw))
            except (KeyError, TypeError, ValueError):
                continue  # unreadable (another version?): grade that item again
        return int(attempts), verdicts

    def save(self, pairs: Sequence[tuple[int, Verdict]]) -> None:
        """Save verdicts: one hash field per item index (value: verdict JSON)."""
        if not pairs:
            return
        mapping: dict[str | bytes, bytes | float | int | str] = {
            str(i): json.dumps(v.to_dict()) for i, v in pairs
        }
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(self._partial, mapping=mapping)
        pipe.expire(self._partial, self._ttl_s)
        pipe.execute()

    def finish(self) -> None:
        """This delivery ended cleanly: it no longer counts towards poisoning."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.decr(self._attempts)
        pipe.expire(self._attempts, self._ttl_s)
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
        runtime.metrics.item_graded(verdict, 0.0)
    progress.save(pairs)


def _grade_in_chunks(
    runtime: WorkerRuntime,
    request: WireBatchRequest,
    todo: Sequence[GradeItem],
    done: dict[int, Verdict],
    progress: BatchProgress,
) -> None:
    start, size = 0, FIRST_CHUNK_ITEMS
    while start < len(todo):
        chunk_started = time.monotonic()
        pairs = runtime.grader.grade(todo[start : start + size], request.options)
        done.update(pairs)
        progress.save(pairs)
        start += size
        fast = time.monotonic() - chunk_started < CHUNK_TARGET_S
        size = min(size * 2, MAX_CHUNK_ITEMS) if fast else SLOW_CHUNK_ITEMS


def run_batch(
    runtime: WorkerRuntime,
    request: WireBatchRequest,
    task: Task[Any, Any] | None = None,
) -> list[tuple[int, Verdict]]:
    """Grade a validated batch; every item gets a verdict, in the batch's order."""
    started = time.monotonic()
    ttl_s = 2 * runtime.settings.visibility_timeout_s
    progress = BatchProgress(runtime.redis, request.batch_id, ttl_s)
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
    progress.finish()
    runtime.metrics.batch_done(
        size=len(request.items), duration_s=time.monotonic() - started
    )
    return [(it["index"], done[it["index"]]) for it in request.items]


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
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            # Best effort: a missed heartbeat at worst makes the producer re-send.
            with contextlib.suppress(redis.RedisError, OSError):
                self._task.update_state(
                    state="PROGRESS", meta={"done": self._done(), "total": self._total}
                )


# A short result repr: Celery formats one per task for its log line, and a batch
# result is large (saferepr of 1 KB costs ~1 ms per task).
@shared_task(name=GRADE_BATCH, bind=True, resultrepr_maxsize=160)
def grade_batch(self: Task[Any, Any], wire: dict[str, Any]) -> WireResult:
    """Grade one wire batch (see `workers.contract`); returns the result wire."""
    request = batch_from_wire(wire)
    runtime = get_runtime()
    runtime.metrics.queue_wait(time.time() - request.enqueued_at)
    with runtime.metrics.busy():
        pairs = run_batch(runtime, request, self)
    return result_to_wire(
        job_id=request.job_id, batch_id=request.batch_id, results=pairs
    )
