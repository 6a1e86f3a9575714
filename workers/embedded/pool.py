"""Embedded mode: the fleet's batch grading in a pool of local processes.

Same `BatchGrader`, same limits (item deadline, memory cap), same verdicts as a
Celery worker; the cache is a `SqliteResultCache` file shared by the pool's processes
(or none). Unlike a Celery worker, a pool worker grades its items in its own process
(`workers.embedded.inline`), and this process, its parent, is the watchdog: it reads
which item each worker is on from a shared `ProgressSlot`, kills a worker whose item
overruns the deadline or the memory cap, answers that item and sends the rest of
the batch again. A prefork child must outlive its items, so the fleet keeps its
sandbox child; here that extra process and its pipes cost more CPU than the
grading (issue 11).

Two kinds of work: `grade` sends rollouts and gets verdicts back; `run_units` sends
units (a little JSON and raw bytes: the CLI's JSONL lines, `workers.lines.units`) that
the workers turn into results with the pool's `unit_fn`, so the caller's own
per-rollout work (parsing, encoding output) runs in the workers too. The limits are
the same: a unit's items are numbered in the slot, and a unit sent again after its
worker was lost carries the culprit's failure with it, and the verdicts its unit
function kept before (`UnitGrading.keep`: a slow unit's, sent to the caller as they
come). A fleet worker process grades its units of lines with a pool of one such
worker (`workers.fleet.line_batch`).

Why plain `os.fork` workers talking length-prefixed JSON over pipes rather than
multiprocessing: the parent has already imported the verifier, so each worker starts
warm (a forkserver or spawn worker would import SymPy again); nothing is pickled, so
any grade function (tests inject hostile ones) crosses as-is; and it works from any
parent, daemonic or not. The usual fork hazard, a lock held by another parent
thread, does not bite: a worker closes every inherited fd, freezes inherited objects
(no finalizer of the parent's files runs in it), never returns into the parent's
code, and CPython re-initialises its import/logging locks at fork. Workers die with
the parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from workers.cache.exact import ExactLayer, unit_text
from workers.cache.results import CacheBackend, SqliteResultCache
from workers.code.item import code_row_limits
from workers.embedded.batch import BatchGrader, DecisionMemo, GradeItem, NullObserver
from workers.embedded.inline import InlineGrader
from workers.errors import CacheError, DeadlineError, SandboxError
from workers.kinds import DEFAULT_KIND, grader_for
from workers.models import (
    GradeOptions,
    RolloutLike,
    Status,
    Verdict,
    is_final,
)
from workers.sandbox.child import EXIT_MEMORY, death_status
from workers.sandbox.childproc import (
    fork_child,
    limit_address_space,
    open_statm,
    read_body_frame,
    recycle_rss_bytes,
    self_size_bytes,
    statm_rss_bytes,
    write_body_frame,
)
from workers.sandbox.process import GradeFn, warm_up_verifier
from workers.sandbox.progress import CODE, DECIDE, ProgressSlot, Step
from workers.sandbox.verdicts import (
    MEMORY_ERROR_REASON,
    culprit_verdict,
    deadline_reason,
    memory_cap_reason,
    poison_reason,
    poison_verdict,
)
from workers.sizing import (
    CACHE_WRITE_BEHIND_BYTES,
    CACHE_WRITE_BEHIND_ROWS,
    LOCAL_BATCH_SIZE,
    RECYCLE_AFTER_ITEMS,
)

__all__ = ["GradePairs", "LocalPool", "Unit", "UnitFn", "UnitGrading"]

log = logging.getLogger(__name__)

_STOP_GRACE_S = 5.0
# How often a stopping worker is looked for: the pool's close waits for its
# workers' exits (their cache rows written), and the CLI for the close.
_STOP_POLL_S = 0.001
# How often the parent looks at its workers' progress slots and RSS while it waits
# for answers (answers wake it sooner): the granularity of the deadline and the cap.
_WATCH_S = 0.01
# Past a code item's own wall budget (`CodeLimits.wall_s`), before the pool kills
# its worker: the sandbox's first start in a worker (its two zygotes) is in it.
CODE_STEP_GRACE_S = 30.0
# A batch's backstop: its items' deadlines (+1 s each) and this.
_BACKSTOP_S = 60.0
# Batches sent to a worker before it answers the first: the next one waits in its
# pipe, so a worker never idles while the CLI reads its answer and picks more work
# (on a busy machine the CLI may wait for a core first).
_WORKER_BATCHES = 2
# Room for those batches in the request pipe (the default is 64 KiB, about one
# batch): a full pipe would block the CLI until the worker reads. And for a few
# answers in the reply pipe: a unit's output lines are some 100 KB, and a worker
# whose answer does not fit waits for the CLI to read it (busy with the other
# worker's, or sending) instead of starting its next batch.
_REQUEST_PIPE_BYTES = 1 << 20
_REPLY_PIPE_BYTES = 1 << 20
# A worker does its cache work (`_HeldRows`) once no batch has come for this long:
# with `_WORKER_BATCHES` queued, an empty pipe means the caller's call has run out
# of work, and while it writes its output and reads its next chunk this core is
# free. So the rows are built and written between the CLI's chunks, not between
# units nor while the pool closes at the end of the run, the CLI waiting.
_IDLE_FLUSH_S = 0.005
# Graded units whose cache rows a worker holds at most before writing them (a
# 20,000-line chunk is ~160 units a worker of 2); each holds its rows' JSON text,
# some 8 KB.
_HELD_UNITS = 256
# A worker that looks its units up (`run_units`' `look_up`) and missed this many in
# a row (a file it has not graded) looks up only every `_PROBE_EVERY`th unit after,
# until one is found: a cold run's lookups were 40 us a unit, 2% of its workers'
# CPU (issue 11: each read after the other worker's write reads pages again). A
# held unit not looked up is graded again, at most `_PROBE_EVERY` - 1 in a row.
_MISSES_BEFORE_PROBING = 16
_PROBE_EVERY = 16
# Deaths the item in the slot caused itself (an abort, a segfault); a SIGKILL or
# SIGTERM from elsewhere (an operator, the OOM killer) says nothing about the item,
# so its batch is run again instead.
_NOT_THE_ITEMS_DOING = {signal.SIGKILL, signal.SIGTERM}


# What a unit function gets to grade with: (response, gold) pairs and the options,
# verdicts in the same order.
GradePairs = Callable[[Sequence[tuple[str, str]], GradeOptions], list[Verdict]]
# A unit, and a unit's result: JSON and raw bytes (which cross the pipe as they are).
Unit = tuple[Any, bytes]


class UnitGrading(Protocol):
    """What a unit function grades with (`GradePairs`), and more for those that
    want it: the items it graded itself, and a way to keep verdicts before the
    unit ends."""

    def __call__(
        self, pairs: Sequence[tuple[str, str]], options: GradeOptions
    ) -> list[Verdict]: ...

    @property
    def graded(self) -> list[tuple[Verdict, float]]:
        """(verdict, seconds) of each item this process graded or answered as a
        culprit in this unit so far: not those answered from `keep`."""

    @property
    def culprits(self) -> frozenset[int]:
        """Item numbers that cost an earlier worker its life on this unit (answered
        as failures here) and were not kept since."""

    @property
    def stored(self) -> str | None:
        """What the cache kept under this unit's key when the pool was asked to
        look it up here (`run_units`' `look_up`), undecoded; else None."""

    def keep(self, verdicts: dict[int, Verdict], note: Any = None) -> None:
        """Send these verdicts (by item number across the unit's calls) and `note`
        (JSON) to the pool's caller now (`run_units`' `on_kept`); if the unit is
        sent again, they are answered from here, not graded again."""


# Turns one unit into its result, grading through what it is given; runs in a
# worker, so it must be deterministic: a unit sent again after its worker was lost
# must ask for the same pairs in the same order.
UnitFn = Callable[[Any, bytes, UnitGrading], Unit]


@dataclass(frozen=True, slots=True, kw_only=True)
class _WorkerConfig:
    item_timeout_s: float
    item_memory_bytes: int
    recycle_after_items: int
    cache_path: Path | None
    grade_fn: GradeFn | None
    unit_fn: UnitFn | None
    # Unit functions that want `UnitGrading.graded` (it costs a list entry an item).
    collect_graded: bool
    # Builds, in the worker, a cache for code items where there is no cache file
    # (a fleet's line pool: the fleet's Redis cache).
    code_cache: Callable[[], CacheBackend] | None = None


@dataclass(slots=True, kw_only=True)
class _Worker:
    pid: int
    to_fd: int
    from_fd: int
    slot: ProgressSlot
    statm_fd: int
    rss_cap_bytes: int
    recycle_rss_bytes: int  # grown past this (after a batch): replaced when idle
    batches: deque[tuple[int, list[int]]] = field(default_factory=deque)  # oldest 1st
    deadline: float = 0.0
    items_sent: int = 0
    retiring: bool = False  # no more batches: replaced once its last is answered
    # Why this process killed it (status, reason), for the item in its slot; and
    # for a deadline, the (batch, position) seen overrunning it.
    killed_for: tuple[Status, str] | None = None
    overran: tuple[int, int] | None = None

    def rss_bytes(self) -> int:
        return statm_rss_bytes(self.statm_fd)


def _worker_loop(
    to_fd: int, from_fd: int, config: _WorkerConfig, slot: ProgressSlot
) -> None:
    inline = InlineGrader(slot, config.grade_fn)
    cache = exact = None
    if config.cache_path is not None:
        cache = SqliteResultCache(
            config.cache_path,
            write_behind_rows=CACHE_WRITE_BEHIND_ROWS,
            write_behind_bytes=CACHE_WRITE_BEHIND_BYTES,
        )
        if config.grade_fn is None:  # whole verdicts of the verifier's only
            exact = ExactLayer(cache, grader_for(DEFAULT_KIND).version)
    # One memo of decided answers for the worker's life (`DecisionMemo`): its
    # batches of a few dozen rows hold few copies of an answer, its life many. The
    # verifier's decisions only: another grade function may look past the answer.
    # Not in front of an answer cache, whose hits say `cached` (a memo's do not).
    memo = DecisionMemo() if config.grade_fn is None else None
    code_cache = cache or (config.code_cache() if config.code_cache else None)
    grader = BatchGrader(
        sandbox=inline,
        cache=cache,
        exact=exact,
        memo=memo if cache is None else None,
        code_steps=inline,
        code_cache=code_cache,
    )
    # A unit's result is stored whole, once (`ExactLayer.store_units`), and units use
    # no answer layer: a hit there still needs the response prepared and only saves
    # deciding it, and its lookups and stores cost a cold run of unique rollouts
    # more than that (measured, issue 11: some 15-20 us a rollout against 1-4 for
    # the unit rows alone). The memo saves the same deciding for a dict lookup.
    collector = _Collector() if config.collect_graded else None
    unit_grader = BatchGrader(
        sandbox=inline,
        cache=None,
        observer=collector,
        memo=memo,
        code_steps=inline,
        code_cache=code_cache,
    )
    # The soft limit only: a code item's sandbox, started from here, sets its own.
    limit_address_space(self_size_bytes()[0] + config.item_memory_bytes, soft_only=True)
    held = None if cache is None else _HeldRows(cache, exact)
    probes = _Probes()
    try:
        while (frame := read_body_frame(to_fd)) is not None:
            message, body = frame
            inline.batch = message["batch"]
            to_hold = None
            if "unit" in message:
                assert config.unit_fn is not None
                send_kept = _kept_sender(from_fd, message["batch"])
                key = message.get("key")
                found = None
                if key is None and message.get("look_up") and exact is not None:
                    key = exact.unit_key(message["unit"], body)
                    if probes.due():
                        found = _looked_up(exact, key)
                    probes.saw(found is not None)
                grade = _UnitGrading(
                    message, unit_grader, inline, slot, collector, send_kept, found
                )
                result, body = config.unit_fn(message["unit"], body, grade)
                stored = result.pop("store", None) if isinstance(result, dict) else None
                if key is not None and grade.final:
                    to_hold = (key, stored)
                reply: dict[str, Any] = {"unit": result}
            else:
                items = [GradeItem(i, r, g) for i, r, g in message["items"]]
                options = GradeOptions.from_dict(message["options"])
                results = grader.grade(items, options)
                reply = {"results": [[i, v.to_dict()] for i, v in results]}
                body = b""  # verdicts go in the JSON
            slot.idle()
            reply["batch"] = message["batch"]
            write_body_frame(from_fd, reply, body)
            if held is not None and to_hold is not None:  # after the answer: the
                held.hold(*to_hold)  # caller does not wait for it
            if held is not None and held.waiting and _idle(to_fd):
                held.write()
    finally:
        if held is not None:
            held.write(flush=False)
        if cache is not None:
            cache.close()


def _kept_sender(from_fd: int, batch_id: int) -> Callable[[dict[str, Any], Any], None]:
    def send(rows: dict[str, list[Any]], note: Any) -> None:
        frame = {"batch": batch_id, "kept": rows, "note": note}
        write_body_frame(from_fd, frame, b"")

    return send


class _Collector(NullObserver):
    """The unit grader's observer: (verdict, seconds) of each item it graded."""

    def __init__(self) -> None:
        self.graded: list[tuple[Verdict, float]] = []

    def item_graded(self, verdict: Verdict, duration_s: float) -> None:
        self.graded.append((verdict, duration_s))


class _HeldRows:
    """A worker's cache work, done once it is idle (`_idle`: between the caller's
    calls, e.g. while the CLI writes a chunk's output and reads the next), not
    between a unit's reply and the next unit: the rows of the units it graded
    and the rows written behind (`SqliteResultCache.flush`, then a checkpoint).
    Issue 11: stored as each unit was answered, they were 2-3% of a cold run's
    CPU on the pool's critical path, and the last rows were written while the
    pool closed, the CLI waiting. A unit's row is held as its JSON text, made
    once the unit is answered: held as its rows' values, a few dozen lists a
    unit, they kept Python's garbage collector busy (13 ms of a worker's 1.1 s)."""

    def __init__(self, cache: SqliteResultCache, exact: ExactLayer | None) -> None:
        self._cache = cache
        self._exact = exact
        self._units: dict[str, str] = {}

    def hold(self, key: str, stored: Callable[[], Any] | None) -> None:
        """Keep a graded unit's row for later (`run_units`'s "store")."""
        if self._exact is None or stored is None:
            return
        self._units[key] = unit_text(stored())
        if len(self._units) >= _HELD_UNITS:  # a caller that is never idle
            self.write(flush=False)

    @property
    def waiting(self) -> bool:
        return bool(self._units) or self._cache.pending_rows > 0

    def write(self, *, flush: bool = True) -> None:
        """Store the held units' rows; with `flush`, write out everything held
        back (logged on failure: those rollouts are graded again next time)."""
        units, self._units = self._units, {}
        if units:
            assert self._exact is not None  # units are held only with one (`hold`)
            try:
                self._exact.store_units(units)
            except CacheError as exc:  # they are graded again next time
                log.warning("unit cache store failed: %s", exc)
        if flush:
            try:
                self._cache.flush()
                self._cache.checkpoint()
            except CacheError as exc:
                log.warning("cache flush failed: %s", exc)


def _idle(fd: int) -> bool:
    """No batch has come on `fd` within `_IDLE_FLUSH_S`: the caller is between
    calls (writing its output, reading its input) and this core is free."""
    readable, _w, _x = select.select([fd], [], [], _IDLE_FLUSH_S)
    return not readable


def _looked_up(exact: ExactLayer, key: str) -> str | None:
    """What the cache kept under a unit's key (None: nothing, or the lookup
    failed: the unit is graded, as without a cache)."""
    try:
        return exact.lookup_units([key]).get(key)
    except CacheError as exc:
        log.warning("unit cache lookup failed: %s", exc)
        return None


class _Probes:
    """Which units a worker that looks its units up looks up: all, until
    `_MISSES_BEFORE_PROBING` in a row were not found, then every `_PROBE_EVERY`th,
    until one is found."""

    def __init__(self) -> None:
        self._misses = 0  # in a row, units not looked up counted as misses

    def due(self) -> bool:
        past = self._misses - _MISSES_BEFORE_PROBING
        return past < 0 or past % _PROBE_EVERY == 0

    def saw(self, found: bool) -> None:
        self._misses = 0 if found else self._misses + 1


class _UnitGrading:
    """The `UnitGrading` a worker hands its unit function for one unit.

    Items are numbered across the unit's calls, and the slot shows those numbers, so
    the parent can name the item a lost worker was on; when the unit comes back,
    its message's "answered" holds those items' failures (position, status,
    reason, prepared, seconds), and its "known" the verdicts kept so far (`keep`:
    position -> `Verdict.to_row`), which are answered here, not graded again.
    """

    def __init__(
        self,
        message: dict[str, Any],
        grader: BatchGrader,
        inline: InlineGrader,
        slot: ProgressSlot,
        collector: _Collector | None,
        send_kept: Callable[[dict[str, Any], Any], None],
        stored: str | None = None,
    ) -> None:
        self.stored = stored
        self._slot = slot
        self._answered = {
            position: (Status(status), reason, prepared, seconds)
            for position, status, reason, prepared, seconds in message["answered"]
        }
        self._known = {
            int(position): row for position, row in message.get("known", {}).items()
        }
        self.culprits = frozenset(p for p in self._answered if p not in self._known)
        self._grader = grader
        self._inline = inline
        self._collector = collector
        if collector is not None:
            collector.graded = []
        self._numbered = 0
        # No transient verdict so far: the unit's result may be kept whole.
        self.final = True
        self._send_kept = send_kept

    @property
    def graded(self) -> list[tuple[Verdict, float]]:
        if self._collector is None:
            raise SandboxError("this pool does not collect graded items")
        return self._collector.graded

    def keep(self, verdicts: dict[int, Verdict], note: Any = None) -> None:
        self._send_kept({str(p): v.to_row() for p, v in verdicts.items()}, note)

    def __call__(
        self, pairs: Sequence[tuple[str, str]], options: GradeOptions
    ) -> list[Verdict]:
        base = self._numbered
        self._numbered += len(pairs)
        verdicts: list[Verdict | None] = [None] * len(pairs)
        for position, row in self._known.items():
            if base <= position < self._numbered:
                verdicts[position - base] = Verdict.from_row(row)
        for position, (status, reason, prepared, seconds) in self._answered.items():
            # A culprit kept since (a keep after its chunk) is known: answered once.
            if base <= position < self._numbered and position not in self._known:
                pair = pairs[position - base]
                verdict = culprit_verdict(
                    status, reason, pair, options, prepared=prepared
                )
                verdicts[position - base] = verdict
                if self._collector is not None:
                    self._collector.graded.append((verdict, seconds))
        todo = [i for i, verdict in enumerate(verdicts) if verdict is None]
        self._inline.positions = [base + i for i in todo]
        try:
            items = [GradeItem(i, *pairs[i]) for i in todo]
            for i, verdict in self._grader.grade(items, options):
                verdicts[i] = verdict
        finally:
            self._inline.positions = None
            # What the unit does between calls is no item's doing.
            self._slot.idle()
        done = [verdict for verdict in verdicts if verdict is not None]
        assert len(done) == len(pairs)
        self.final = self.final and all(is_final(verdict) for verdict in done)
        return done


def _worker_main(
    to_fd: int, from_fd: int, config: _WorkerConfig, slot: ProgressSlot
) -> int:
    with contextlib.suppress(BrokenPipeError):  # the parent is gone: just exit
        _worker_loop(to_fd, from_fd, config, slot)
    return 0


def _spawn_worker(config: _WorkerConfig) -> _Worker:
    slot = ProgressSlot()
    rss_bytes = self_size_bytes()[1]
    pid, to_fd, from_fd = fork_child(lambda r, w: _worker_main(r, w, config, slot))
    for fd, size in ((to_fd, _REQUEST_PIPE_BYTES), (from_fd, _REPLY_PIPE_BYTES)):
        with contextlib.suppress(OSError):  # above pipe-max-size: the default stays
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    statm_fd = open_statm(pid, "local worker")
    return _Worker(
        pid=pid,
        to_fd=to_fd,
        from_fd=from_fd,
        slot=slot,
        statm_fd=statm_fd,
        rss_cap_bytes=rss_bytes + config.item_memory_bytes,
        recycle_rss_bytes=recycle_rss_bytes(statm_fd, config.item_memory_bytes),
    )


def _refuse_open_cache(cache_path: Path | None) -> None:
    """Raise if this process has the cache file open: an SQLite connection that
    crosses a fork breaks the workers' own (they wait "locked" for the busy
    timeout, again and again), so it must be closed before workers are forked."""
    if cache_path is None:
        return
    names = {str(cache_path.resolve()) + suffix for suffix in ("", "-wal", "-shm")}
    with contextlib.suppress(OSError):  # no /proc: nothing to check
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # closed since listed
                if os.readlink(f"/proc/self/fd/{fd}") in names:
                    raise SandboxError(
                        f"the cache file {cache_path} is open in this process; close "
                        "its SQLite connection before grading (a connection open "
                        "across fork leaves the pool's workers waiting on its locks)"
                    )


def _reaped(pid: int) -> int | None:
    """`pid`'s wait status if it has exited (0 if someone else reaped it), else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    return status if done else None


def _send_eof(worker: _Worker) -> None:
    """Close our end of its request pipe (once: the fd number may be reused)."""
    if worker.to_fd >= 0:
        with contextlib.suppress(OSError):
            os.close(worker.to_fd)
        worker.to_fd = -1


def _stop_worker(worker: _Worker, *, graceful: bool) -> int:
    """Ask (EOF) or force (SIGKILL) a worker to exit, reap it, close its fds; returns
    its wait status."""
    _send_eof(worker)
    deadline = time.monotonic() + (_STOP_GRACE_S if graceful else 0.0)
    status = _reaped(worker.pid)
    while status is None and time.monotonic() < deadline:
        time.sleep(_STOP_POLL_S)
        status = _reaped(worker.pid)
    if status is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)
        try:
            status = os.waitpid(worker.pid, 0)[1]
        except ChildProcessError:
            status = 0
    _close_fds(worker)
    return status


def _close_fds(worker: _Worker) -> None:
    """Close the answer pipe and statm fd of a reaped worker."""
    for fd in (worker.from_fd, worker.statm_fd):
        with contextlib.suppress(OSError):
            os.close(fd)


def _death_cause(status: int) -> tuple[Status, str] | None:
    """What a worker's death says about the item it was on (None: nothing); worded
    as a fleet's sandbox says it, so both give the same verdict."""
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_MEMORY:
        return Status.MEMORY_LIMIT, MEMORY_ERROR_REASON
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) not in _NOT_THE_ITEMS_DOING:
        return death_status(status)
    return None


