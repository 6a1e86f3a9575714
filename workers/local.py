"""Embedded mode: the fleet's batch grading in a pool of local processes.

Same `BatchGrader`, same `Sandbox` limits, same verdicts as a Celery worker; the cache
is a `SqliteResultCache` file shared by the pool's processes (or none).

Why plain `os.fork` workers talking length-prefixed JSON over pipes (the sandbox's own
machinery) rather than multiprocessing: the parent has already imported the verifier,
so each worker starts warm (a forkserver or spawn worker would import SymPy again);
nothing is pickled, so any grade function (tests inject hostile ones) crosses as-is;
and it works from any parent, daemonic or not. The usual fork hazard, a lock held
by another parent thread, does not bite: a worker closes every inherited fd, freezes
inherited objects (no finalizer of the parent's files runs in it), never returns into
the parent's code, and CPython re-initialises its import/logging locks at fork.
Workers die with the parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from workers import verifier
from workers.batch import BatchGrader, GradeItem
from workers.cache import SqliteResultCache
from workers.childproc import fork_child, read_frame, write_frame
from workers.errors import DeadlineError, SandboxError
from workers.exact_cache import ExactLayer
from workers.models import GradeOptions, RolloutLike, Verdict
from workers.sandbox import GradeFn, Sandbox, warm_up_verifier
from workers.sizing import (
    CACHE_WRITE_BEHIND_ROWS,
    LOCAL_BATCH_SIZE,
    RECYCLE_AFTER_ITEMS,
)
from workers.verdicts import poison_verdict

__all__ = ["LocalPool"]

_STOP_GRACE_S = 5.0
_POLL_MS = 1000.0
# Batches sent to a worker before it answers the first: the next one waits in its
# pipe, so a worker never idles while the CLI reads its answer and picks more work
# (on a busy machine the CLI may wait for a core first).
_WORKER_BATCHES = 2
# Room for those batches in the request pipe (the default is 64 KiB, about one
# batch): a full pipe would block the CLI until the worker reads.
_REQUEST_PIPE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class _WorkerConfig:
    item_timeout_s: float
    item_memory_bytes: int
    recycle_after_items: int
    cache_path: Path | None
    grade_fn: GradeFn | None


@dataclass(slots=True, kw_only=True)
class _Worker:
    pid: int
    to_fd: int
    from_fd: int
    batches: deque[int] = field(default_factory=deque)  # sent, oldest first
    deadline: float = 0.0


def _worker_loop(to_fd: int, from_fd: int, config: _WorkerConfig) -> None:
    sandbox = Sandbox(
        item_timeout_s=config.item_timeout_s,
        item_memory_bytes=config.item_memory_bytes,
        recycle_after_items=config.recycle_after_items,
        grade_fn=config.grade_fn,
    )
    cache = exact = None
    if config.cache_path is not None:
        cache = SqliteResultCache(
            config.cache_path, write_behind_rows=CACHE_WRITE_BEHIND_ROWS
        )
        if config.grade_fn is None:  # whole verdicts of the verifier's only
            exact = ExactLayer(cache, verifier.GRADER_VERSION)
    grader = BatchGrader(sandbox=sandbox, cache=cache, exact=exact)
    try:
        while (message := read_frame(to_fd)) is not None:
            items = [GradeItem(i, r, g) for i, r, g in message["items"]]
            results = grader.grade(items, GradeOptions.from_dict(message["options"]))
            reply = [[index, verdict.to_dict()] for index, verdict in results]
            write_frame(from_fd, {"batch": message["batch"], "results": reply})
    finally:
        sandbox.close()
        if cache is not None:
            cache.close()


def _worker_main(to_fd: int, from_fd: int, config: _WorkerConfig) -> int:
    with contextlib.suppress(BrokenPipeError):  # the parent is gone: just exit
        _worker_loop(to_fd, from_fd, config)
    return 0


def _spawn_worker(config: _WorkerConfig) -> _Worker:
    pid, to_fd, from_fd = fork_child(lambda r, w: _worker_main(r, w, config))
    with contextlib.suppress(OSError):  # above pipe-max-size: the default stays
        fcntl.fcntl(to_fd, fcntl.F_SETPIPE_SZ, _REQUEST_PIPE_BYTES)
    return _Worker(pid=pid, to_fd=to_fd, from_fd=from_fd)


def _exited(pid: int) -> bool:
    """Reap `pid` if it has exited (True also when someone else already reaped it)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _stop_worker(worker: _Worker, *, graceful: bool) -> None:
    """Ask (EOF) or force (SIGKILL) a worker to exit, then reap it and close its fds."""
    os.close(worker.to_fd)
    deadline = time.monotonic() + (_STOP_GRACE_S if graceful else 0.0)
    exited = _exited(worker.pid)
    while not exited and time.monotonic() < deadline:
        time.sleep(0.005)
        exited = _exited(worker.pid)
    if not exited:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(worker.pid, 0)
    os.close(worker.from_fd)


