"""The `gradefleet.grade_batch` task: wire in, grade what is not yet graded, wire out.

One `BatchRun` per delivery holds its state (saved verdicts, bookkeeping, heartbeat);
the Redis side of it is `workers.fleet.bookkeeping`, the keys and the result envelope
are `workers.wire.protocol`, the chunk sizes `workers.sizing`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from redis.lock import Lock

from workers.embedded.batch import GradeItem
from workers.fleet.bookkeeping import BatchProgress, Heartbeat, ResultSlot
from workers.fleet.claim import (
    claim_batch,
    is_result_head,
    read_result_head,
    release,
    renew,
)
from workers.fleet.line_batch import LineUnit, is_line_unit, line_unit_task
from workers.fleet.runtime import WorkerRuntime, get_runtime
from workers.models import Status, Verdict
from workers.sandbox.verdicts import failure_verdict, poison_verdict
from workers.sizing import FIRST_CHUNK_ITEMS, SAVE_AFTER_S, next_chunk_items
from workers.wire.contract import (
    GRADE_BATCH,
    MAX_PAYLOAD_BYTES,
    WireBatchRequest,
    attach_items,
    batch_from_wire,
    items_reference,
    task_mac_ok,
    wire_items_digest,
)
from workers.wire.lanes import INTERACTIVE, lane_of_queue
from workers.wire.protocol import (
    claim_key,
    job_done_key,
    job_entry_key,
    result_json,
    task_meta_key,
)
from workers.wire.refusals import OUTLAST_REFUSALS

__all__ = ["BatchRun", "grade_batch"]

_LATE_REASON = "batch time limit reached before this item"
log = logging.getLogger(__name__)
# A queued batch from an older producer (no `kept_alive`) whose job has no board
# entry is abandoned past this age (such producers refresh the entry only while
# they poll).
ABANDONED_AFTER_S = 120.0


class BatchRun:
    """One delivery of one validated batch: every item gets a verdict.

    With a `task`, its STARTED and SUCCESS states (the SUCCESS result is the
    `protocol.WireResult`) are written to Celery's result key by the run itself
    (see `bookkeeping.ResultSlot`), and a heartbeat runs while it grades.

    A unit of input lines (`unit`; `request` is then its `head`, without
    rollouts) is graded whole in the runtime's `line_pool` and stores its
    rendered lines; it is read here as a batch of items (`LineUnit.batch`) only
    when that cannot serve (see `workers.fleet.line_batch`). Either way it is graded
    without the answer cache (see `WorkerRuntime.line_grader`).
    """

    def __init__(
        self,
        runtime: WorkerRuntime,
        request: WireBatchRequest,
        task: Task[Any, Any] | None = None,
        *,
        lane: str = INTERACTIVE,
        items_digest: str | None = None,
        items_key: str | None = None,
        claim: Lock | None = None,
        unit: LineUnit | None = None,
    ) -> None:
        self.runtime = runtime
        self.claim = claim
        self.unit = unit
        self.render: (
            Callable[[list[Verdict]], tuple[str, tuple[str, bytes] | None]] | None
        ) = None
        self.grader = runtime.grader if unit is None else runtime.line_grader
        self.request = request
        self.size = len(request.items)  # rollouts, once known
        self.task = task
        self.lane = lane
        self.items_digest = items_digest
        self.done: dict[int, Verdict] = {}
        slot = None if task is None else self._result_slot(task)
        ttl_s = 2 * runtime.settings.visibility_timeout_s
        self.progress = BatchProgress(
            runtime.redis,
            request.batch_id,
            ttl_s,
            slot,
            keyring=runtime.settings.keyring,
            items_digest=items_digest or "",
            items_key=items_key,
            claim_key=None if claim is None else claim_key(request.batch_id),
        )

    def run(self) -> None:
        """Grade what no earlier delivery saved; store the result."""
        started = time.monotonic()
        observer = self.runtime.observer
        observer.discard()  # left by a batch that failed: never stored
        # A broker refusing writes (maxmemory, failover) is waited out here, so the
        # verdicts of a batch it caught mid-way are stored once it recovers.
        attempts, self.done = OUTLAST_REFUSALS.call_with_retry(
            self.progress.begin, self._refused
        )
        self.runtime.metrics.integrity_rejected("partial", self.progress.rejected)
        try:
            with self._heartbeat():
                result, output = self._grade_or_stand_in(attempts)
            OUTLAST_REFUSALS.call_with_retry(
                lambda: self.progress.finish(result, output), self._refused
            )
        finally:
            # After the result is stored: its producer does not wait for the cache.
            self.grader.flush_stores()
        observer.commit()
        self.runtime.metrics.batch_done(
            size=self.size,
            duration_s=time.monotonic() - started,
            lane=self.lane,
        )

    def _refused(self, exc: Exception) -> None:
        log.warning(
            "batch %s: the broker refused a write (%s: %s); trying again",
            self.request.batch_id,
            type(exc).__name__,
            exc,
        )

    def _result_slot(self, task: Task[Any, Any]) -> ResultSlot:
        task_id = str(task.request.id)
        expires_s = getattr(task.backend, "expires", None)
        return ResultSlot(
            client=self.runtime.results_redis,
            key=task_meta_key(task_id),
            ttl_s=int(expires_s or self.runtime.settings.visibility_timeout_s),
            task_id=task_id,
            done_key=job_done_key(self.request.job_id),
        )

    def _heartbeat(self) -> contextlib.AbstractContextManager[object]:
        if self.task is None:
            return contextlib.nullcontext()
        total = len(self.request.items)
        if self.unit is not None and self.render is None:  # not read here
            total = self.unit.lines
        return Heartbeat(
            self.task,
            total,
            lambda: len(self.done),
            on_beat=lambda: renew(self.claim),
        )

    def _result(self) -> tuple[str, tuple[str, bytes] | None]:
        """The result of exactly this batch's indexes, as JSON text, and what a
        batch of lines stores beside it (its output lines, under their key)."""
        if self.render is not None:
            return self.render([self.done[it["index"]] for it in self.request.items])
        return self._result_json(), None

    def _result_json(self) -> str:
        results = [(it["index"], self.done[it["index"]]) for it in self.request.items]
        return result_json(
            job_id=self.request.job_id,
            batch_id=self.request.batch_id,
            results=results,
            items_digest=self.items_digest,
            keyring=self.runtime.settings.keyring,
        )

    def _todo(self) -> list[GradeItem]:
        """The items without a verdict (a unit of lines is read here first)."""
        if self.unit is not None and self.render is None:
            batch = self.unit.batch()
            self.request, self.render = batch.request, batch.render
            self.size = len(batch.request.items)
        return [
            GradeItem(index=it["index"], response=it["response"], gold=it["gold"])
            for it in self.request.items
            if it["index"] not in self.done
        ]

    def _grade_or_stand_in(self, attempts: int) -> tuple[str, tuple[str, bytes] | None]:
        """Grade (or stand in for) what is left; the result and what goes beside."""
        options = self.request.options
        try:
            if attempts > self.runtime.settings.max_attempts:
                lost = attempts - 1  # deliveries before this one that never finished
                self._answer_all(
                    self._todo(),
                    lambda it: poison_verdict(it.response, it.gold, options, lost),
                )
            elif self.unit is not None and (whole := self._grade_unit()) is not None:
                return whole
            else:
                self._grade_in_chunks(self._todo())
        except SoftTimeLimitExceeded:
            # Backstop only (item deadlines normally end a batch long before it).
            self.runtime.reset_sandbox()
            self._answer_all(
                self._todo(),
                lambda it: failure_verdict(
                    Status.TIMEOUT, _LATE_REASON, it.response, it.gold, options
                ),
            )
        return self._result()

    def _grade_unit(self) -> tuple[str, tuple[str, bytes] | None] | None:
        """A unit of lines graded whole in the line pool; None when its grading
        process was lost too often with no item to blame (the caller grades its
        rows then)."""
        assert self.unit is not None
        head = {"options": self.request.options.to_dict(), "code": self.unit.code}
        unit = (head, self.unit.payload)
        # Weighed by its lines: what the pool counts its worker's items by.
        [graded] = self.runtime.line_pool.run_units(
            [unit], [self.unit.lines], known=[self.done], on_kept=self._kept
        )
        if graded is None:
            return None
        meta, out = graded
        if "unfit" in meta:
            return self.unit.result({"unfit": meta["unfit"]}, None)
        self.size = meta["rollouts"]
        self.runtime.observer.items_summed(meta["graded"])
        return self.unit.result(meta["lines"], out)

    def _kept(self, _unit: int, verdicts: dict[int, Verdict], summary: Any) -> None:
        """Verdicts of a slow unit of lines so far: saved as a batch's are."""
        fresh = [(i, v) for i, v in verdicts.items() if i not in self.done]
        self.done.update(fresh)
        self.progress.save(fresh)
        self.runtime.observer.items_summed(summary)
        self.runtime.observer.commit()

    def _answer_all(
        self, items: list[GradeItem], verdict_for: Callable[[GradeItem], Verdict]
    ) -> None:
        observer = self.runtime.observer
        pairs: list[tuple[int, Verdict]] = []
        for item in items:
            if item.index in self.done:
                continue
            verdict = verdict_for(item)
            self.done[item.index] = verdict
            pairs.append((item.index, verdict))
            observer.item_graded(verdict, 0.0)
        self.progress.save(pairs)
        observer.commit()

    def _grade_in_chunks(self, todo: list[GradeItem]) -> None:
        observer = self.runtime.observer
        start, size = 0, FIRST_CHUNK_ITEMS
        unsaved: list[tuple[int, Verdict]] = []
        saved_at = time.monotonic()
        while start < len(todo):
            chunk_started = time.monotonic()
            chunk = todo[start : start + size]
            pairs = self.grader.grade(chunk, self.request.options)
            self.done.update(pairs)
            unsaved += pairs
            start += size
            now = time.monotonic()
            if start < len(todo) and now - saved_at >= SAVE_AFTER_S:
                self.progress.save(unsaved)
                observer.commit()
                unsaved, saved_at = [], now
            size = next_chunk_items(size, now - chunk_started)