def _restart_reason(cause: tuple[Status, str] | None) -> str:
    """A lost worker's replacement as a fleet's sandbox counts its child's."""
    if cause is None:
        return "crash"
    return {Status.TIMEOUT: "timeout", Status.MEMORY_LIMIT: "memory"}.get(
        cause[0], "crash"
    )


def _check_deadline(deadline_at: float | None, job: _Job) -> None:
    if deadline_at is not None and time.monotonic() >= deadline_at:
        partial = job.partial()
        missing = sum(result is None for result in partial)
        raise DeadlineError(
            f"deadline passed with {missing} of {len(partial)} items ungraded",
            partial=partial,
        )


@dataclass(slots=True, kw_only=True)
class _Job:
    """One `grade()` or `run_units()` call: its batches and what is pending."""

    pending: deque[int]
    attempts: list[int]
    batches_left: int
    items_done: int = 0

    def message(self, batch_id: int) -> tuple[dict[str, Any], bytes, list[int], int]:
        """The frame and body for a batch, what it sent (see `culprit`), and its
        item count."""
        raise NotImplementedError

    def accept(self, batch_id: int, reply: dict[str, Any], body: bytes) -> None:
        """Take a worker's answer to the batch."""
        raise NotImplementedError

    def kept(self, batch_id: int, rows: dict[str, list[Any]], note: Any) -> None:
        """Take verdicts a worker kept before its answer (`UnitGrading.keep`)."""
        raise SandboxError("a worker kept verdicts of a batch of items")

    def culprit(
        self, batch_id: int, sent: list[int], current: Step, cause: tuple[Status, str]
    ) -> bool:
        """Answer the item the batch's worker was lost on; False if the slot names
        no item of this batch."""
        raise NotImplementedError

    def unfinished(self, batch_id: int) -> bool:
        """Whether the batch still has items without a verdict."""
        raise NotImplementedError

    def give_up(self, batch_id: int) -> None:
        """The batch's worker was lost too often: answer what it has left."""
        raise NotImplementedError

    def partial(self) -> list[Any]:
        """What has arrived so far, None where nothing has."""
        raise NotImplementedError


