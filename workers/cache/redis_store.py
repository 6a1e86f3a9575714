"""The result cache in Redis (`RedisResultCache`); keys, entries and the SQLite store
are `workers.cache.results`. The Redis key of a digest is `protocol.result_key`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from workers.cache.results import _decode_entry, _encode_entry
from workers.errors import CacheError
from workers.wire.protocol import result_key
from workers.wire.signing import Keyring

__all__ = ["RedisResultCache"]

log = logging.getLogger(__name__)


# KEYS: result keys; ARGV: the TTL in seconds, then one value per key.
_SET_MANY_LUA = """
local ttl_s = ARGV[1]
for i = 1, #KEYS do
    redis.call('SET', KEYS[i], ARGV[i + 1], 'EX', ttl_s)
end
"""
# Entries per script call: a script blocks the server (the broker's too, when shared)
# while it runs, so each call stays short.
_REDIS_SCRIPT_CHUNK = 256

# On a server that refuses writes when full (`maxmemory` with `noeviction`: a broker
# must not evict queued tasks), the cache stops storing once the server is this full,
# so it never takes the last of the memory the queue needs; its entries still expire
# by their TTL. An evicting server (`allkeys-lru`, a cache of its own) is not limited.
DEFAULT_MAX_FILL = 0.5
# How often the fill is read (one INFO memory): stores in between trust the last read.
_FILL_CHECK_EVERY_S = 5.0


class RedisResultCache:
    """Results in Redis: one MGET per lookup, one Lua script per store (SET EX of every
    entry, server side: a fraction of the client time of one pipelined SET per entry).

    When the server refuses the script (scripting disabled or denied, a proxy without
    EVAL) and plain SETs then succeed, this cache object stores with pipelined SETs
    from then on.

    Give it a client with short socket timeouts and few retries: redis-py 6+ retries
    failed commands by default (seconds on a refused connection), and every batch
    pays that while the cache is down (the batch itself goes on without cache).

    With a keyring, each value is `<tag>|<entry JSON>`, the tag a MAC over the key's
    digest and the entry (`workers.wire.signing`): an entry that does not verify (one
    SET by anyone without the key, or copied from another key) is a miss, reported to
    `on_rejected` with how many, and is overwritten when the item is graded again.

    On a server with `maxmemory` and the `noeviction` policy (a broker), stores are
    skipped while it is more than `max_fill` full (`DEFAULT_MAX_FILL`), read with
    INFO memory every `fill_check_every_s`: a cache sharing the broker never fills it.

    Raises:
        CacheError: on any Redis error (callers degrade to grading without cache).
    """

    def __init__(
        self,
        redis_client: redis.Redis[Any],
        *,
        ttl_s: int = 86_400,
        namespace: str = "gradefleet",
        keyring: Keyring | None = None,
        on_rejected: Callable[[int], None] | None = None,
        max_fill: float = DEFAULT_MAX_FILL,
        fill_check_every_s: float = _FILL_CHECK_EVERY_S,
    ) -> None:
        if ttl_s < 1:
            raise ValueError(f"ttl_s must be >= 1 s, got {ttl_s}")
        if not 0 < max_fill <= 1:
            raise ValueError(f"max_fill must be in (0, 1], got {max_fill}")
        self._max_fill = max_fill
        self._fill_check_every_s = fill_check_every_s
        self._fill_checked_at: float | None = None
        self._too_full = False
        self.skipped_full = 0  # entries not stored because the server was too full
        self._redis = redis_client
        self._ttl_s = ttl_s
        self._namespace = namespace
        # EVALSHA, with redis-py loading the script on NOSCRIPT.
        self._set_many_script = redis_client.register_script(_SET_MANY_LUA)
        self._scripting = True
        self._keyring = keyring
        self._on_rejected = on_rejected

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not keys:
            return {}
        names = [result_key(key, self._namespace) for key in keys]
        try:
            raws = self._redis.mget(names)
        except redis.RedisError as exc:
            raise CacheError(f"redis MGET of {len(names)} keys failed: {exc}") from exc
        found: dict[str, dict[str, Any]] = {}
        rejected = 0
        for key, raw in zip(keys, raws, strict=True):
            if raw is not None and self._keyring is not None:
                raw = self._open(key, raw)
                rejected += raw is None
            entry = _decode_entry(raw)
            if entry is not None:
                found[key] = entry
        if rejected and self._on_rejected is not None:
            self._on_rejected(rejected)
        return found

    def _open(self, key: str, raw: bytes | str) -> str | None:
        """The entry JSON of a signed value, or None when its MAC does not verify."""
        assert self._keyring is not None
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        tag, _, entry_json = text.partition("|")
        if not self._keyring.verify(tag, "cache", key, entry_json):
            return None
        return entry_json

    def _seal(self, key: str, entry_json: str) -> str:
        if self._keyring is None:
            return entry_json
        return f"{self._keyring.sign('cache', key, entry_json)}|{entry_json}"

    def set_many(self, entries: Mapping[str, dict[str, Any]]) -> None:
        if not entries:
            return
        if self._server_too_full():
            self.skipped_full += len(entries)
            return
        names = [result_key(key, self._namespace) for key in entries]
        values = [
            self._seal(key, _encode_entry(entry)) for key, entry in entries.items()
        ]
        try:
            if self._scripting:
                self._set_scripted(names, values)
            else:
                self._set_pipelined(names, values)
        except redis.RedisError as exc:
            raise CacheError(f"redis SET of {len(names)} keys failed: {exc}") from exc

    def _server_too_full(self) -> bool:
        """Whether a `noeviction` server is past `max_fill` (as of the last read)."""
        now = time.monotonic()
        if (
            self._fill_checked_at is not None
            and now - self._fill_checked_at < self._fill_check_every_s
        ):
            return self._too_full
        self._fill_checked_at = now
        try:
            memory = self._redis.info("memory")
        except redis.RedisError:
            # INFO refused (an ACL user) or the server down: store as before (a
            # down server fails the store itself, with its error).
            self._too_full = False
            return False
        max_bytes = int(memory.get("maxmemory", 0) or 0)
        policy = str(memory.get("maxmemory_policy", ""))
        used_bytes = int(memory.get("used_memory", 0) or 0)
        was_full = self._too_full
        self._too_full = (
            max_bytes > 0
            and policy == "noeviction"
            and used_bytes > self._max_fill * max_bytes
        )
        if self._too_full and not was_full:
            log.warning(
                "result cache: the server is %.0f%% full (noeviction, maxmemory %d "
                "bytes); not storing results until it is below %.0f%%",
                100 * used_bytes / max_bytes,
                max_bytes,
                100 * self._max_fill,
            )
        return self._too_full

    def _set_scripted(self, names: list[str], values: list[str]) -> None:
        """SET EX through the script; through a pipeline if the server refuses it."""
        try:
            for start in range(0, len(names), _REDIS_SCRIPT_CHUNK):
                stop = start + _REDIS_SCRIPT_CHUNK
                self._set_many_script(
                    keys=names[start:stop], args=[self._ttl_s, *values[start:stop]]
                )
        except redis.ResponseError as exc:
            # SETs are idempotent: redo them all. Only when plain SETs work is the
            # script the problem (an OOM or a read-only replica fails both).
            self._set_pipelined(names, values)
            log.warning(
                "redis refused the result cache's store script, using pipelined SETs"
                " from now on: %s",
                exc,
            )
            self._scripting = False

    def _set_pipelined(self, names: list[str], values: list[str]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for name, value in zip(names, values, strict=True):
            pipe.set(name, value, ex=self._ttl_s)
        pipe.execute()
