"""Merge concurrent small grading calls into batches and fan the verdicts back out.

Reward hooks call the grader one sample at a time, concurrently (verl's reward loop,
Inspect's scorers, OpenRLHF's per-sample requests); a batch costs the fleet about as
much as one item, so per-sample calls are queued here per `GradeOptions`, lane and
kind (a batch has one of each) and flushed as one batch when `max_batch_items` are
waiting or the oldest has waited `max_delay_s`. At most `max_in_flight` batches of a
kind run at once; while all its slots are busy the queue grows, so batches get bigger
exactly when the backend is the bottleneck.

Kinds never share a batch or a slot: a code batch (its golds are encoded tests,
`workers.code.item`) may take seconds of sandbox time, so math items never wait in
it or behind it for a free slot (issue 40).

Every item has its own future: a caller that is cancelled or whose deadline passes
stops waiting for its own items only. Items whose caller is gone before their batch
is flushed are dropped from it; nobody else waits longer or loses a verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from producer.errors import ProducerError
from workers.code.item import CODE_GOLD_PREFIX
from workers.models import GradeOptions, Status, Verdict, ungraded_verdict
from workers.wire.contract import batch_sizes
from workers.wire.lanes import INTERACTIVE, Lane

__all__ = [
    "DEFAULT_MAX_BATCH_ITEMS",
    "DEFAULT_MAX_DELAY_S",
    "BatchGradeFn",
    "Coalescer",
    "OverloadedError",
    "failure_verdict",
    "wait_for_items",
]

# Defaults measured with tests/bench/bench_serve.py (2 workers, 2,000 concurrent
# single-item calls): a few ms of wait fills batches of tens of items at that load
# and costs a lone caller no more than the wait itself.
DEFAULT_MAX_BATCH_ITEMS = 256
DEFAULT_MAX_DELAY_S = 0.005
DEFAULT_MAX_IN_FLIGHT = 64
DEFAULT_MAX_BACKLOG_ITEMS = 200_000

BatchGradeFn = Callable[
    [list[tuple[str, str]], GradeOptions, Lane], Awaitable[list[Verdict]]
]
# The kind of a batch: its items' golds are code tests (True) or math answers.
_Key = tuple[GradeOptions, Lane, bool]


class OverloadedError(ProducerError):
    """More items are waiting than the coalescer accepts; retry after a pause."""

    exit_code = 7

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def failure_verdict(status: Status, reason: str, grader_version: str = "") -> Verdict:
    """A verdict for an item that was not graded (deadline, backend failure)."""
    return ungraded_verdict(status, reason, grader_version)


@dataclass(slots=True)
class _Bucket:
    """Items waiting for one options value, lane and kind, oldest first."""

    items: list[tuple[tuple[str, str], asyncio.Future[Verdict]]] = field(
        default_factory=list
    )
    first_at: float = 0.0
    timer: asyncio.TimerHandle | None = None


class Coalescer:
    """Batches concurrent `grade()` calls onto `grade_batch` (one event loop).

    Args:
        grade_batch: grades a list of `(response, gold)` pairs with the given
            options in the given lane; verdicts in order.
        max_batch_items: flush as soon as this many items wait (and the biggest batch).
        max_delay_s: flush once the oldest waiting item has waited this long.
        max_in_flight: batches of a kind running at once (1 for a backend that
            grades one batch at a time, such as the embedded pool).
        max_backlog_items: waiting plus running items above which `grade()` raises
            OverloadedError instead of queueing more (backpressure).
    """

    def __init__(
        self,
        grade_batch: BatchGradeFn,
        *,
        max_batch_items: int = DEFAULT_MAX_BATCH_ITEMS,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_backlog_items: int = DEFAULT_MAX_BACKLOG_ITEMS,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        if min(max_batch_items, max_in_flight, max_backlog_items) < 1:
            raise ValueError("batch size, in-flight and backlog limits must be >= 1")
        self._grade_batch = grade_batch
        self.max_batch_items = max_batch_items
        self.max_delay_s = max_delay_s
        self.max_in_flight = max_in_flight
        self.max_backlog_items = max_backlog_items
        self.on_batch = on_batch
        self._buckets: dict[_Key, _Bucket] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = {False: 0, True: 0}  # batches in flight, by kind (code?)
        self._backlog = 0
        self._closed = False
        self.grader_version = ""
        # Batch size -> batches flushed at that size (bounded: sizes <= max items).
        self.batch_sizes: Counter[int] = Counter()

    @property
    def backlog_items(self) -> int:
        """Items accepted and not yet graded (waiting or in a running batch)."""
        return self._backlog

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def grade(
        self,
        pairs: Sequence[tuple[str, str]],
        options: GradeOptions,
        *,
        lane: Lane = INTERACTIVE,
        deadline_s: float | None = None,
    ) -> list[Verdict]:
        """Verdicts for `pairs` in order; items unfinished after `deadline_s` come
        back as `timeout` verdicts (never an exception, never a hang). `lane`: the
        fleet lane of their batch.

        Raises:
            OverloadedError: the backlog is full (nothing was queued).
        """
        futures = self.submit(pairs, options, lane=lane)
        try:
            await wait_for_items(futures, deadline_s)
        finally:
            self._cancel(futures)
        return self.collect(futures, deadline_s)

    def submit(
        self,
        pairs: Sequence[tuple[str, str]],
        options: GradeOptions,
        *,
        lane: Lane = INTERACTIVE,
    ) -> list[asyncio.Future[Verdict]]:
        """Queue `pairs`; a future per item, in order. The caller waits on them
        (`wait_for_items`) and then calls `collect` with them, also when it stops
        waiting early: that frees the items not graded yet.

        Raises:
            OverloadedError: the backlog is full (nothing was queued).
        """
        if self._closed:
            raise ProducerError("the grader is closed")
        if not pairs:
            return []
        if self._backlog + len(pairs) > self.max_backlog_items:
            raise OverloadedError(
                f"{self._backlog} rollouts are waiting to be graded "
                f"(limit {self.max_backlog_items})",
                retry_after_s=1.0,
            )
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Verdict]] = [loop.create_future() for _ in pairs]
        if any(gold.startswith(CODE_GOLD_PREFIX) for _, gold in pairs):
            for pair, future in zip(pairs, futures, strict=True):
                code = pair[1].startswith(CODE_GOLD_PREFIX)
                self._bucket((options, lane, code)).items.append((pair, future))
        else:
            bucket = self._bucket((options, lane, False))
            bucket.items.extend(zip(pairs, futures, strict=True))
        self._backlog += len(pairs)
        self._pump()
        return futures

    def _bucket(self, key: _Key) -> _Bucket:
        """The bucket of `key`, its clock started if it was empty."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
        if not bucket.items:
            bucket.first_at = time.monotonic()
        return bucket

    def collect(
        self, futures: list[asyncio.Future[Verdict]], deadline_s: float | None
    ) -> list[Verdict]:
        """The verdicts of `submit`'s futures, in order; an item not graded yet is
        dropped from its batch and comes back `timeout` (past `deadline_s`)."""
        self._cancel(futures)
        return [self._outcome(future, deadline_s) for future in futures]

    @staticmethod
    def _cancel(futures: list[asyncio.Future[Verdict]]) -> None:
        for future in futures:
            future.cancel()  # no-op once done; frees our items otherwise

    def _outcome(
        self, future: asyncio.Future[Verdict], deadline_s: float | None
    ) -> Verdict:
        if not future.cancelled():
            return future.result()
        reason = (
            "the grader closed before this item was graded"
            if deadline_s is None
            else f"not graded within the request's deadline of {deadline_s:g} s"
        )
        return failure_verdict(Status.TIMEOUT, reason, self.grader_version)

    def _pump(self) -> None:
        """Flush every bucket that is full or due, as far as free slots allow."""
        now = time.monotonic()
        running = self._running
        for key, bucket in self._buckets.items():
            while bucket.items and running[key[2]] < self.max_in_flight:
                full = len(bucket.items) >= self.max_batch_items
                if not (full or now - bucket.first_at >= self.max_delay_s):
                    break
                self._flush(key, bucket, now)
            self._arm_timer(key, bucket, now)

    def _arm_timer(self, key: _Key, bucket: _Bucket, now: float) -> None:
        if bucket.timer is not None or not bucket.items:
            return
        if self._running[key[2]] >= self.max_in_flight:
            return  # the kind's next finished batch pumps again
        delay_s = max(0.0, bucket.first_at + self.max_delay_s - now)
        bucket.timer = asyncio.get_running_loop().call_later(
            delay_s, self._on_timer, bucket
        )

    def _on_timer(self, bucket: _Bucket) -> None:
        bucket.timer = None
        self._pump()

    def _flush(self, key: _Key, bucket: _Bucket, now: float) -> None:
        chars = (len(pair[0]) + len(pair[1]) for pair, _future in bucket.items)
        count = next(batch_sizes(chars, self.max_batch_items))
        taken = bucket.items[:count]
        del bucket.items[:count]
        bucket.first_at = now
        if bucket.timer is not None:
            bucket.timer.cancel()
            bucket.timer = None
        live = [(pair, future) for pair, future in taken if not future.done()]
        self._backlog -= len(taken) - len(live)
        if not live:
            return
        self.batch_sizes[len(live)] += 1
        if self.on_batch is not None:
            self.on_batch(len(live))
        task = asyncio.get_running_loop().create_task(self._run(key, live))
        self._tasks.add(task)
        self._running[key[2]] += 1
        task.add_done_callback(functools.partial(self._batch_done, key[2]))

    def _batch_done(self, code: bool, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._running[code] -= 1
        if not self._closed:
            self._pump()

    async def _run(
        self,
        key: _Key,
        live: list[tuple[tuple[str, str], asyncio.Future[Verdict]]],
    ) -> None:
        try:
            pairs = [pair for pair, _ in live]
            verdicts = await self._grade_batch(pairs, key[0], key[1])
            if len(verdicts) != len(live):  # a backend bug must not look like success
                raise ProducerError(
                    f"backend returned {len(verdicts)} verdicts for {len(live)} items"
                )
        except asyncio.CancelledError:
            for _, future in live:
                future.cancel()  # the coalescer is closing: callers see `timeout`
            raise
        except Exception as exc:  # any backend failure becomes per-item verdicts
            reason = f"grading backend failed: {type(exc).__name__}: {exc}"
            verdicts = [
                failure_verdict(Status.ERROR, reason, self.grader_version)
            ] * len(live)
        finally:
            self._backlog -= len(live)
        for (_, future), verdict in zip(live, verdicts, strict=True):
            if verdict.grader_version:
                self.grader_version = verdict.grader_version
            if not future.done():
                future.set_result(verdict)

    async def aclose(self) -> None:
        """Stop: running batches are cancelled, their callers get `timeout`."""
        self._closed = True
        for bucket in self._buckets.values():
            if bucket.timer is not None:
                bucket.timer.cancel()
            for _, future in bucket.items:
                future.cancel()
            bucket.items.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def wait_for_items(
    futures: Sequence[asyncio.Future[Verdict]],
    timeout_s: float | None,
    *,
    unless: asyncio.Future[Any] | None = None,
) -> None:
    """Return once every future is done, `timeout_s` has passed, or `unless` (say,
    a watch for the client's disconnect) is done; nothing is cancelled here.

    One gate future with done callbacks rather than `asyncio.wait`, which builds a
    waiter and a set of futures per call: with thousands of one-item requests a
    second, that was a visible part of the service's CPU per request.
    """
    if all(future.done() for future in futures):
        return
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    pending = [future for future in futures if not future.done()]
    left = len(pending)

    def release(_: object = None) -> None:
        if not gate.done():
            gate.set_result(None)

    def one_done(_: asyncio.Future[Verdict]) -> None:
        nonlocal left
        left -= 1
        if left == 0:
            release()

    for future in pending:
        future.add_done_callback(one_done)
    if unless is not None:
        unless.add_done_callback(release)
    timer = None if timeout_s is None else loop.call_later(timeout_s, release)
    try:
        await gate
    finally:
        if timer is not None:
            timer.cancel()
        for future in pending:
            future.remove_done_callback(one_done)
        if unless is not None:
            unless.remove_done_callback(release)