@dataclass(slots=True, kw_only=True)
class _ItemJob(_Job):
    """Rollouts graded in batches of ranges of `items`."""

    options: GradeOptions
    items: Sequence[RolloutLike]
    batches: list[range]
    verdicts: list[Verdict | None]

    def answer(self, index: int, verdict: Verdict) -> None:
        """Answer one item outside its batch's reply (a lost worker's culprit)."""
        self.verdicts[index] = verdict
        self.items_done += 1

    def left_in(self, batch_id: int) -> list[int]:
        """The batch's items still without a verdict."""
        verdicts = self.verdicts
        return [i for i in self.batches[batch_id] if verdicts[i] is None]

    def message(self, batch_id: int) -> tuple[dict[str, Any], bytes, list[int], int]:
        sent = self.left_in(batch_id)
        wire = [[i, self.items[i].response, self.items[i].gold] for i in sent]
        frame = {"batch": batch_id, "options": self.options.to_dict(), "items": wire}
        return frame, b"", sent, len(sent)

    def accept(self, batch_id: int, reply: dict[str, Any], body: bytes) -> None:
        for index, verdict in reply["results"]:
            self.verdicts[index] = Verdict.from_dict(verdict)
        self.items_done += len(reply["results"])

    def culprit(
        self, batch_id: int, sent: list[int], current: Step, cause: tuple[Status, str]
    ) -> bool:
        if current.position >= len(sent):
            return False
        index = sent[current.position]
        item = self.items[index]
        verdict = culprit_verdict(
            *cause,
            (item.response, item.gold),
            self.options,
            prepared=current.step == DECIDE,
        )
        self.answer(index, verdict)
        return True

    def unfinished(self, batch_id: int) -> bool:
        return bool(self.left_in(batch_id))

    def give_up(self, batch_id: int) -> None:
        lost = self.attempts[batch_id]
        for index in self.left_in(batch_id):
            item = self.items[index]
            self.answer(
                index, poison_verdict(item.response, item.gold, self.options, lost)
            )

    def partial(self) -> list[Any]:
        return list(self.verdicts)


