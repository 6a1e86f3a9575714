"""The job board: each producer lists its running jobs in Redis, `gradefleet status`
shows them by lane with their progress.

One hash per job (lane, rollouts, done, batches in flight, when it was submitted)
and one sorted set of job ids. A job's producer refreshes its hash while it waits for
results, at most once per `REFRESH_S`; the hash expires `TTL_S` after the last
refresh, so a producer that died (or stopped watching its job) drops off the board
without anyone cleaning up, and readers prune ids whose hash is gone. Best effort: a
Redis error here never fails a job.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from workers.protocol import job_board_key, job_entry_key

if TYPE_CHECKING:  # `gradefleet status --help` must not load the Redis client
    import redis

__all__ = ["JobBoard", "JobEntry", "read_job_board"]

REFRESH_S = 1.0
TTL_S = 30
MAX_SHOWN = 200


class WatchedJob(Protocol):
    """What the board reads of a `GradingJob`."""

    job_id: str
    lane: str
    total: int

    @property
    def done(self) -> int: ...
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
    """Writes one producer's jobs to the board (see the module docstring)."""

    def __init__(self, client: redis.Redis[bytes]) -> None:
        self._redis = client
        self._written_at: dict[str, float] = {}

    def update(self, job: WatchedJob) -> None:
        """Write `job`'s progress (throttled), or take it off once it is done."""
        now = time.monotonic()
        if job.done >= job.total:
            self._remove(job.job_id)
            return
        if now - self._written_at.get(job.job_id, -REFRESH_S) < REFRESH_S:
            return
        first = job.job_id not in self._written_at
        self._written_at[job.job_id] = now
        key = job_entry_key(job.job_id)
        fields: Mapping[str | bytes, Any] = {
            "lane": job.lane,
            "total": job.total,
            "done": job.done,
            "in_flight": job.in_flight,
        }
        from redis import RedisError

        with contextlib.suppress(RedisError, OSError):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hset(key, mapping=dict(fields))
            if first:
                submitted = time.time()
                pipe.hsetnx(key, "submitted_at", repr(submitted))
                pipe.zadd(job_board_key(), {job.job_id: submitted})
            pipe.expire(key, TTL_S)
            pipe.execute()

    def _remove(self, job_id: str) -> None:
        if self._written_at.pop(job_id, None) is None:
            return
        from redis import RedisError

        with contextlib.suppress(RedisError, OSError):
            pipe = self._redis.pipeline(transaction=False)
            pipe.delete(job_entry_key(job_id))
            pipe.zrem(job_board_key(), job_id)
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
