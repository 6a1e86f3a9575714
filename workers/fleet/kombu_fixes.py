"""Two fixes for kombu's Redis transport, applied in the worker process at start.

1. A closed channel fails as a connection error
(`closed_channels_fail_as_connection_errors`).

When the broker connection drops (a Redis restart, a failover, a network cut),
Celery collects the old connection and reconnects. If the collect's channel close is
cut short (a socket timeout while the channel still waits on its BRPOP), kombu drops
the transport's client but leaves the channel open; whatever touches that channel
next -- the close that restores the unacknowledged delivery, or the ack of a task
that finishes after the reconnect -- rebuilds a connection pool from the dropped
client and fails with `AttributeError: 'NoneType' object has no attribute 'hostname'`
(celery/kombu#582, #970). Celery handles connection errors there (the ack is logged
as not done, the close is ignored) but not an AttributeError, which stops the whole
worker as an "Unrecoverable error". Seen in the Redis-restart test about one run in
ten on a loaded machine (kombu 5.7.0).

The fix makes that case the connection error it is. The delivery it could not ack or
restore stays in kombu's `unacked` hash (restored after the visibility timeout, then
acked without grading since its result exists) or went with a Redis that restarted
empty (the producer re-publishes that job).

2. A failed ack frees its prefetch slot (`failed_acks_free_their_prefetch_slot`).
kombu's Redis QoS removes a delivery from Redis's `unacked` index first and from its
own count of deliveries in flight after: when the broker refuses the removal (past
`maxmemory` under noeviction, a dropped connection), the delivery stays counted for
the life of the worker. With Celery's prefetch of one task a process, a worker
whose every process hit that stops taking work for good, idle with a queue full of
it (seen in the broker-OOM test: the worker received nothing after two refused
acks, and the next job waited until it timed out). The fix forgets the delivery
locally whatever Redis answered, and still raises (Celery logs "Couldn't ack"); the
delivery left in Redis's index is restored after the visibility timeout and acked
without grading, its result being stored, as in 1.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

__all__ = [
    "closed_channels_fail_as_connection_errors",
    "failed_acks_free_their_prefetch_slot",
]

# (getattr/setattr: the kombu stubs do not list this private method)
_original_connparams = getattr(kombu_redis.Channel, "_connparams")  # noqa: B009


def _connparams(self: Any, asynchronous: bool = False) -> Any:
    transport = self.connection
    if transport is None or transport.client is None:
        raise redis.exceptions.ConnectionError(
            "the broker connection of this channel was closed"
        )
    return _original_connparams(self, asynchronous=asynchronous)


def closed_channels_fail_as_connection_errors() -> None:
    """Install the fix (idempotent; every Redis channel class inherits it)."""
    setattr(kombu_redis.Channel, "_connparams", _connparams)  # noqa: B010


_original_ack = kombu_redis.QoS.ack
_original_reject = kombu_redis.QoS.reject


def _ack(self: Any, delivery_tag: Any) -> None:
    try:
        _original_ack(self, delivery_tag)
    finally:  # (a no-op when the original got that far)
        virtual.QoS.ack(self, delivery_tag)


def _reject(self: Any, delivery_tag: Any, requeue: bool = False) -> None:
    try:
        _original_reject(self, delivery_tag, requeue=requeue)
    finally:
        virtual.QoS.ack(self, delivery_tag)


def failed_acks_free_their_prefetch_slot() -> None:
    """Install fix 2 (idempotent)."""
    if kombu_redis.QoS.ack is not _ack:
        kombu_redis.QoS.ack = _ack  # type: ignore[method-assign]
        kombu_redis.QoS.reject = _reject  # type: ignore[method-assign]