@dataclass(slots=True, kw_only=True)
class _UnitJob(_Job):
    """Units run whole by the workers' unit function; each unit is one batch."""

    units: Sequence[Unit]
    weights: Sequence[int]
    results: list[Unit | None]
    # Per unit: the items found guilty so far, as `_UnitGrading` takes them.
    answered: list[list[list[Any]]]
    # Per unit: verdicts kept so far (`UnitGrading.keep`), as `_UnitGrading` takes
    # them (item number -> `Verdict.to_row`).
    known: list[dict[str, list[Any]]]
    finished: list[bool]
    keys: Sequence[str] | None = None  # cache keys, for the workers to store under
    look_up: bool = False  # no keys: the workers take and look up each unit's key
    on_kept: Callable[[int, dict[int, Verdict], Any], None] | None = None

    def message(self, batch_id: int) -> tuple[dict[str, Any], bytes, list[int], int]:
        unit, body = self.units[batch_id]
        frame = {"batch": batch_id, "unit": unit, "answered": self.answered[batch_id]}
        if self.known[batch_id]:
            frame["known"] = self.known[batch_id]
        if self.keys is not None:
            frame["key"] = self.keys[batch_id]
        elif self.look_up:
            frame["look_up"] = True
        return frame, body, [], self.weights[batch_id]

    def kept(self, batch_id: int, rows: dict[str, list[Any]], note: Any) -> None:
        self.known[batch_id].update(rows)
        if self.on_kept is not None:
            verdicts = {int(p): Verdict.from_row(row) for p, row in rows.items()}
            self.on_kept(batch_id, verdicts, note)

    def accept(self, batch_id: int, reply: dict[str, Any], body: bytes) -> None:
        self.results[batch_id] = (reply["unit"], body)
        self.finished[batch_id] = True
        self.items_done += self.weights[batch_id]

    def culprit(
        self, batch_id: int, sent: list[int], current: Step, cause: tuple[Status, str]
    ) -> bool:
        status, reason = cause
        prepared = current.step == DECIDE
        self.answered[batch_id].append(
            [current.position, status.value, reason, prepared, current.seconds]
        )
        return True

    def unfinished(self, batch_id: int) -> bool:
        return not self.finished[batch_id]

    def give_up(self, batch_id: int) -> None:
        # Its result stays None: the caller grades (and counts) its items another
        # way.
        self.finished[batch_id] = True

    def partial(self) -> list[Any]:
        return list(self.results)