# The result is stored by `BatchRun` itself (ignore_result: Celery's backend would
# store it again); errors are still stored by Celery (store_errors_even_if_ignored).
@shared_task(name=GRADE_BATCH, bind=True, ignore_result=True)
def grade_batch(self: Task[Any, Any], wire: dict[str, Any]) -> None:
    """Grade one wire batch (see `workers.wire.contract`); the result is stored in the
    task's result key by `BatchRun`."""
    runtime = get_runtime()
    key = items_reference(wire)
    payload, skip = _read_delivery(runtime, str(self.request.id), wire, key)
    if skip is not None:
        runtime.metrics.batch_skipped(skip[0])
        log.info("batch %s acknowledged without grading: %s", self.request.id, skip[1])
        return
    digest = wire_items_digest(wire, payload)
    keyring = runtime.settings.keyring
    unit = None
    if key is not None and is_line_unit(payload):  # lines, not items
        assert payload is not None
        code = runtime.settings.grades_code
        unit = line_unit_task(wire, payload, digest, keyring, code=code)
        request = unit.head
    else:
        if key is not None:  # items stored by the producer (`contract.detach_items`)
            wire = attach_items(wire, payload)
        request = batch_from_wire(wire)
    if keyring is not None and not task_mac_ok(
        request, wire.get("mac"), digest, keyring
    ):
        # Not built by a holder of the fleet key, or its items were swapped in
        # Redis: graded for nobody, and nothing is written under its ids (a
        # FAILURE there would count against the real batch of those ids).
        runtime.metrics.integrity_rejected("task")
        log.warning(
            "dropped batch %s of job %s: its MAC does not verify (forged, or its "
            "items were changed in Redis; or the producer lacks the fleet key)",
            request.batch_id,
            request.job_id,
        )
        return
    claim, skip = claim_batch(
        runtime.redis, runtime.results_redis, request.batch_id, str(self.request.id)
    )
    if skip is not None:
        runtime.metrics.batch_skipped(skip[0])
        log.info("batch %s acknowledged without grading: %s", self.request.id, skip[1])
        return
    lane = _lane(self)
    runtime.metrics.queue_wait(time.time() - request.enqueued_at, lane=lane)
    try:
        with runtime.metrics.busy():
            BatchRun(
                runtime,
                request,
                self,
                lane=lane,
                items_digest=digest,
                items_key=key,
                claim=claim,
                unit=unit,
            ).run()
    except BaseException:
        release(claim)  # a re-send grades it at once (the result ends it otherwise)
        raise


