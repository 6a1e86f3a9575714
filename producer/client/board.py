"""The job board: each producer lists its running jobs in Redis, `gradefleet status`
shows them by lane with their progress, and workers skip the batches of a job whose
entry is gone (its producer ended or was killed).

One hash per job (lane, rollouts, done, batches in flight, when it was submitted)
and one sorted set of job ids. A job's entry is written before its first batch is
published; a producer thread (`JobBoard.watch`) refreshes the entries of all its
live jobs every `REFRESH_S`, whether or not the caller is waiting on them, and each
entry expires `TTL_S` after its last refresh: a producer that dies drops off the
board without anyone cleaning up, and the fleet stops grading its queued batches
within `TTL_S`. Readers prune ids whose hash is gone. The refresh is also the
producer's probe of the broker: a refused write (maxmemory, read-only replica) is
kept in `JobBoard.refusal`, and a gap in refreshes longer than `TTL_S` is counted
in `JobBoard.lapses` (workers may have skipped batches meanwhile: the job
publishes them again).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from workers.wire.protocol import job_board_key, job_entry_key

if TYPE_CHECKING:  # `gradefleet status --help` must not load the Redis client
    import redis

__all__ = ["JobBoard", "JobEntry", "read_job_board"]

REFRESH_S = 1.0
# Short, so a killed producer's queued batches stop costing the fleet quickly; ten
# refreshes, so a loaded machine or a Redis hiccup does not drop a live job.
TTL_S = 10
MAX_SHOWN = 200


class WatchedJob(Protocol):
    """What the board reads of a `GradingJob`."""

    job_id: str
    lane: str
    total: int  # results (rollouts, or units of lines)
    rollouts: int

    @property
    def done(self) -> int: ...
    @property
    def rollouts_done(self) -> int: ...
    @property
    def in_flight(self) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEntry:
    """One job as the board shows it."""

    job_id: str
    lane: str
    total: int
    done: int
    in_flight: int
    submitted_at: float  # unix seconds

    @property
    def fraction_done(self) -> float:
        return self.done / self.total if self.total else 1.0


class JobBoard:
    """Writes one producer's jobs to the board and keeps them alive (see the module
    docstring). Thread-safe: the refresh thread and the job's caller share it."""

    def __init__(
        self,
        client: redis.Redis[bytes],
        *,
        ttl_s: int = TTL_S,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._redis = client
        self.ttl_s = ttl_s
        self._refresh_s = refresh_s
        self._written_at: dict[str, float] = {}
        # Weak: a job its caller dropped unfinished stops being kept alive.
        self._watched: weakref.WeakValueDictionary[str, WatchedJob] = (
            weakref.WeakValueDictionary()
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ok_at = time.monotonic()
        # The broker's refusal of the latest refresh (None once one is accepted).
        self.refusal: Exception | None = None
        self.lapses = 0

    def watch(self, job: WatchedJob) -> None:
        """Put `job` on the board now and keep its entry alive until it is done,
        forgotten, or the board is closed.

        Raises:
            redis.RedisError, OSError: the broker refused the entry or is down.
        """
        self._write([job], first=True, raise_errors=True)
        with self._lock:
            self._watched[job.job_id] = job
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="gradefleet-job-board", daemon=True
                )
                self._thread.start()

    def rewrite(self, job: WatchedJob) -> None:
        """Write `job`'s entry now, index included (after a Redis restart lost it,
        before the job publishes again); best effort."""
        self._write([job], first=True)

    def update(self, job: WatchedJob) -> None:
        """Write `job`'s progress (throttled), or take it off once it is done."""
        if job.done >= job.total:
            self.forget(job.job_id)
            return
        now = time.monotonic()
        if now - self._written_at.get(job.job_id, -REFRESH_S) >= REFRESH_S:
            first = job.job_id not in self._written_at
            self._written_at[job.job_id] = now
            self._write([job], first=first)

    def forget(self, job_id: str) -> None:
        """Take a job off the board: workers skip its batches still queued."""
        with self._lock:
            watched = self._watched.pop(job_id, None) is not None
        if self._written_at.pop(job_id, None) is not None or watched:
            self._delete([job_id])

    def close(self) -> None:
        """Stop refreshing and take every job still watched off the board."""
        self._stop.set()
        with self._lock:
            ids = list(self._watched)
            self._watched.clear()
        if self._thread is not None:
            self._thread.join()
        for job_id in ids:
            self._written_at.pop(job_id, None)
        if ids:
            self._delete(ids)

    def _run(self) -> None:
        while not self._stop.wait(self._refresh_s):
            with self._lock:
                jobs = list(self._watched.values())
            self._write(jobs)

    def _write(
        self,
        jobs: Iterable[WatchedJob],
        *,
        first: bool = False,
        raise_errors: bool = False,
    ) -> None:
        from redis import RedisError

        from workers.wire.refusals import BROKER_REFUSALS

        pipe = self._redis.pipeline(transaction=False)
        now = time.monotonic()
        for job in jobs:
            key = job_entry_key(job.job_id)
            fields: Mapping[str | bytes, Any] = {
                "lane": job.lane,
                "total": job.rollouts,
                "done": job.rollouts_done,
                "in_flight": job.in_flight,
            }
            pipe.hset(key, mapping=dict(fields))
            if first:
                submitted = time.time()
                pipe.hsetnx(key, "submitted_at", repr(submitted))
                pipe.zadd(job_board_key(), {job.job_id: submitted})
            pipe.expire(key, self.ttl_s)
        try:
            pipe.execute()
        except (RedisError, OSError) as exc:
            if isinstance(exc, BROKER_REFUSALS):
                self.refusal = exc
            if raise_errors:
                raise
            return  # best effort: the next refresh tries again
        if now - self._ok_at > self.ttl_s:
            self.lapses += 1
        self._ok_at, self.refusal = now, None

    def _delete(self, job_ids: list[str]) -> None:
        from redis import RedisError

        with contextlib.suppress(RedisError, OSError):
            pipe = self._redis.pipeline(transaction=False)
            pipe.delete(*(job_entry_key(job_id) for job_id in job_ids))
            pipe.zrem(job_board_key(), *job_ids)
            pipe.execute()


def read_job_board(client: redis.Redis[bytes]) -> list[JobEntry]:
    """The jobs on the board, oldest first (at most `MAX_SHOWN`); ids whose entry
    expired are pruned from the index.

    Raises:
        redis.RedisError: the broker cannot be read.
    """
    ids = [raw.decode() for raw in client.zrange(job_board_key(), 0, MAX_SHOWN - 1)]
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(job_entry_key(job_id))
    entries, gone = [], []
    for job_id, raw in zip(ids, pipe.execute(), strict=True):
        entry = _entry(job_id, raw)
        if entry is None:
            gone.append(job_id)
        else:
            entries.append(entry)
    if gone:
        client.zrem(job_board_key(), *gone)
    return entries


def _entry(job_id: str, raw: Mapping[bytes, bytes]) -> JobEntry | None:
    try:
        return JobEntry(
            job_id=job_id,
            lane=raw[b"lane"].decode(),
            total=int(raw[b"total"]),
            done=int(raw[b"done"]),
            in_flight=int(raw[b"in_flight"]),
            submitted_at=float(raw.get(b"submitted_at", b"0")),
        )
    except (KeyError, ValueError, UnicodeDecodeError):
        return None  # expired (empty) or written by another version