class LocalPool:
    """N local worker processes, each grading its batches with a `BatchGrader`.

    Args:
        processes: number of worker processes.
        item_timeout_s: wall-clock deadline per item (as the fleet).
        item_memory_bytes: memory cap per item (as the fleet).
        cache_path: SQLite cache file shared by the workers; None for no cache.
        batch_size: items per batch handed to one worker.
        recycle_after_items: a worker is replaced by a fresh one after this many
            items, or sooner once its RSS has grown `RECYCLE_GROWN_SHARE` of the
            cap, as the fleet's sandbox children.
        grade_fn: the function the workers decide with (default the verifier).
        unit_fn: what the workers run for `run_units` (see `UnitFn`).
        warm_up: grade a few answers here before the first fork, so that workers
            start with the verifier's lazy imports (SymPy) done; off only for a
            `unit_fn` that never grades (it would save nothing but cost 0.25 s).
        collect_graded: whether the `unit_fn` may read `UnitGrading.graded`.
        on_restart: called with "timeout", "memory", "crash" or "recycle" when a
            worker is replaced (as a fleet's `Sandbox` reports its child's).
        code_cache: builds, in each worker, the result cache of code items when
            there is no `cache_path` (a fleet's line pool: its Redis cache).
        max_attempts: a batch whose worker process dies for no reason found in its
            progress slot is re-run on a fresh worker up to this many times in all;
            then the item it was on (else the whole batch) gets an `error` verdict.

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
        unit_fn: UnitFn | None = None,
        max_attempts: int = 3,
        warm_up: bool = True,
        collect_graded: bool = False,
        on_restart: Callable[[str], None] | None = None,
        code_cache: Callable[[], CacheBackend] | None = None,
    ) -> None:
        if processes < 1 or batch_size < 1 or max_attempts < 1:
            raise ValueError("processes, batch_size and max_attempts must be >= 1")
        if item_timeout_s <= 0 or item_memory_bytes <= 0 or recycle_after_items < 1:
            raise ValueError(
                "item_timeout_s, item_memory_bytes, recycle_after_items > 0"
            )
        self._processes = processes
        self._batch_size = batch_size
        self._max_attempts = max_attempts
        self._item_timeout_s = item_timeout_s
        # A code item's step: the code grader's own wall budget bounds it; this is
        # the backstop past it (sandbox start included).
        self._code_step_s = code_row_limits().wall_s + CODE_STEP_GRACE_S
        self._warm_up = warm_up
        self._config = _WorkerConfig(
            item_timeout_s=item_timeout_s,
            item_memory_bytes=item_memory_bytes,
            recycle_after_items=recycle_after_items,
            cache_path=cache_path,
            grade_fn=grade_fn,
            unit_fn=unit_fn,
            collect_graded=collect_graded,
            code_cache=code_cache,
        )
        self._on_restart = on_restart
        self._workers: dict[int, _Worker] = {}  # by from_fd
        self._leaving: list[_Worker] = []  # recycled, not yet reaped
        self._rss_checked = 0.0

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
        job = _ItemJob(
            items=items,
            options=options,
            batches=batches,
            pending=deque(range(len(batches))),
            attempts=[0] * len(batches),
            verdicts=[None] * len(items),
            batches_left=len(batches),
        )
        self._run(job, on_progress, deadline_at)
        verdicts = [verdict for verdict in job.verdicts if verdict is not None]
        if len(verdicts) != len(items):  # a bug here must never look like success
            raise SandboxError(f"local pool lost {len(items) - len(verdicts)} items")
        return verdicts

    def run_units(
        self,
        units: Sequence[Unit],
        weights: Sequence[int],
        on_progress: Callable[[int], None] | None = None,
        deadline_at: float | None = None,
        keys: Sequence[str] | None = None,
        *,
        look_up: bool = False,
        known: Sequence[dict[int, Verdict]] | None = None,
        on_kept: Callable[[int, dict[int, Verdict], Any], None] | None = None,
    ) -> list[Unit | None]:
        """Run the pool's `unit_fn` on each unit (a batch each); result i belongs to
        units[i].

        Under the same limits as `grade`: an item that overruns the deadline or the
        cap, or crashes its worker, is answered as a failure when its unit is sent
        again. A unit whose worker was lost `max_attempts` times without an item to
        blame has the result None (the caller grades it another way). `weights`
        (rollouts per unit) count for `on_progress` and worker recycling. Past
        `deadline_at`, DeadlineError with the results so far (None: not arrived).

        A result dict may offer, under "store", a function that returns JSON to
        keep in the cache (called only to store it): with the cache on and `keys`
        (`ExactLayer.unit_key` of each unit), the worker stores it under the
        unit's key when none of the unit's verdicts is transient. It is never sent
        back. With `look_up` instead of `keys`, each worker takes the unit's key
        itself and looks it up: what it finds is the unit function's
        `UnitGrading.stored` (a cold run's CLI then hashes nothing and opens no
        SQLite connection between its chunks while the pool's cores wait).

        `known` (per unit: item number across the unit's grading calls -> verdict)
        are answered as they are, not graded. Verdicts a unit function keeps
        (`UnitGrading.keep`) go to `on_kept(unit index, verdicts, note)` as they come
        and join its known ones if the unit is sent again.
        """
        if self._config.unit_fn is None:
            raise ValueError("this pool has no unit_fn")
        if len(weights) != len(units) or (
            known is not None and len(known) != len(units)
        ):
            raise ValueError("one weight (and known verdicts, if any) per unit")
        job = _UnitJob(
            units=units,
            weights=weights,
            results=[None] * len(units),
            answered=[[] for _unit in units],
            known=[
                {str(p): verdict.to_row() for p, verdict in verdicts.items()}
                for verdicts in (known or [{} for _unit in units])
            ],
            on_kept=on_kept,
            finished=[False] * len(units),
            pending=deque(range(len(units))),
            attempts=[0] * len(units),
            batches_left=len(units),
            keys=keys,
            look_up=look_up and keys is None,
        )
        self._run(job, on_progress, deadline_at)
        return job.results

    def _run(
        self,
        job: _Job,
        on_progress: Callable[[int], None] | None,
        deadline_at: float | None,
    ) -> None:
        reported = 0
        try:
            while job.batches_left:
                _check_deadline(deadline_at, job)
                self._dispatch(job)
                # After the workers have their next batches: the caller may do a
                # while of work of its own here (the CLI reads and writes rows).
                if on_progress is not None and job.items_done > reported:
                    reported = job.items_done
                    on_progress(reported)
                self._collect(job, deadline_at)
            if on_progress is not None and job.items_done > reported:
                on_progress(job.items_done)
        except BaseException:
            self._stop_all(graceful=False)  # busy workers hold stale batches
            raise

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

    def _restarted(self, reason: str) -> None:
        if self._on_restart is not None:
            self._on_restart(reason)

    def _stop_all(self, *, graceful: bool) -> None:
        workers, self._workers = list(self._workers.values()) + self._leaving, {}
        if graceful:  # all at once: they write out their cache rows side by side
            for worker in workers:
                _send_eof(worker)
        for worker in workers:
            _stop_worker(worker, graceful=graceful)
        self._leaving = []

    def _reap_leaving(self) -> None:
        """Reap recycled workers that have finished writing their cache rows."""
        for worker in list(self._leaving):
            if _reaped(worker.pid) is not None:
                self._leaving.remove(worker)
                _close_fds(worker)

    def _dispatch(self, job: _Job) -> None:
        recycle_after = self._config.recycle_after_items
        for worker in list(self._workers.values()):
            if worker.items_sent >= recycle_after:
                worker.retiring = True
            if worker.retiring and not worker.batches:
                # Its last batch is answered: EOF lets it write its cache rows out
                # and exit, reaped later (a fresh worker takes its place now).
                del self._workers[worker.from_fd]
                _send_eof(worker)
                self._leaving.append(worker)
                self._restarted("recycle")
        if self._leaving:
            self._reap_leaving()
        if len(self._workers) < self._processes:
            if self._warm_up:  # once per process: workers inherit a warm verifier
                warm_up_verifier()
            _refuse_open_cache(self._config.cache_path)
        while len(self._workers) < self._processes:
            worker = _spawn_worker(self._config)
            self._workers[worker.from_fd] = worker
        for worker in list(self._workers.values()):
            while (
                len(worker.batches) < _WORKER_BATCHES
                and worker.items_sent < recycle_after
                and not worker.retiring
                and job.pending
            ):
                if not self._send(worker, job, job.pending.popleft()):
                    break

    def _send(self, worker: _Worker, job: _Job, batch_id: int) -> bool:
        """Send a batch; False if the worker was found dead (and replaced)."""
        message, body, sent, count = job.message(batch_id)
        job.attempts[batch_id] += 1
        worker.batches.append((batch_id, sent))
        worker.items_sent += count
        # Backstop only: each item is already bounded by the watched deadline.
        worker.deadline = (
            max(worker.deadline, time.monotonic())
            + count * (self._item_timeout_s + 1)
            + _BACKSTOP_S
        )
        try:
            write_body_frame(worker.to_fd, message, body)
        except BrokenPipeError:
            self._worker_lost(worker, job)
            return False
        return True

    def _collect(self, job: _Job, deadline_at: float | None) -> None:
        busy = [w for w in self._workers.values() if w.batches]
        if not busy:
            return
        poller = select.poll()
        for worker in busy:
            poller.register(
                worker.from_fd, select.POLLIN | select.POLLHUP | select.POLLERR
            )
        wait_ms = _WATCH_S * 1000.0
        if deadline_at is not None:
            wait_ms = max(0.0, min(wait_ms, (deadline_at - time.monotonic()) * 1000))
        for fd, _event in poller.poll(wait_ms):
            worker = self._workers[fd]
            frame = read_body_frame(fd)
            if frame is None:
                self._worker_lost(worker, job)
            else:
                self._accept(worker, job, *frame)
        self._watch(job, [w for w in busy if w.from_fd in self._workers])

    def _watch(self, job: _Job, busy: list[_Worker]) -> None:
        """Kill a worker whose item overran the deadline or the memory cap."""
        now = time.monotonic()
        sample_rss = now - self._rss_checked >= _WATCH_S
        if sample_rss:
            self._rss_checked = now
        for worker in busy:
            current = worker.slot.current()
            step_s = -1.0
            if current is not None and current.batch == worker.batches[0][0]:
                step_s = current.seconds
            limit_s = self._item_timeout_s
            if current is not None and current.step == CODE:
                limit_s = self._code_step_s
            if step_s > limit_s:
                reason = deadline_reason(limit_s)
                worker.killed_for = (Status.TIMEOUT, reason)
                assert current is not None
                worker.overran = (current.batch, current.position)
            elif sample_rss and worker.rss_bytes() > worker.rss_cap_bytes:
                reason = memory_cap_reason(self._config.item_memory_bytes)
                worker.killed_for = (Status.MEMORY_LIMIT, reason)
            elif worker.deadline >= now:
                continue
            elif current is not None and current.step == CODE:
                # A code item, within its own limit: the batch's backstop (sized
                # for math items) counts again from here.
                worker.deadline = now + self._item_timeout_s + 1 + _BACKSTOP_S
                continue
            self._worker_lost(worker, job)

    def _accept(
        self, worker: _Worker, job: _Job, reply: dict[str, Any], body: bytes
    ) -> None:
        batch_id = worker.batches[0][0] if worker.batches else None
        if batch_id is None or reply.get("batch") != batch_id:  # never a stale answer
            raise SandboxError(f"local worker {worker.pid} answered an unknown batch")
        if "kept" in reply:  # verdicts before the answer: the batch goes on
            job.kept(batch_id, reply["kept"], reply.get("note"))
            return
        worker.batches.popleft()
        job.accept(batch_id, reply, body)
        job.batches_left -= 1
        if worker.rss_bytes() > worker.recycle_rss_bytes:
            worker.retiring = True

    def _worker_lost(self, worker: _Worker, job: _Job) -> None:
        """A worker died, was killed for its item, or overran the backstop.

        Only the oldest batch was being graded (answers come in order): the batches
        queued behind it go back without counting an attempt. The item in its slot
        is answered when the death was its doing (deadline, memory, a crash); else
        the batch is run again, up to `max_attempts`.
        """
        del self._workers[worker.from_fd]
        status = _stop_worker(worker, graceful=False)
        self._restarted(_restart_reason(worker.killed_for or _death_cause(status)))
        # Read once it is reaped, so the slot holds still: the item it died on.
        current = worker.slot.current()
        if not worker.batches:
            return
        (batch_id, sent), *queued = worker.batches
        worker.batches.clear()
        for later, _sent in reversed(queued):
            job.attempts[later] -= 1
            job.pending.appendleft(later)
        if worker.overran is not None and (
            current is None or (current.batch, current.position) != worker.overran
        ):
            # The overrunning item ended just before the kill: nobody to blame.
            job.attempts[batch_id] -= 1
            current = None
        if current is not None and current.batch == batch_id:
            cause = worker.killed_for or _death_cause(status)
            if cause is None and job.attempts[batch_id] >= self._max_attempts:
                cause = Status.ERROR, poison_reason(job.attempts[batch_id])
            if cause is not None and job.culprit(batch_id, sent, current, cause):
                job.attempts[batch_id] -= 1  # the cause is gone with its item
        if job.unfinished(batch_id) and job.attempts[batch_id] < self._max_attempts:
            job.pending.appendleft(batch_id)
            return
        job.give_up(batch_id)
        job.batches_left -= 1
