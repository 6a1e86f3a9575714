"""The broker transport: kombu's Redis transport, except that a broker refusing to
write (out of memory, a read-only replica) is a lost connection, not a crash.

kombu counts Redis's `OutOfMemoryError` and `ReadOnlyError` as channel errors, which
Celery's consumer does not survive: at `maxmemory` the worker died on its first
delivery or ack ("Unrecoverable error"). As connection errors they make the consumer
reconnect with Celery's back-off until the broker accepts writes again (memory freed,
or the client reconnected to a new master), as for a broker restart.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from kombu.transport import redis as kombu_redis

from workers.connections import BROKER_REFUSALS

__all__ = ["Transport", "transport_for"]

# URL schemes served by kombu's plain Redis transport (Sentinel has its own).
_SCHEMES = frozenset({"redis", "rediss"})


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with broker refusals as connection errors."""

    connection_errors = kombu_redis.Transport.connection_errors + BROKER_REFUSALS


def transport_for(broker_url: str) -> str | None:
    """Celery's `broker_transport` for `broker_url`: this module's transport for
    redis:// and rediss://, None (the URL's own) for any other scheme."""
    if urlsplit(broker_url).scheme.lower() in _SCHEMES:
        return f"{__name__}:{Transport.__name__}"
    return None
