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

from workers.refusals import BROKER_REFUSALS
from workers.urls import is_sentinel_url

__all__ = ["SentinelTransport", "Transport", "transport_for"]

# URL schemes served by kombu's plain Redis transport.
_SCHEMES = frozenset({"redis", "rediss"})


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with broker refusals as connection errors."""

    connection_errors = kombu_redis.Transport.connection_errors + BROKER_REFUSALS


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with broker refusals as connection errors (a
    READONLY reply from a demoted master: reconnecting asks the sentinels for the
    promoted one)."""

    connection_errors = (
        kombu_redis.SentinelTransport.connection_errors + BROKER_REFUSALS
    )


def transport_for(broker_url: str) -> str | None:
    """Celery's `broker_transport` for `broker_url` (ours, not kombu's form): this
    module's transports for redis://, rediss:// and sentinel://, None (the URL's
    own) for any other scheme."""
    scheme = urlsplit(broker_url).scheme.lower()
    if scheme in _SCHEMES:
        return f"{__name__}:{Transport.__name__}"
    if is_sentinel_url(broker_url):
        return f"{__name__}:{SentinelTransport.__name__}"
    return None