def _read_delivery(
    runtime: WorkerRuntime, task_id: str, wire: dict[str, Any], key: str | None
) -> tuple[bytes | None, tuple[str, str] | None]:
    """The stored items (if by reference), and why this delivery needs no grading:
    (a `SKIP_REASONS` label, a log line).

    It needs none when it is a copy of a batch whose result is stored (a re-send
    after a slow or lost worker, the first copy already answered: acked, never
    graded twice), or of a job no producer waits for: its job board entry is
    gone and the producer said it keeps it alive (`kept_alive`: a thread
    refreshes it every second while the producer lives), or, from an older
    producer, its items are gone too or the message is older than
    `ABANDONED_AFTER_S`. Both used to be graded for nobody or to fail noisily.
    One round trip when the broker and the result backend are one Redis.
    """
    job_id = wire.get("job_id")
    job_id = job_id if isinstance(job_id, str) else None
    pipe = runtime.redis.pipeline(transaction=False)
    if key is not None:
        # GETRANGE, not GET: an oversized value is refused without being read
        # whole (the stubs leave `getrange` untyped, hence the raw command).
        pipe.execute_command("GETRANGE", key, 0, MAX_PAYLOAD_BYTES)  # type: ignore[no-untyped-call]
    if job_id is not None:
        pipe.exists(job_entry_key(job_id))
    meta_pipe = pipe
    if runtime.results_redis is not runtime.redis:
        meta_pipe = runtime.results_redis.pipeline(transaction=False)
    read_result_head(meta_pipe, task_id)
    replies = list(pipe.execute())
    if meta_pipe is not pipe:
        replies += meta_pipe.execute()
    payload = replies.pop(0) if key is not None else None
    job_alive = bool(replies.pop(0)) if job_id is not None else True
    if is_result_head(replies[0]):
        return payload, ("answered", "its result is already stored")
    if job_alive:
        # Items gone while the job lives: `attach_items` fails the task at once,
        # a signal for its producer to store them again with a re-send (a copy of
        # a batch already answered ends there too: never graded twice).
        return payload, None
    abandoned = _abandoned(wire, job_id, bool(key is None or payload))
    if abandoned is not None and key is not None:
        # Its producer is gone: nobody else deletes them before their TTL.
        with contextlib.suppress(redis.RedisError, OSError):
            runtime.redis.delete(key)
    return payload, None if abandoned is None else ("abandoned", abandoned)


def _abandoned(wire: dict[str, Any], job_id: str | None, has_items: bool) -> str | None:
    """Why the batch of a job without a board entry is abandoned, else None."""
    if wire.get("kept_alive") is True:
        return f"job {job_id} has no live producer (its board entry is gone)"
    if not has_items:
        return "its items and its job are gone (its producer ended)"
    enqueued_at = wire.get("enqueued_at")
    age_s = time.time() - enqueued_at if isinstance(enqueued_at, int | float) else 0
    if age_s > ABANDONED_AFTER_S:
        return f"no producer has watched job {job_id} for {age_s:.0f} s"
    return None


def _lane(task: Task[Any, Any]) -> str:
    """The lane of the queue this delivery came from (kombu's routing key is the
    queue's name); work from a queue of no lane counts as interactive."""
    info = task.request.delivery_info or {}
    return lane_of_queue(str(info.get("routing_key", ""))) or INTERACTIVE
