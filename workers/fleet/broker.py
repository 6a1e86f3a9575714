"""The broker transport: kombu's Redis transport, except that a broker refusing to
write (out of memory, a read-only replica) is a lost connection, not a crash, and
that a channel reuses one Redis client instead of building one per command.

kombu counts Redis's `OutOfMemoryError` and `ReadOnlyError` as channel errors, which
Celery's consumer does not survive: at `maxmemory` the worker died on its first
delivery or ack ("Unrecoverable error"). As connection errors they make the consumer
reconnect with Celery's back-off until the broker accepts writes again (memory freed,
or the client reconnected to a new master), as for a broker restart.

Each delivery and each ack made kombu build a `redis.Redis` over the channel's pool
(`Channel.conn_or_acquire`), and so did each publish: with redis-py 8 that is 14% of
a worker's main process CPU per task (issue 11, `py-spy`). A client is a thin,
thread-safe front to its pool; the channel keeps one per pool, so a pool kombu drops
and rebuilds after a lost connection gets a new client with it.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

from workers.wire.refusals import BROKER_REFUSALS

__all__ = [
    "PublishTransport",
    "SentinelPublishTransport",
    "SentinelTransport",
    "Transport",
]


class _OneClient:
    """A kombu Redis channel's synchronous client, built once per pool."""

    _one_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # built once already (kombu's cached `client`)
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        # `pool` first: after a lost connection it is built anew, or refused by
        # `kombu_fixes` for a closed channel, exactly as for kombu's own clients.
        pool = self.pool  # type: ignore[attr-defined]
        client = self._one_client
        if client is None or client.connection_pool is not pool:
            client = self._one_client = super()._create_client()  # type: ignore[misc]
        return client


class Channel(_OneClient, kombu_redis.Channel):
    """kombu's Redis channel with one client per pool."""


class SentinelChannel(_OneClient, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel with one client per pool."""


class PublishTransport(kombu_redis.Transport):
    """kombu's Redis transport with one client per pool (a producer's: broker
    refusals stay kombu's channel errors, which the producer reports itself)."""

    Channel = Channel


class SentinelPublishTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with one client per pool (a producer's)."""

    Channel = SentinelChannel


class Transport(PublishTransport):
    """A worker's Redis transport: broker refusals are connection errors too."""

    connection_errors = kombu_redis.Transport.connection_errors + BROKER_REFUSALS


class SentinelTransport(SentinelPublishTransport):
    """A worker's Sentinel transport: broker refusals are connection errors too (a
    READONLY reply from a demoted master: reconnecting asks the sentinels for the
    promoted one)."""

    connection_errors = (
        kombu_redis.SentinelTransport.connection_errors + BROKER_REFUSALS
    )
