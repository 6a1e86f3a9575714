"""RedisResultCache.set_many: the store script, its chunks, and the fallback to
pipelined SETs when a server refuses scripting (all on private redis-servers)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from workers.cache.redis_store import _REDIS_SCRIPT_CHUNK, RedisResultCache
from workers.errors import CacheError
from workers.wire.protocol import result_key

ENTRY = {
    "status": "wrong",
    "correct": False,
    "verify_method": "symbolic",
    "reason": "x²+1 ≠ x+2",
    "canonical_pred": "x**2+1",
    "canonical_gold": None,
    "grader_version": "v1",
}
_START_DEADLINE_S = 10.0
_FALLBACK_WARNING = "refused the result cache's store script"


def make_entries(count: int, tag: str = "") -> dict[str, dict[str, Any]]:
    return {
        f"{tag}{i:0{64 - len(tag)}x}": {**ENTRY, "canonical_pred": f"x+{tag}{i}"}
        for i in range(count)
    }


def script_runs(client: redis.Redis[Any]) -> int:
    """Successful EVALSHA calls since the last CONFIG RESETSTAT."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


def assert_stored(
    client: redis.Redis[Any], entries: dict[str, dict[str, Any]], ttl_s: int
) -> None:
    """Every entry under its key, byte-identical to the documented JSON, TTL set."""
    names = [result_key(key) for key in entries]
    expected = [
        json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
        for entry in entries.values()
    ]
    assert client.mget(names) == expected
    ttls_s = [client.ttl(name) for name in names]  # -1: no TTL, -2: no key
    assert min(ttls_s) > 0
    assert max(ttls_s) <= ttl_s


def test_cache_redis_set_many_stores_through_one_script_call(
    redis_client: redis.Redis[bytes],
) -> None:
    # Given a cache with a two-minute TTL
    cache = RedisResultCache(redis_client, ttl_s=120)
    entries = make_entries(150)
    redis_client.config_resetstat()
    # When a batch's worth of entries is stored
    cache.set_many(entries)
    # Then one script run stored them all, with the TTL, and they read back
    assert script_runs(redis_client) == 1
    assert_stored(redis_client, entries, ttl_s=120)
    assert redis_client.dbsize() == 150
    assert cache.get_many([*entries, "e" * 64]) == entries


def test_cache_redis_set_many_splits_large_stores(
    redis_client: redis.Redis[bytes],
) -> None:
    cache = RedisResultCache(redis_client, ttl_s=60)
    count = 2 * _REDIS_SCRIPT_CHUNK + 7
    entries = make_entries(count)
    redis_client.config_resetstat()
    cache.set_many(entries)
    assert script_runs(redis_client) == math.ceil(count / _REDIS_SCRIPT_CHUNK)
    assert_stored(redis_client, entries, ttl_s=60)
    assert cache.get_many(list(entries)) == entries


def test_cache_redis_set_many_overwrites_and_renews_the_ttl(
    redis_client: redis.Redis[bytes],
) -> None:
    key = "a" * 64
    RedisResultCache(redis_client, ttl_s=5).set_many({key: ENTRY})
    newer = {**ENTRY, "reason": "regraded"}
    RedisResultCache(redis_client, ttl_s=3600).set_many({key: newer})
    assert RedisResultCache(redis_client).get_many([key]) == {key: newer}
    assert 5 < redis_client.ttl(result_key(key)) <= 3600


def test_cache_redis_script_works_with_decoded_responses(
    redis_server: str, redis_client: redis.Redis[bytes]
) -> None:
    client: redis.Redis[str] = redis.Redis.from_url(redis_server, decode_responses=True)
    try:
        cache = RedisResultCache(client, ttl_s=60)
        entries = make_entries(3)
        redis_client.config_resetstat()
        cache.set_many(entries)
        assert script_runs(redis_client) == 1
        assert cache.get_many(list(entries)) == entries
    finally:
        client.close()


@pytest.fixture(scope="module")
def no_scripting_server(start_redis_server) -> str:
    """A private redis-server with EVAL and EVALSHA renamed away (as some proxies and
    managed services do); its URL."""
    return start_redis_server(
        "--rename-command", "EVAL", "", "--rename-command", "EVALSHA", ""
    )


@pytest.fixture
def renamed_scripting_client(no_scripting_server: str) -> Iterator[redis.Redis[bytes]]:
    client: redis.Redis[bytes] = redis.Redis.from_url(no_scripting_server)
    client.flushdb()  # our own server (module fixture): other tests' keys only
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def acl_denied_client(
    redis_server: str, redis_client: redis.Redis[bytes]
) -> Iterator[redis.Redis[bytes]]:
    """A client whose ACL user may run everything but scripts (NOPERM on EVALSHA)."""
    user = "gradefleet-no-scripting"
    redis_client.acl_setuser(
        user,
        enabled=True,
        nopass=True,
        keys=["*"],
        categories=["+@all", "-@scripting"],
    )
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_server, username=user)
    try:
        yield client
    finally:
        client.close()
        redis_client.acl_deluser(user)


@pytest.mark.parametrize(
    "client_fixture", ["renamed_scripting_client", "acl_denied_client"]
)
def test_cache_redis_falls_back_to_pipelined_sets_when_scripting_is_refused(
    request: pytest.FixtureRequest,
    client_fixture: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a server that refuses scripts to this client
    client: redis.Redis[bytes] = request.getfixturevalue(client_fixture)
    cache = RedisResultCache(client, ttl_s=90)
    first, second = make_entries(150, "1"), make_entries(20, "2")
    # When two batches are stored
    with caplog.at_level(logging.WARNING, logger="workers.cache.results"):
        cache.set_many(first)
        cache.set_many(second)
    # Then both are stored with their TTL, and the script was tried once only
    assert_stored(client, first, ttl_s=90)
    assert_stored(client, second, ttl_s=90)
    assert cache.get_many([*first, *second]) == {**first, **second}
    warnings = [r for r in caplog.records if _FALLBACK_WARNING in r.getMessage()]
    assert len(warnings) == 1


def test_cache_redis_keeps_the_script_when_plain_sets_fail_too(
    redis_client: redis.Redis[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a server refusing every write (not a scripting problem)
    cache = RedisResultCache(redis_client, ttl_s=60)
    redis_client.config_set("min-replicas-to-write", 1)
    try:
        # When storing, Then the error is a CacheError
        with pytest.raises(CacheError, match=r"SET of 1 keys failed.*NOREPLICAS"):
            cache.set_many({"a" * 64: ENTRY})
    finally:
        redis_client.config_set("min-replicas-to-write", 0)
    # And once writes work again the cache still stores through the script
    redis_client.config_resetstat()
    cache.set_many({"b" * 64: ENTRY})
    assert script_runs(redis_client) == 1
    assert cache.get_many(["a" * 64, "b" * 64]) == {"b" * 64: ENTRY}
    assert _FALLBACK_WARNING not in caplog.text


def test_cache_redis_unreachable_store_raises_cache_error() -> None:
    # A port nothing listens on (port 1 needs root to bind): no fallback, an error.
    client: redis.Redis[bytes] = redis.Redis(
        host="127.0.0.1",
        port=1,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        with pytest.raises(CacheError, match="SET of 2 keys failed"):
            RedisResultCache(client).set_many(make_entries(2))
    finally:
        client.close()
