"""Redis clients by URL (roles that share a URL share one client, so a single-Redis
deployment holds one connection pool per process), and what a broker's refusal is."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialBackoff

# types-redis predates OutOfMemoryError (redis-py 4.6+).
from redis.exceptions import OutOfMemoryError, ReadOnlyError  # type: ignore[attr-defined]
from redis.retry import Retry

__all__ = ["BROKER_REFUSALS", "OUTLAST_REFUSALS", "RedisClients", "broker_refusal"]

# A broker that answers but refuses to write: out of memory under `noeviction`, or a
# replica made read-only by a failover. Both pass (memory is freed, a new master is
# found), so workers and producers wait them out; a missing ACL permission
# (NoPermissionError) never passes and stays fatal.
BROKER_REFUSALS: tuple[type[redis.ResponseError], ...] = (
    OutOfMemoryError,
    ReadOnlyError,
)
_MAX_CAUSES = 8
# A write the broker refuses is tried again after 0.1, 0.2, ... then every 2 s, about
# a minute in all: what an operator needs to raise `maxmemory` or a failover to end,
# while a running batch holds its verdicts instead of losing them.
OUTLAST_REFUSALS = Retry(
    ExponentialBackoff(cap=2.0, base=0.05), retries=40, supported_errors=BROKER_REFUSALS
)


def broker_refusal(exc: BaseException) -> BaseException | None:
    """The broker refusal in `exc` or its causes, else None (kombu and our own
    errors wrap Redis's)."""
    seen: BaseException | None = exc
    for _ in range(_MAX_CAUSES):
        if seen is None:
            return None
        if isinstance(seen, BROKER_REFUSALS):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class RedisClients:
    """One `redis.Redis` per distinct URL, built on first use with `client_options`."""

    def __init__(self, **client_options: Any) -> None:
        self._options = client_options
        self._by_url: dict[str, redis.Redis[bytes]] = {}

    def get(self, url: str) -> redis.Redis[bytes]:
        """The client for `url` (the same object for the same URL)."""
        client = self._by_url.get(url)
        if client is None:
            client = self._by_url[url] = redis.Redis.from_url(url, **self._options)
        return client

    def close(self) -> None:
        """Close every client built here."""
        clients, self._by_url = list(self._by_url.values()), {}
        for client in clients:
            client.close()