def _check_deadline(deadline_at: float | None, job: _Job) -> None:
    if deadline_at is not None and time.monotonic() >= deadline_at:
        missing = sum(verdict is None for verdict in job.verdicts)
        raise DeadlineError(
            f"deadline passed with {missing} of {len(job.verdicts)} items ungraded",
            partial=list(job.verdicts),
        )


@dataclass(slots=True, kw_only=True)
class _Job:
    """One `grade()` call: its batches, what is pending, and the verdicts so far."""

    items: Sequence[RolloutLike]
    options: GradeOptions
    batches: list[range]
    pending: deque[int]
    attempts: list[int]
    verdicts: list[Verdict | None]
    batches_left: int
    items_done: int = 0


class LocalPool:
    """N local worker processes, each with a `BatchGrader` and its own `Sandbox`.

    Args:
        processes: number of worker processes.
        item_timeout_s: wall-clock deadline per item (as the fleet).
        item_memory_bytes: memory cap per item (as the fleet).
        cache_path: SQLite cache file shared by the workers; None for no cache.
        batch_size: items per batch handed to one worker.
        recycle_after_items: sandbox child recycling, as the fleet.
        grade_fn: the function the sandboxes run (default `workers.verifier.grade`).
        max_attempts: a batch whose worker process dies is re-run on a fresh worker
            up to this many times in all, then answered with `error` verdicts.

    Verdicts come back in input order; none is ever lost.
    """

    def __init__(
        self,
        *,
        processes: int,
        item_timeout_s: float,
        item_memory_bytes: int,
        cache_path: Path | None,
        batch_size: int = LOCAL_BATCH_SIZE,
        recycle_after_items: int = RECYCLE_AFTER_ITEMS,
        grade_fn: GradeFn | None = None,
        max_attempts: int = 3,
    ) -> None:
        if processes < 1 or batch_size < 1 or max_attempts < 1:
            raise ValueError("processes, batch_size and max_attempts must be >= 1")
        self._processes = processes
        self._batch_size = batch_size
        self._max_attempts = max_attempts
        self._item_timeout_s = item_timeout_s
        self._config = _WorkerConfig(
            item_timeout_s=item_timeout_s,
            item_memory_bytes=item_memory_bytes,
            recycle_after_items=recycle_after_items,
            cache_path=cache_path,
            grade_fn=grade_fn,
        )
        self._workers: dict[int, _Worker] = {}  # by from_fd

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes."""
        return [worker.pid for worker in self._workers.values()]

    def grade(
        self,
        items: Sequence[RolloutLike],
        options: GradeOptions,
        on_progress: Callable[[int], None] | None = None,
        deadline_at: float | None = None,
    ) -> list[Verdict]:
        """Grade `items`; verdict i belongs to items[i].

        `on_progress` gets the running total of graded items. Past `deadline_at`
        (`time.monotonic()` seconds) the busy workers are stopped and DeadlineError
        is raised.
        """
        size = self._batch_size
        batches = [
            range(s, min(s + size, len(items))) for s in range(0, len(items), size)
        ]
        job = _Job(
            items=items,
            options=options,
            batches=batches,
            pending=deque(range(len(batches))),
            attempts=[0] * len(batches),
            verdicts=[None] * len(items),
            batches_left=len(batches),
        )
        try:
            while job.batches_left:
                _check_deadline(deadline_at, job)
                self._dispatch(job)
                self._collect(job, on_progress, deadline_at)
        except BaseException:
            self._stop_all(graceful=False)  # busy workers hold stale batches
            raise
        verdicts = [verdict for verdict in job.verdicts if verdict is not None]
        if len(verdicts) != len(items):  # a bug here must never look like success
            raise SandboxError(f"local pool lost {len(items) - len(verdicts)} items")
        return verdicts

    def close(self) -> None:
        """Stop every worker (they finish nothing: call between `grade()` calls)."""
        self._stop_all(graceful=True)

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals ---

    def _stop_all(self, *, graceful: bool) -> None:
        workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            _stop_worker(worker, graceful=graceful)

    def _dispatch(self, job: _Job) -> None:
        if len(self._workers) < self._processes:
            warm_up_verifier()  # once per process: workers inherit a warm verifier
        while len(self._workers) < self._processes:
            worker = _spawn_worker(self._config)
            self._workers[worker.from_fd] = worker
        for worker in list(self._workers.values()):
            while len(worker.batches) < _WORKER_BATCHES and job.pending:
                if not self._send(worker, job, job.pending.popleft()):
                    break

    def _send(self, worker: _Worker, job: _Job, batch_id: int) -> bool:
        """Send a batch; False if the worker was found dead (and replaced)."""
        batch = job.batches[batch_id]
        job.attempts[batch_id] += 1
        worker.batches.append(batch_id)
        # Backstop only: each item is already bounded by the sandbox deadline.
        worker.deadline = (
            max(worker.deadline, time.monotonic())
            + len(batch) * (self._item_timeout_s + 1)
            + 60
        )
        wire = [[i, job.items[i].response, job.items[i].gold] for i in batch]
        message = {"batch": batch_id, "options": job.options.to_dict(), "items": wire}
        try:
            write_frame(worker.to_fd, message)
        except BrokenPipeError:
            self._worker_lost(worker, job)
            return False
        return True

    def _collect(
        self,
        job: _Job,
        on_progress: Callable[[int], None] | None,
        deadline_at: float | None,
    ) -> None:
        busy = [w for w in self._workers.values() if w.batches]
        if not busy:
            return
        poller = select.poll()
        for worker in busy:
            poller.register(
                worker.from_fd, select.POLLIN | select.POLLHUP | select.POLLERR
            )
        wait_ms = _POLL_MS
        if deadline_at is not None:
            wait_ms = max(0.0, min(wait_ms, (deadline_at - time.monotonic()) * 1000))
        for fd, _event in poller.poll(wait_ms):
            worker = self._workers[fd]
            reply = read_frame(fd)
            if reply is None:
                self._worker_lost(worker, job)
            else:
                self._accept(worker, job, reply)
                if on_progress is not None:
                    on_progress(job.items_done)
        now = time.monotonic()
        for worker in busy:
            if worker.from_fd in self._workers and worker.deadline < now:
                self._worker_lost(worker, job)

    def _accept(self, worker: _Worker, job: _Job, reply: dict[str, Any]) -> None:
        batch_id = worker.batches[0] if worker.batches else None
        if batch_id is None or reply.get("batch") != batch_id:  # never a stale answer
            raise SandboxError(f"local worker {worker.pid} answered an unknown batch")
        worker.batches.popleft()
        for index, verdict in reply["results"]:
            job.verdicts[index] = Verdict.from_dict(verdict)
        job.items_done += len(job.batches[batch_id])
        job.batches_left -= 1

    def _worker_lost(self, worker: _Worker, job: _Job) -> None:
        """A worker died (or overran the backstop): re-run its batches elsewhere.

        Only the oldest was being graded (answers come in order): the batches
        queued behind it go back without counting an attempt.
        """
        del self._workers[worker.from_fd]
        _stop_worker(worker, graceful=False)
        if not worker.batches:
            return
        batch_id, *queued = worker.batches
        worker.batches.clear()
        for later in reversed(queued):
            job.attempts[later] -= 1
            job.pending.appendleft(later)
        if job.attempts[batch_id] < self._max_attempts:
            job.pending.appendleft(batch_id)
            return
        for index in job.batches[batch_id]:
            item = job.items[index]
            job.verdicts[index] = poison_verdict(
                item.response, item.gold, job.options, job.attempts[batch_id]
            )
        job.items_done += len(job.batches[batch_id])
        job.batches_left -= 1
