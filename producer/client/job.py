"""One submitted grading job: sends batches a window at a time, reads result keys,
re-sends lost batches, keeps order.

A job keeps at most `max_in_flight` batches in the broker; the rest wait here and go
out as results come back. So one job of hundreds of thousands of rollouts never
fills the queue ahead of everyone else (jobs of one lane take turns, in FIFO order,
a window each) and the broker holds a bounded amount of it.

Results are read from Celery's Redis result keys with one MGET per poll. Between
polls the job blocks on its "done" list (`protocol.job_done_key`), where each worker
pushes a batch's id right after storing its result: a poll follows each finished
batch at once, and a quiet job polls only every quarter second. A running
batch with no new heartbeat for `resend_after_s`, or any unfinished batch once the
whole job has been silent for `stall_after_s`, is published again under the same id;
the first result per index wins, later duplicates are ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import redis
from kombu.exceptions import OperationalError

from producer.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    DeadlinePassedError,
    ProducerError,
)
from producer.settings import DEFAULT_REFUSED_LIMIT_S
from workers.models import ExtractionMethod, Status, Verdict
from workers.wire.lanes import MATH, Kind
from workers.wire.protocol import (
    RUNNING_STATES,
    TaskMeta,
    job_done_key,
    line_output_key,
    read_task_meta,
    result_rejection,
    task_meta_key,
)
from workers.wire.signing import Keyring

__all__ = [
    "Batch",
    "GradingJob",
    "OnDeadline",
    "Progress",
    "ServerRunId",
    "format_ranges",
]

# At the job deadline: raise DeadlinePassedError (the default), or answer every
# rollout still without a verdict `timeout` and end the job.
OnDeadline = Literal["raise", "timeout"]
DEADLINE_REASON = "job deadline passed before this rollout was graded"

_MAX_FAILURES = 3
# Longest wait on the done list between polls: bounds how late a failure (stored by
# Celery, which pushes no id), a heartbeat or a worker of an older version is seen.
_WAIT_MAX_S = 0.25
# A window is published this many batches at a time (one Redis round trip and a
# message each): the fleet starts on the first while the rest are encoded. In one
# go, a chunk's 36 batches of 512 took 0.26 s to go out, the fleet idle (issue 11).
_PUBLISH_GROUP_BATCHES = 4
_RESEND_CHECK_S = 0.25
_RESTART_CHECK_S = 1.0
# What a failed publish raises: the job tries again at its next poll.
_PUBLISH_ERRORS = (
    BrokerUnavailableError,
    BrokerRefusedError,
    OperationalError,
    redis.RedisError,
    OSError,
)
log = logging.getLogger(__name__)


class BrokerWatch(Protocol):
    """What a job reads of its producer's view of the broker (`board.JobBoard`)."""

    @property
    def refusal(self) -> Exception | None:
        """The broker's refusal of the latest write; None once one is accepted."""

    @property
    def lapses(self) -> int:
        """Times the job's entry went unrefreshed past its TTL (workers may have
        skipped its batches meanwhile)."""

    def rewrite(self, job: Any) -> None:
        """Write the job's entry now (best effort), before a re-publish."""


class ServerRunId:
    """A Redis server's run_id (a new one per start, from INFO), shared by the jobs
    of one client: a job takes it at its start from here, without a round trip of
    its own while the last read is under `max_age_s` old.

    A job that takes a value read before a restart sees the new one at its next
    check and publishes its unfinished batches again (a duplicate costs a worker a
    batch, the first result wins): a stale value costs a re-send, never a loss.
    """

    def __init__(self, client: redis.Redis[bytes]) -> None:
        self._redis = client
        self._value: str | None = None
        self._read_at = -float("inf")

    def get(self, max_age_s: float = 0.0) -> str | None:
        """The run_id, read now unless the last read is under `max_age_s` old;
        None when Redis is down or refuses INFO."""
        now = time.monotonic()
        if now - self._read_at >= max_age_s:
            self._value, self._read_at = self._read(), now
        return self._value

    def _read(self) -> str | None:
        try:
            run_id = self._redis.info("server").get("run_id")
        except (redis.RedisError, OSError):
            return None  # down (the next check sees the new one) or INFO refused
        return str(run_id) if run_id else None


