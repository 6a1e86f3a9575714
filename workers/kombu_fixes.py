"""A fix for kombu's Redis transport, applied in the worker process at start.

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
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

__all__ = ["closed_channels_fail_as_connection_errors"]

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
