"""A batch's claim: one delivery grades a batch at a time.

A copy of a batch can be delivered while another delivery still grades it: the
producer re-sends a batch whose heartbeat it has not seen for `resend_after_s`, and
Celery re-queues the delivery of a prefork child that died. Before grading, a
delivery takes the batch's claim (`protocol.claim_key`: redis-py's `Lock`, a token
set with NX and a TTL); its heartbeat thread renews it every second and the stored
result ends it. A copy that finds the claim taken waits a little longer than the
claim's TTL: if the result appears, or the claim stays held (its holder is alive and
its result will serve both), the copy is acknowledged without grading; if the claim
lapses without a result (its holder died), the copy takes it and grades.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import redis
from redis.exceptions import LockError
from redis.lock import Lock

from workers.wire.protocol import SUCCESS_META_HEAD, claim_key, task_meta_key
from workers.wire.refusals import BROKER_REFUSALS

__all__ = [
    "CLAIM_TTL_S",
    "claim_batch",
    "is_result_head",
    "read_result_head",
    "release",
    "renew",
    "result_stored",
]

# Six missed heartbeats: a loaded machine does not lose a live claim, and a dead
# holder's copy waits only this long before it grades.
CLAIM_TTL_S = 6.0
_POLL_S = 0.25
_SUCCESS_HEAD = SUCCESS_META_HEAD.encode()


def read_result_head(target: Any, task_id: str) -> Any:
    """GETRANGE of the first bytes of the batch's result key on `target`: a client
    (the reply), or a pipeline (queued; its reply comes with the others). The
    stubs leave `getrange` untyped, hence the raw command."""
    head_end = len(_SUCCESS_HEAD) - 1
    return target.execute_command("GETRANGE", task_meta_key(task_id), 0, head_end)


def is_result_head(head: object) -> bool:
    """Whether a `read_result_head` reply is a stored SUCCESS."""
    return head == _SUCCESS_HEAD


def result_stored(results: redis.Redis[bytes], task_id: str) -> bool:
    """Whether the batch's SUCCESS is stored (reads only its first bytes)."""
    return is_result_head(read_result_head(results, task_id))


def claim_batch(
    broker: redis.Redis[bytes],
    results: redis.Redis[bytes],
    batch_id: str,
    task_id: str,
) -> tuple[Lock | None, tuple[str, str] | None]:
    """Take the batch's claim: (the claim, None) to grade; (None, (a
    `metrics.SKIP_REASONS` label, a log line)) when this copy is not to grade.

    A broker that refuses the claim (out of memory) gives (None, None): the batch
    is graded unclaimed, as before claims (a copy costs work, never a verdict).
    """
    claim = broker.lock(
        claim_key(batch_id), timeout=CLAIM_TTL_S, blocking=False, thread_local=False
    )
    waited_until = time.monotonic() + CLAIM_TTL_S + 1.0
    while True:
        try:
            acquired, answered = _try_claim(claim, broker, results, task_id)
        except BROKER_REFUSALS:
            return None, None
        if answered:
            if acquired:
                release(claim)
            return None, ("answered", "its result is already stored")
        if acquired:
            return claim, None
        if time.monotonic() >= waited_until:
            return None, ("claimed", "another delivery of it is being graded")
        time.sleep(_POLL_S)


def _try_claim(
    claim: Lock, broker: redis.Redis[bytes], results: redis.Redis[bytes], task_id: str
) -> tuple[bool, bool]:
    """(whether the claim was taken, whether the batch's result is stored).

    The result is read after the claim is taken: the holder stores its result
    before it drops the claim, so a claim found free may follow a result. When
    the result backend is the broker, both go in one round trip (a pipeline runs
    in order): the SET NX of redis-py's `Lock.acquire`, under a token given to
    the lock as `acquire` would have.
    """
    if results is not broker:
        acquired = claim.acquire(blocking=False)
        return acquired, result_stored(results, task_id)
    # Any unique token (`Lock` takes a uuid1: 12 us, for the clock and node id).
    token = os.urandom(16).hex().encode()
    pipe = broker.pipeline(transaction=False)
    pipe.set(claim.name, token, nx=True, px=int(CLAIM_TTL_S * 1000))
    read_result_head(pipe, task_id)
    taken, head = pipe.execute()
    if taken:
        claim.local.token = token  # what `Lock.release`/`reacquire` check against
    return bool(taken), is_result_head(head)


def renew(claim: Lock | None) -> None:
    """Reset the claim's TTL (from the heartbeat; best effort)."""
    if claim is not None:
        with contextlib.suppress(LockError, redis.RedisError, OSError):
            claim.reacquire()


def release(claim: Lock | None) -> None:
    """End the claim if this delivery still holds it (best effort: it expires)."""
    if claim is not None:
        with contextlib.suppress(LockError, redis.RedisError, OSError):
            claim.release()