@dataclass(slots=True, kw_only=True)
class Batch:
    """Producer-side state of one batch (mutable; owned by one job)."""

    batch_id: str
    items: tuple[tuple[int, str, str], ...]
    attempt: int = 0
    sent_at: float = 0.0
    seen_at: float = 0.0
    payload: bytes | None = None
    state: str = "PENDING"
    failures: int = 0
    resends: int = 0
    done: bool = False
    items_digest: str | None = None  # of the items as last stored (`_store_items`)
    # A unit of input lines (`workers.lines.units.fleet_unit_payload`) stored in place
    # of items; `items` then holds one (unit index, "", "") and the unit's
    # "verdict" is its result's `lines` (`GradingClient.submit_units`).
    unit: bytes | None = None
    # The kind of every rollout in it (a unit of lines: math's queues, see
    # `workers.fleet.line_batch`): with the job's lane, the queue it goes to.
    kind: Kind = MATH
    key: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.key = task_meta_key(self.batch_id).encode()


@dataclass(frozen=True, slots=True)
class Progress:
    """How many of a job's rollouts have a verdict."""

    done: int
    total: int


def format_ranges(indexes: list[int], *, limit: int = 20) -> str:
    """`[0, 1, 2, 5]` -> "0-2, 5" (first `limit` ranges, then a count)."""
    ranges: list[str] = []
    start = prev = indexes[0] if indexes else 0
    for index in [*indexes[1:], None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        ranges.append(f"{start}" if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    if not indexes:
        return ""
    more = len(ranges) - limit
    return ", ".join(ranges[:limit]) + (f", … (+{more} ranges)" if more > 0 else "")


def _output_matches(out: bytes, lines: Any, keyring: Keyring | None) -> bool:
    """Whether a unit's output lines are those its result names: their size, and
    with a keyring (whose MAC covers the result) their SHA-256."""
    if lines.get("out_bytes") != len(out):
        return False
    return keyring is None or bool(
        lines.get("out_sha256") == hashlib.sha256(out).hexdigest()
    )


class GradingJob:
    """A job in flight: `progress`, iteration as batches complete, `results()`."""

    def __init__(
        self,
        *,
        job_id: str,
        batches: list[Batch],
        total: int,
        results_client: redis.Redis[bytes],
        publish: Callable[[Sequence[Batch]], None],
        release: Callable[[list[Batch]], None],
        deadline_at: float | None,
        resend_after_s: float,
        stall_after_s: float | None = None,
        metrics: Any = None,
        max_in_flight: int | None = None,
        lane: str = "interactive",
        on_deadline: OnDeadline = "raise",
        on_progress: Callable[[GradingJob], None] | None = None,
        keyring: Keyring | None = None,
        broker_watch: BrokerWatch | None = None,
        refused_limit_s: float = DEFAULT_REFUSED_LIMIT_S,
        run_id: ServerRunId | None = None,
        weights: Sequence[int] | None = None,
    ) -> None:
        self.job_id = job_id
        self.lane = lane
        # Rollouts per result (a unit of lines holds many); None: one each. The
        # board shows rollouts (`rollouts`, `rollouts_done`), not results.
        self._weights = weights
        self.rollouts = total if weights is None else sum(weights)
        self._rollouts_done = 0
        self._keyring = keyring
        self._done_key = job_done_key(job_id).encode()
        self.total = total
        self._batches = batches
        self._redis = results_client
        self._publish = publish
        self._release = release
        self._deadline_at = deadline_at
        self._resend_after_s = resend_after_s
        self._stall_after_s = stall_after_s or resend_after_s
        self._metrics = metrics
        self._max_in_flight = max_in_flight or max(1, len(batches))
        self._on_deadline = on_deadline
        self._on_progress = on_progress
        self._sent = 0  # batches[:_sent] have been published (in order)
        self._in_flight = 0  # of those, not done
        self._verdicts: list[Verdict | None] = [None] * total
        self._done = 0
        self._ready: list[tuple[int, Verdict]] = []  # received, not yet yielded
        # Units of lines whose result this poll read, their output not yet.
        self._unit_results: list[tuple[Batch, Any]] = []
        self._outputs_refused = False
        self._last_activity = time.monotonic()
        self._last_resend_check = 0.0
        self.resent_batches = 0
        # Redis restarts are told by the server's run_id (a new one per start).
        self._run_ids = run_id or ServerRunId(results_client)
        self._run_id: str | None = None
        self._last_restart_check = 0.0
        self._republish = False
        self.broker_restarts = 0
        self._watch = broker_watch
        self._refused_limit_s = refused_limit_s
        self._refused_since: float | None = None
        self._lapses = 0 if broker_watch is None else broker_watch.lapses
        self.broker_refusals = 0  # spells of refused writes waited out

    def start(self) -> None:
        """Publish the first window of batches.

        Raises:
            what `publish` raises (the broker is unreachable).
        """
        # The client's last read, if recent (see `ServerRunId`), and the next
        # check a second from now: a job of a few hundred ms, as a coalesced
        # batch of per-sample calls is, then sends no INFO of its own (two per job
        # were 4% of the service's CPU per request).
        self._last_restart_check = time.monotonic()
        self._run_id = self._run_ids.get(max_age_s=_RESTART_CHECK_S)
        self._send_next(self._max_in_flight, raise_errors=True)
        self._report()

    def _check_broker(self, now: float) -> None:
        """Re-publish every unfinished batch at once when Redis restarted, or once
        it accepts writes again after refusing them (`_check_refusals`).

        A restart without persistence loses the queue, the stored items and the
        results; waiting for the stall timer cost a full `stall_after_s` of idle
        fleet. Checked once a second (INFO); a re-publish that fails while Redis is
        still coming up is tried again at the next check.
        """
        if now - self._last_restart_check < _RESTART_CHECK_S:
            return
        self._last_restart_check = now
        run_id = self._run_ids.get()
        if run_id is not None and self._run_id is not None and run_id != self._run_id:
            self.broker_restarts += 1
            self._republish = True
        if run_id is not None:
            self._run_id = run_id
        self._check_refusals(now)
        if self._republish:
            if self._watch is not None:
                # The entry first (a restart lost it): a worker skips a batch
                # whose job has none.
                self._watch.rewrite(self)
            pending = [b for b in self._batches[: self._sent] if not b.done]
            sent = [self._resend(b) for b in pending]  # every one, even after a miss
            self._republish = not all(sent)

    def _check_refusals(self, now: float) -> None:
        """Wait out a broker that refuses writes, then re-publish every unfinished
        batch (a worker may have lost a delivery or a result meanwhile); past
        `refused_limit_s`, raise with what arrived.

        Raises:
            BrokerRefusedError: the broker has refused writes that long.
        """
        if self._watch is None:
            return
        refusal = self._watch.refusal
        if refusal is not None and self._refused_since is None:
            self._refused_since = now
            self.broker_refusals += 1
            log.warning(
                "job %s: the broker refuses writes (%s: %s); waiting up to %g s "
                "for it to recover",
                self.job_id,
                type(refusal).__name__,
                refusal,
                self._refused_limit_s,
            )
        elif refusal is not None and self._refused_since is not None:
            if now - self._refused_since >= self._refused_limit_s:
                raise BrokerRefusedError(
                    f"job {self.job_id}: the broker refused writes for "
                    f"{now - self._refused_since:.0f} s ({type(refusal).__name__}: "
                    f"{refusal}); {self._done} of {self.total} results had arrived",
                    partial=list(self._verdicts),
                )
        elif self._refused_since is not None:
            log.warning("job %s: the broker accepts writes again", self.job_id)
            self._refused_since = None
            self._republish = True
        if self._watch.lapses != self._lapses:
            self._lapses = self._watch.lapses
            self._republish = True

    @property
    def done(self) -> int:
        """Rollouts with a verdict so far (as of the last poll)."""
        return self._done

    @property
    def rollouts_done(self) -> int:
        """Rollouts whose result arrived (as of the last poll)."""
        return self._rollouts_done

    @property
    def in_flight(self) -> int:
        """Batches published and not finished (at most `max_in_flight`)."""
        return self._in_flight

    @property
    def progress(self) -> Progress:
        """Verdicts received so far (checks Redis once, without blocking)."""
        return self.poll()

    def poll(self) -> Progress:
        """Collect results that arrived, re-send stale batches; never blocks."""
        if self._done < self.total:
            self._ready.extend(self._poll())
            self._maybe_resend(time.monotonic())
        return Progress(done=self._done, total=self.total)

    def __iter__(self) -> Iterator[tuple[int, Verdict]]:
        return self.as_completed()

    def as_completed(
        self, timeout_s: float | None = None
    ) -> Iterator[tuple[int, Verdict]]:
        """Yield `(index, verdict)` as batches complete (any order, each index once).

        Raises:
            DeadlinePassedError: the job deadline or `timeout_s` passed first.
        """
        for arrived in self.arrivals(timeout_s):
            yield from arrived

    def arrivals(
        self, timeout_s: float | None = None
    ) -> Iterator[list[tuple[int, Verdict]]]:
        """`as_completed`, a list at a time: what each look at the broker found
        (a caller that counts progress counts once a list, not once a rollout).

        Raises:
            DeadlinePassedError: the job deadline or `timeout_s` passed first.
        """
        limit = self._limit(timeout_s)
        while True:
            if self._ready:
                fresh, self._ready = self._ready, []
                yield fresh
                continue
            if self._done >= self.total:
                self._forget([self._done_key])
                self._report()
                return
            if self._deadline_passed(time.monotonic()):
                self._ready = self._time_out_rest()
                continue
            self._ready = self._poll()
            if self._ready:
                continue
            now = time.monotonic()
            if limit is not None and now >= limit:
                raise DeadlinePassedError(self._missing_message())
            self._maybe_resend(now)
            wait_s = _WAIT_MAX_S if limit is None else min(_WAIT_MAX_S, limit - now)
            self._wait_for_news(wait_s)

    def _wait_for_news(self, timeout_s: float) -> None:
        """Block until a worker pushes a finished batch id, or `timeout_s` passes.

        The pushed id is only a wake-up: the poll that follows reads every pending
        key, and the worker stored the result before pushing. An id left in the list
        (several batches finished together) wakes the next wait at once, for one
        cheap poll more.
        """
        try:
            self._redis.blpop([self._done_key], timeout=max(timeout_s, 0.001))
        except (redis.RedisError, OSError):
            time.sleep(timeout_s)  # backend restarting: the deadline covers it

    def _maybe_resend(self, now: float) -> None:
        self._check_broker(now)
        if now - self._last_resend_check >= _RESEND_CHECK_S:
            self._last_resend_check = now
            self._resend_stale(now)

    def results(self, timeout_s: float | None = None) -> list[Verdict]:
        """Every verdict in input order, or DeadlinePassedError listing the missing."""
        for _ in self.as_completed(timeout_s):
            pass
        return [v for v in self._verdicts if v is not None]

    def _deadline_passed(self, now: float) -> bool:
        return (
            self._on_deadline == "timeout"
            and self._deadline_at is not None
            and now >= self._deadline_at
        )

    def _time_out_rest(self) -> list[tuple[int, Verdict]]:
        """End the job at its deadline: every rollout without a verdict gets a
        `timeout` one; nothing more is sent, and the stored items of unfinished
        batches are deleted, so a queued one costs a worker one failed read."""
        unfinished = [b for b in self._batches if not b.done]
        for batch in unfinished:
            batch.done = True
        self._sent = len(self._batches)
        self._in_flight = 0
        self._release(unfinished)
        self._forget([b.key for b in unfinished])
        # (A unit's result is no Verdict: it names no version.)
        versions = {v.grader_version for v in self._verdicts if isinstance(v, Verdict)}
        stand_in = Verdict(
            correct=False,
            status=Status.TIMEOUT,
            format_valid=False,
            extracted=None,
            extraction_method=ExtractionMethod.NONE,
            reason=DEADLINE_REASON,
            # The fleet's version where any verdict of the job came back.
            grader_version=min(versions) if len(versions) == 1 else "",
        )
        missing = [(i, stand_in) for i, v in enumerate(self._verdicts) if v is None]
        return self._accept(missing)

    def _limit(self, timeout_s: float | None) -> float | None:
        deadline = None if self._on_deadline == "timeout" else self._deadline_at
        limits = [x for x in (deadline,) if x is not None]
        if timeout_s is not None:
            limits.append(time.monotonic() + timeout_s)
        return min(limits) if limits else None

    def _missing_message(self) -> str:
        missing = [i for i, v in enumerate(self._verdicts) if v is None]
        return (
            f"job {self.job_id}: deadline passed with {len(missing)} of {self.total} "
            f"results missing; missing indexes: {format_ranges(missing)}"
        )

    def _poll(self) -> list[tuple[int, Verdict]]:
        pending = [b for b in self._batches[: self._sent] if not b.done]
        try:
            payloads = self._redis.mget([b.key for b in pending])
        except (redis.RedisError, OSError):
            return []  # backend restarting: the deadline and re-sends cover it
        now = time.monotonic()
        fresh: list[tuple[int, Verdict]] = []
        for batch, payload in zip(pending, payloads, strict=True):
            if payload is None or payload == batch.payload:
                continue
            batch.payload, batch.seen_at, self._last_activity = payload, now, now
            fresh.extend(self._on_meta(batch, read_task_meta(payload)))
        if self._unit_results:
            fresh.extend(self._read_unit_outputs())
        finished = [b for b in pending if b.done]
        if finished:
            self._forget([batch.key for batch in finished])
            self._release(finished)
            self._in_flight -= len(finished)
        self._send_next(self._max_in_flight - self._in_flight)
        if fresh and self._metrics is not None:  # rollouts, as submitted
            weights = self._weights
            received = (
                len(fresh) if weights is None else sum(weights[i] for i, _ in fresh)
            )
            self._metrics.results_received.inc(received)
        self._report()
        return fresh

    def _report(self) -> None:
        if self._on_progress is not None:
            self._on_progress(self)

    def _send_next(self, room: int, *, raise_errors: bool = False) -> None:
        """Publish up to `room` batches not sent yet, in input order.

        With `raise_errors`, a failure is raised only if no batch went out: once
        some are being graded (the broker failed midway), the job goes on and
        publishes the rest later, as after any failed publish.
        """
        batches = self._batches[self._sent : self._sent + max(room, 0)]
        for start in range(0, len(batches), _PUBLISH_GROUP_BATCHES):
            group = batches[start : start + _PUBLISH_GROUP_BATCHES]
            try:
                self._publish(group)
            except _PUBLISH_ERRORS:
                # Those published before the failure are out (in order): count
                # them, or their results would never be read.
                went = sum(1 for batch in group if batch.sent_at)
                self._sent += went
                self._in_flight += went
                if raise_errors and not went and start == 0:
                    raise
                return  # broker down or refusing: the next poll tries again
            self._sent += len(group)
            self._in_flight += len(group)

    def _on_meta(self, batch: Batch, meta: TaskMeta) -> list[tuple[int, Verdict]]:
        batch.state = meta.status
        if meta.status == "SUCCESS":
            pairs = meta.results or []
            rejection = result_rejection(
                meta.envelope,
                job_id=self.job_id,
                batch_id=batch.batch_id,
                items_digest=batch.items_digest,
                keyring=self._keyring,
            )
            if rejection is not None:
                self._on_failure(batch, rejection)
            elif batch.unit is not None:
                if meta.lines is None:
                    self._on_failure(batch, "result of a unit of lines has no lines")
                else:
                    self._unit_results.append((batch, meta.lines))
            elif {i for i, _ in pairs} == {item[0] for item in batch.items}:
                batch.done = True
                return self._accept(pairs)
            else:
                self._on_failure(batch, "result does not cover the batch's indexes")
        elif meta.status == "FAILURE":
            self._on_failure(batch, meta.failure or "")
        return []

    def _read_unit_outputs(self) -> list[tuple[int, Any]]:
        """Finish the units whose results this poll read: their output lines, stored
        beside each result (`protocol.line_output_key`), read in one round trip
        into the result's `lines` as "out"; a unit whose lines are missing or do
        not match the result is sent again."""
        found, self._unit_results = self._unit_results, []
        keys = [lines.get("out_key") for _batch, lines in found]
        wanted = [
            key
            for (batch, _lines), key in zip(found, keys, strict=True)
            if isinstance(key, str)
            and key.startswith(line_output_key(batch.batch_id, ""))
        ]
        try:
            outputs = dict(zip(wanted, self._mget(wanted), strict=True))
        except redis.ResponseError as exc:  # an ACL without the lines' keys
            if not self._outputs_refused:  # once a job, not once a poll
                self._outputs_refused = True
                log.warning(
                    "job %s: cannot read the output lines of units (%s); grading "
                    "their lines as rows",
                    self.job_id,
                    exc,
                )
            outputs = {}
            found = [(batch, {"unfit": str(exc)}) for batch, _lines in found]
        except (redis.RedisError, OSError):
            for batch, _lines in found:  # backend restarting: read at a later poll
                batch.payload = None
            return []
        pairs: list[tuple[int, Any]] = []
        for (batch, lines), key in zip(found, keys, strict=True):
            if "unfit" in lines:  # its lines go as rows (`fleet_unit_result`)
                batch.done = True
                pairs.append((batch.items[0][0], lines))
                continue
            out = outputs.get(key) if isinstance(key, str) else None
            if out is None or not _output_matches(out, lines, self._keyring):
                self._on_failure(batch, "the output lines of a unit are missing")
                continue
            batch.done = True
            pairs.append((batch.items[0][0], {**lines, "out": out}))
        read = [key.encode() for key, out in outputs.items() if out is not None]
        if read:  # read once: gone (a re-send stores its own under a new token)
            self._forget(read)
        return self._accept(pairs)

    def _mget(self, keys: list[str]) -> list[Any]:
        return list(self._redis.mget(keys)) if keys else []

    def _accept(self, pairs: list[tuple[int, Any]]) -> list[tuple[int, Verdict]]:
        fresh = []
        for index, verdict in pairs:
            if self._verdicts[index] is None:
                self._verdicts[index] = verdict
                self._done += 1
                self._rollouts_done += (
                    1 if self._weights is None else self._weights[index]
                )
                fresh.append((index, verdict))
        return fresh

    def _on_failure(self, batch: Batch, reason: str) -> None:
        batch.failures += 1
        if batch.failures >= _MAX_FAILURES:
            raise ProducerError(
                f"batch {batch.batch_id} failed {batch.failures} times: {reason}"
            )
        self._forget([batch.key])
        batch.payload = None
        self._resend(batch)

    def _forget(self, keys: list[bytes]) -> None:
        # Failing to delete is harmless: result keys expire on their own.
        with contextlib.suppress(redis.RedisError, OSError):
            self._redis.delete(*keys)

    def _resend_stale(self, now: float) -> None:
        """Re-send running batches silent for `resend_after_s` (their worker died)
        and, once the whole job is silent for `stall_after_s`, the others too."""
        stalled = now - self._last_activity > self._stall_after_s
        for batch in self._batches[: self._sent]:
            if batch.done:
                continue
            running = batch.state in RUNNING_STATES
            if not (running or stalled):
                continue
            # Back off per batch so a slow fleet is not flooded with copies.
            base_s = self._resend_after_s if running else self._stall_after_s
            quiet_s = base_s * 2 ** min(batch.resends, 4)
            if now - max(batch.sent_at, batch.seen_at) >= quiet_s:
                self._resend(batch)
        if stalled:
            self._last_activity = now

    def _resend(self, batch: Batch) -> bool:
        """Publish `batch` again; False when the broker refused (tried again later)."""
        try:
            self._publish([batch])
        except _PUBLISH_ERRORS:
            return False  # broker down: try again at the next check
        batch.resends += 1
        self.resent_batches += 1
        if self._metrics is not None:
            self._metrics.batches_resent.inc()
        return True
