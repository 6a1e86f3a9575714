"""Redis clients by URL: roles that share a URL (broker, result backend, cache) share
one client, so a single-Redis deployment holds one connection pool per process."""

from __future__ import annotations

from typing import Any

import redis

__all__ = ["RedisClients"]


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
