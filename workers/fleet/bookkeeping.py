"""A batch's Redis bookkeeping: delivery counter, saved verdicts, result key, heartbeat.

Redelivery-safe grading rests on it: verdicts are saved as they are made, so a
re-delivered batch grades only what is missing; the delivery counter turns a batch
that keeps killing its worker into `error` verdicts instead of an endless loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery import Task

from workers.models import Verdict
from workers.wire.protocol import (
    attempts_key,
    partial_key,
    progress_meta,
    task_meta,
)
from workers.wire.refusals import BROKER_REFUSALS
from workers.wire.signing import Keyring

__all__ = ["BatchProgress", "Heartbeat", "ResultSlot"]

# A running batch writes a PROGRESS state this often (the producer's sign of life:
# no news for `resend_after_s`, 10 s by default, means the batch is re-sent).
HEARTBEAT_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class ResultSlot:
    """Celery's result key of this task, written by the task itself.

    The task stores its STARTED and SUCCESS states with one plain SET each, in the
    same pipelines as the batch bookkeeping, instead of through Celery's backend
    (which does a GET, then SETEX + PUBLISH, per state: 4 round trips per batch).
    The value has Celery's layout (`protocol.task_meta`), so Celery tools and the
    producer read it as usual; failures are still stored by Celery
    (`task_store_errors_even_if_ignored`).
    """

    client: redis.Redis[bytes]
    key: str  # `protocol.task_meta_key(task_id)`
    ttl_s: int
    task_id: str
    done_key: str  # the job's list of finished batch ids (`protocol.job_done_key`)


class BatchProgress:
    """A batch's attempt counter, saved verdicts and (optionally) result state.

    With a keyring, each saved verdict carries a MAC over the batch id, the digest
    of the batch's items, its index and itself (`<tag>|<verdict JSON>`): one that
    does not verify (written by anyone without the key, copied from another index
    or batch, or saved by a delivery of other items under this batch's id) is
    counted in `rejected` and graded again.
    """

    def __init__(
        self,
        client: redis.Redis[bytes],
        batch_id: str,
        ttl_s: int,
        slot: ResultSlot | None = None,
        *,
        keyring: Keyring | None = None,
        items_digest: str = "",
        items_key: str | None = None,
        claim_key: str | None = None,
    ) -> None:
        self._redis = client
        # Deleted with the result: the stored items, and the claim
        # (`workers.fleet.claim`).
        self._done_with = [k for k in (items_key, claim_key) if k is not None]
        self._batch_id = batch_id
        self._attempts = attempts_key(batch_id)
        self._partial = partial_key(batch_id)
        self._ttl_s = ttl_s
        self._slot = slot
        self._keyring = keyring
        self._items_digest = items_digest
        self.rejected = 0

    def _seal(self, index: int, verdict_json: str) -> str:
        if self._keyring is None:
            return verdict_json
        tag = self._keyring.sign(
            "partial", self._batch_id, self._items_digest, str(index), verdict_json
        )
        return f"{tag}|{verdict_json}"

    def _open(self, index: int, raw: bytes) -> str | None:
        text = raw.decode("utf-8", "replace")
        if self._keyring is None:
            return text
        tag, _, verdict_json = text.partition("|")
        parts = (self._batch_id, self._items_digest, str(index), verdict_json)
        if not self._keyring.verify(tag, "partial", *parts):
            self.rejected += 1
            return None
        return verdict_json

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
            meta = task_meta(
                "STARTED", json.dumps({"pid": os.getpid()}), self._slot.task_id
            )
            other.set(self._slot.key, meta, ex=self._slot.ttl_s, nx=True)
            if other is not pipe:
                other.execute()
        attempts, _, saved = pipe.execute()[:3]
        verdicts: dict[int, Verdict] = {}
        for field, raw in saved.items():
            try:
                index = int(field)
                text = self._open(index, raw)
                if text is None:
                    continue  # forged or misplaced: grade that item again
                verdict = Verdict.from_dict(json.loads(text))
            except (KeyError, TypeError, ValueError):
                continue  # unreadable (another version?): grade that item again
            verdicts[index] = verdict
        return int(attempts), verdicts

    def save(self, pairs: Sequence[tuple[int, Verdict]]) -> None:
        """Save verdicts: one hash field per item index (value: verdict JSON); best
        effort while the broker refuses writes."""
        if not pairs:
            return
        mapping: dict[str | bytes, bytes | float | int | str] = {
            str(index): self._seal(index, json.dumps(verdict.to_dict()))
            for index, verdict in pairs
        }
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(self._partial, mapping=mapping)
        pipe.expire(self._partial, self._ttl_s)
        # Saved verdicts only spare a re-delivery some grading: a broker refusing
        # writes (maxmemory) must not fail the batch that holds them.
        with contextlib.suppress(*BROKER_REFUSALS):
            pipe.execute()

    def finish(
        self, result_json: str | None = None, output: tuple[str, bytes] | None = None
    ) -> None:
        """This delivery ended cleanly: store the result (JSON text) as SUCCESS (with
        a slot), and `output` (key, bytes: a batch of lines' output lines) before
        it; drop the saved verdicts (the result holds them all), the delivery
        counter, the stored items and the claim, in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        other = pipe
        if self._slot is not None and result_json is not None:
            other = self._result_pipe(pipe)
            if output is not None:  # before the result that names it
                other.set(output[0], output[1], ex=self._slot.ttl_s)
            meta = task_meta("SUCCESS", result_json, self._slot.task_id)
            other.set(self._slot.key, meta, ex=self._slot.ttl_s)
            # After the SET, in the same pipeline: a producer woken by this id
            # always finds the result.
            other.rpush(self._slot.done_key, self._slot.task_id)
            other.expire(self._slot.done_key, self._slot.ttl_s)
        # These go: a later copy of this batch finds the result and is not graded
        # (`tasks._read_delivery`), so no per-batch key outlives the batch. The
        # stored items too: their producer may be gone (it deletes them as well,
        # and stores them again with a re-send).
        pipe.delete(self._attempts, self._partial, *self._done_with)
        if other is not pipe:
            other.execute()  # the result first: a lost DECR only ages out
        pipe.execute()


class Heartbeat:
    """While a batch runs, a thread writes a PROGRESS state every interval.

    It is the producer's sign of life: a batch with no news for `resend_after_s` is
    re-sent. A thread (not per-item hooks) so that it also beats while one slow item
    is being graded, and dies with the process when the worker is lost.
    """

    def __init__(
        self,
        task: Task[Any, Any],
        total: int,
        done: Callable[[], int],
        *,
        on_beat: Callable[[], None] | None = None,
    ) -> None:
        self._task = task
        self._on_beat = on_beat  # e.g. renew the batch's claim (`workers.fleet.claim`)
        # Read here, in the task's thread: `task.request` is thread-local, and in the
        # heartbeat thread its id is None.
        self._task_id = str(task.request.id)
        self._total = total
        self._done = done
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="gradefleet-heartbeat", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        beat = 0
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            beat += 1
            meta = progress_meta(done=self._done(), total=self._total, beat=beat)
            # Best effort: a missed heartbeat at worst makes the producer re-send.
            with contextlib.suppress(redis.RedisError, OSError):
                self._task.update_state(
                    task_id=self._task_id, state="PROGRESS", meta=meta
                )
            if self._on_beat is not None:
                self._on_beat()
