"""Redis clients by URL: the one place a URL becomes a client.

`redis://`, `rediss://` and `unix://` go through redis-py's `from_url`; `sentinel://`
(`workers.wire.urls`) through a redis-py `Sentinel` whose `master_for` client asks the
sentinels for the master on every new connection, so after a failover it reconnects
to the promoted replica by itself. Celery and kombu take the same URL in their own
form (`celery_endpoint`: `sentinel://h1:p/db;sentinel://h2:p/db` plus a `master_name`
transport option).

Roles that share a URL (broker, result backend, cache) share one client
(`RedisClients`), so a single-Redis deployment holds one connection pool per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from workers.wire.urls import SentinelUrl, is_sentinel_url, parse_sentinel_url

if TYPE_CHECKING:
    from celery import Celery

__all__ = [
    "CeleryEndpoint",
    "RedisClients",
    "async_redis_client",
    "celery_endpoint",
    "control_app",
    "redis_client",
    "transport_for",
]


def redis_client(url: str, **options: Any) -> redis.Redis[bytes]:
    """A client for `url` (any scheme above); `options` are redis-py connection
    options (`socket_timeout`, ...), given to the sentinels' connections too.

    Raises:
        ConfigError: a malformed `sentinel://` URL.
        ValueError: another URL redis-py cannot parse.
    """
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **options)
    parsed = parse_sentinel_url(url)
    sentinel = redis.sentinel.Sentinel(
        parsed.sentinels,
        sentinel_kwargs=_sentinel_kwargs(parsed, options),
        **options,
    )
    client: redis.Redis[bytes] = sentinel.master_for(
        parsed.master_name, **_master_kwargs(parsed)
    )
    return client


def async_redis_client(url: str, **options: Any) -> redis.asyncio.Redis[bytes]:
    """`redis_client` for asyncio (`redis.asyncio`)."""
    if not is_sentinel_url(url):
        return redis.asyncio.Redis.from_url(url, **options)
    parsed = parse_sentinel_url(url)
    sentinel = redis.asyncio.sentinel.Sentinel(
        parsed.sentinels,
        sentinel_kwargs=_sentinel_kwargs(parsed, options),
        **options,
    )
    client: redis.asyncio.Redis[bytes] = sentinel.master_for(
        parsed.master_name, **_master_kwargs(parsed)
    )
    return client


def _sentinel_kwargs(parsed: SentinelUrl, options: dict[str, Any]) -> dict[str, Any]:
    # The sentinels get the same socket timeouts (a dead sentinel must not stall a
    # lookup longer than a dead master would) and their own password, if any.
    kwargs = {k: v for k, v in options.items() if k.startswith("socket_")}
    if parsed.sentinel_password:
        kwargs["password"] = parsed.sentinel_password
    return kwargs


def _master_kwargs(parsed: SentinelUrl) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"db": parsed.db}
    if parsed.username:
        kwargs["username"] = parsed.username
    if parsed.password is not None:
        kwargs["password"] = parsed.password
    return kwargs


@dataclass(frozen=True, slots=True)
class CeleryEndpoint:
    """A Redis URL as Celery takes it: `url` for `broker=`/`backend=`, and the
    transport options it needs (`broker_transport_options`,
    `result_backend_transport_options`), to merge with one's own."""

    url: str
    transport_options: dict[str, Any] = field(default_factory=dict)


def celery_endpoint(url: str) -> CeleryEndpoint:
    """`url` in kombu's form: unchanged unless it is a `sentinel://` URL, which
    becomes one `sentinel://` URL per sentinel joined by `;` (kombu's and Celery's
    Sentinel transport and backend) with `master_name` as a transport option.

    Raises:
        ConfigError: a malformed `sentinel://` URL.
    """
    if not is_sentinel_url(url):
        return CeleryEndpoint(url)
    parsed = parse_sentinel_url(url)
    userinfo = ""
    if parsed.password is not None or parsed.username:
        user = quote(parsed.username or "", safe="")
        userinfo = f"{user}:{quote(parsed.password or '', safe='')}@"
    urls = [
        f"sentinel://{userinfo}{_netloc_host(host)}:{port}/{parsed.db}"
        for host, port in parsed.sentinels
    ]
    options: dict[str, Any] = {"master_name": parsed.master_name}
    if parsed.sentinel_password:
        options["sentinel_kwargs"] = {"password": parsed.sentinel_password}
    return CeleryEndpoint(";".join(urls), options)


# URL schemes served by kombu's plain Redis transport.
_REDIS_SCHEMES = frozenset({"redis", "rediss"})


def transport_for(broker_url: str, *, publish_only: bool = False) -> str | None:
    """Celery's `broker_transport` for `broker_url` (ours, not kombu's form): a
    `workers.fleet.broker` transport for redis://, rediss:// and sentinel:// (a
    worker's, or with `publish_only` a producer's), None (the URL's own) for any other
    scheme. By name: kombu is imported only where Celery loads it."""
    scheme = urlsplit(broker_url).scheme.lower()
    if scheme in _REDIS_SCHEMES:
        name = "PublishTransport" if publish_only else "Transport"
    elif is_sentinel_url(broker_url):
        name = "SentinelPublishTransport" if publish_only else "SentinelTransport"
    else:
        return None
    return f"workers.fleet.broker:{name}"


def control_app(name: str, url: str) -> Celery:
    """A Celery app for remote-control calls only (`ping`, `stats`): JSON, and no
    connection retries (a status command answers rather than waits)."""
    from celery import Celery  # here: `workers.wire.connections` loads without Celery

    endpoint = celery_endpoint(url)
    app = Celery(name, broker=endpoint.url, set_as_current=False)
    app.conf.update(
        accept_content=["json"],
        broker_connection_retry=False,
        broker_transport_options=endpoint.transport_options,
    )
    return app


def _netloc_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class RedisClients:
    """One client per distinct URL (`redis_client`), built on first use with
    `client_options`."""

    def __init__(self, **client_options: Any) -> None:
        self._options = client_options
        self._by_url: dict[str, redis.Redis[bytes]] = {}

    def get(self, url: str) -> redis.Redis[bytes]:
        """The client for `url` (the same object for the same URL)."""
        client = self._by_url.get(url)
        if client is None:
            client = self._by_url[url] = redis_client(url, **self._options)
        return client

    def close(self) -> None:
        """Close every client built here."""
        clients, self._by_url = list(self._by_url.values()), {}
        for client in clients:
            client.close()
