"""RedisResultCache against a real private redis-server (the `redis_client` fixture)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from workers.cache.redis_store import RedisResultCache
from workers.errors import CacheError
from workers.wire.protocol import result_key

pytestmark = pytest.mark.integration

ENTRY = {
    "status": "wrong",
    "correct": False,
    "verify_method": "symbolic",
    "reason": "x+1 != x+2",
    "canonical_pred": "x+1",
    "canonical_gold": "x+2",
    "grader_version": "v1",
}


def test_cache_redis_round_trip_with_ttl(redis_client: redis.Redis[Any]) -> None:
    # Given a cache with a one-hour TTL
    cache = RedisResultCache(redis_client, ttl_s=3600)
    entries = {f"{i:064x}": {**ENTRY, "canonical_pred": f"x+{i}"} for i in range(300)}
    # When entries are stored and read back (plus one key never stored)
    cache.set_many(entries)
    found = cache.get_many([*entries, "e" * 64])
    # Then every stored entry comes back, under its namespaced key, with the TTL set
    assert found == entries
    key = result_key("0" * 64)
    assert key == f"gradefleet:v1:result:{'0' * 64}"
    assert 3590 <= redis_client.ttl(key) <= 3600
    assert redis_client.dbsize() == 300


def test_cache_redis_namespace_is_in_the_key(redis_client: redis.Redis[Any]) -> None:
    RedisResultCache(redis_client, namespace="other").set_many({"a" * 64: ENTRY})
    assert redis_client.exists(f"other:v1:result:{'a' * 64}") == 1
    assert RedisResultCache(redis_client).get_many(["a" * 64]) == {}


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"status": "correct"}', b'"x"'],
    ids=["bad-json", "bad-utf8", "list", "missing-fields", "string"],
)
def test_cache_redis_malformed_entry_is_a_miss(
    redis_client: redis.Redis[Any], raw: bytes
) -> None:
    redis_client.set(result_key("b" * 64), raw)
    cache = RedisResultCache(redis_client)
    cache.set_many({"a" * 64: ENTRY})
    assert cache.get_many(["a" * 64, "b" * 64]) == {"a" * 64: ENTRY}


def test_cache_redis_works_with_decoded_responses(redis_server: str) -> None:
    client: redis.Redis[str] = redis.Redis.from_url(redis_server, decode_responses=True)
    try:
        cache = RedisResultCache(client)
        cache.set_many({"c" * 64: ENTRY})
        assert cache.get_many(["c" * 64]) == {"c" * 64: ENTRY}
    finally:
        client.flushdb()
        client.close()


def test_cache_redis_unreachable_raises_cache_error() -> None:
    # A port nothing listens on (port 1 needs root to bind).
    client: redis.Redis[bytes] = redis.Redis(
        host="127.0.0.1",
        port=1,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
    cache = RedisResultCache(client)
    with pytest.raises(CacheError, match="MGET"):
        cache.get_many(["a" * 64])
    with pytest.raises(CacheError, match="SET"):
        cache.set_many({"a" * 64: ENTRY})
    client.close()


@pytest.mark.parametrize(
    ("policy", "stored_when_full"), [("noeviction", False), ("allkeys-lru", True)]
)
def test_cache_redis_stops_storing_in_a_full_noeviction_server(
    start_redis_server: Any, policy: str, stored_when_full: bool
) -> None:
    # Given a server of 16 MiB, over half of it taken by other data (a broker's queue)
    url = start_redis_server("--maxmemory", "16mb", "--maxmemory-policy", policy)
    client: redis.Redis[bytes] = redis.Redis.from_url(url)
    fillers = [f"queue-filler-{n}" for n in range(10)]
    for name in fillers:  # 1 MiB each: a bigger value's query buffer hits maxmemory
        client.set(name, b"x" * (1024 * 1024))
    cache = RedisResultCache(client, max_fill=0.5, fill_check_every_s=0.0)
    # When results are stored
    cache.set_many({"a" * 64: ENTRY})
    # Then a noeviction server (a broker) gets none of them past half full, an
    # evicting one does
    assert (client.get(result_key("a" * 64)) is not None) == stored_when_full
    assert cache.skipped_full == (0 if stored_when_full else 1)
    # and once the memory is freed, the cache stores again
    client.delete(*fillers)
    cache.set_many({"b" * 64: ENTRY})
    assert client.get(result_key("b" * 64)) is not None
