"""The verdict caches: the cache key (sha256 of the grader version, options and
canonical answer pair), stored entries, the SQLite store of the embedded mode, the
Redis store of a fleet, and the exact-response layer (whole verdicts by raw text).

It may import `workers.models`, `workers.errors`, `workers.jsontext`, the Redis keys
and signatures of `workers.wire` and the standard library; never the sandbox, the
embedded pool, the fleet or the producer (see `tests/unit/test_import_graph.py`,
`docs/architecture.md`). `results.py` imports no Redis client, so that the embedded
CLI reads its cache without one.

Adding to it: a new store implements `results.CacheBackend`; anything that changes a
verdict must change the key (`results.cache_key`), never the entries' meaning.
"""
