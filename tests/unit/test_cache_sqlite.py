"""SqliteResultCache: round trip, expiry, malformed rows, two writer processes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from workers.cache.results import SqliteResultCache
from workers.models import Status

ENTRY = {
    "status": "correct",
    "correct": True,
    "verify_method": "numeric",
    "reason": "",
    "canonical_pred": "2",
    "canonical_gold": "2",
    "grader_version": "v1",
}


class FakeClock:
    """A settable wall clock (seconds)."""

    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        return self.now_s


def test_cache_sqlite_round_trip(tmp_path: Path) -> None:
    cache = SqliteResultCache(tmp_path / "sub" / "cache.db")
    entries = {f"{i:064x}": {**ENTRY, "canonical_pred": str(i)} for i in range(1200)}
    cache.set_many(entries)
    found = cache.get_many([*entries, "f" * 64])  # > 500 keys: chunked IN queries
    assert found == entries
    assert cache.get_many([]) == {}
    cache.close()


def test_cache_sqlite_stores_the_compact_sorted_json(tmp_path: Path) -> None:
    # Stored values are shared with older workers: their bytes must not change.
    path = tmp_path / "cache.db"
    entry = {**ENTRY, "reason": 'x²≠ \ud800 "q"', "canonical_pred": None}
    cache = SqliteResultCache(path)
    cache.set_many({"a" * 64: entry})
    with sqlite3.connect(path) as conn:
        (stored,) = conn.execute("SELECT value FROM results").fetchone()
    conn.close()
    assert stored == json.dumps(entry, sort_keys=True, separators=(",", ":"))
    assert stored == (
        '{"canonical_gold":"2","canonical_pred":null,"correct":true,'
        '"grader_version":"v1","reason":"x\\u00b2\\u2260 \\ud800 \\"q\\"",'
        '"status":"correct","verify_method":"numeric"}'
    )
    assert cache.get_many(["a" * 64]) == {"a" * 64: entry}
    cache.close()


def test_cache_sqlite_entries_expire(tmp_path: Path) -> None:
    clock = FakeClock()
    cache = SqliteResultCache(tmp_path / "cache.db", ttl_s=60, clock=clock)
    cache.set_many({"a" * 64: ENTRY})
    clock.now_s += 59
    assert cache.get_many(["a" * 64]) == {"a" * 64: ENTRY}
    clock.now_s += 2
    assert cache.get_many(["a" * 64]) == {}
    assert cache.purge_expired() == 1


def test_cache_sqlite_malformed_row_is_a_miss(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    cache = SqliteResultCache(path)
    cache.set_many({"a" * 64: ENTRY})
    bad = {"b" * 64: "{not json", "c" * 64: '{"status": "timeout"}'}
    with sqlite3.connect(path) as conn:
        conn.executemany("INSERT INTO results VALUES (?, ?, 9e18)", list(bad.items()))
    conn.close()
    assert cache.get_many(["a" * 64, *bad]) == {"a" * 64: ENTRY}


def test_cache_sqlite_refuses_transient_rows_even_if_present(tmp_path: Path) -> None:
    cache = SqliteResultCache(tmp_path / "cache.db")
    transient = {**ENTRY, "status": Status.TIMEOUT.value, "correct": False}
    cache.set_many({"d" * 64: transient})
    assert cache.get_many(["d" * 64]) == {}


WRITER = """
import sys
from workers.cache.results import SqliteResultCache
path, start, entry = sys.argv[1], int(sys.argv[2]), {entry!r}
cache = SqliteResultCache(path)
for i in range(start, start + 1000, 10):
    cache.set_many({{f"{{j:064x}}": entry for j in range(i, i + 10)}})
cache.close()
"""


def test_cache_sqlite_two_writer_processes(tmp_path: Path) -> None:
    # Fresh interpreters, not fork(): the pytest process may hold threads (and locks).
    path = str(tmp_path / "cache.db")
    code = WRITER.format(entry=ENTRY)
    procs = [
        subprocess.Popen([sys.executable, "-c", code, path, str(k * 1000)])
        for k in (0, 1)
    ]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    found = SqliteResultCache(path).get_many([f"{j:064x}" for j in range(2000)])
    assert len(found) == 2000


OPENER = """
import os, sys, time
from workers.cache.results import SqliteResultCache
from workers.errors import CacheError
path, worker, go, entry = sys.argv[1], sys.argv[2], sys.argv[3], {entry!r}
while not os.path.exists(go):
    time.sleep(0.001)
cache = SqliteResultCache(path)
failures = 0
for i in range(20):
    key = f"{{worker}}{{i:063x}}"
    try:
        cache.get_many([key])
        cache.set_many({{key: entry}})
    except CacheError:
        failures += 1
cache.close()
sys.exit(min(failures, 100))
"""


def test_cache_sqlite_many_processes_opening_a_new_file_at_once(tmp_path: Path) -> None:
    # Switching a new file to WAL can fail "locked" at once: the cache must wait it out.
    code = OPENER.format(entry=ENTRY)
    for trial in range(10):
        path = str(tmp_path / f"cache-{trial}.db")
        go = tmp_path / f"go-{trial}"
        procs = [
            subprocess.Popen([sys.executable, "-c", code, path, str(k), str(go)])
            for k in range(4)
        ]
        time.sleep(0.3)  # let the interpreters start, then release them together
        go.touch()
        exit_codes = [proc.wait(timeout=60) for proc in procs]
        assert exit_codes == [0, 0, 0, 0]


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM results").fetchone()
    return int(count)


def test_sqlite_cache_is_bounded_by_size_as_it_runs(tmp_path: Path) -> None:
    # Given a cache of at most 100 rows that purges every 50 rows it stores
    clock = FakeClock()
    path = tmp_path / "c.sqlite3"
    cache = SqliteResultCache(path, max_rows=100, purge_every=50, clock=clock)
    # When 1,000 entries are stored, one second apart
    for n in range(1_000):
        clock.now_s += 1
        cache.set_many({f"k{n}": ENTRY})
    # Then the file holds at most 100 + 50 rows, and the newest ones
    assert _rows(path) <= 150
    assert cache.get_many(["k999"]) != {}
    assert cache.get_many(["k0", "k500"]) == {}


def test_sqlite_cache_purges_expired_rows_as_it_runs(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "c.sqlite3"
    cache = SqliteResultCache(path, ttl_s=10, purge_every=5, clock=clock)
    cache.set_many({f"old{n}": ENTRY for n in range(4)})
    clock.now_s += 11  # the four are expired, still on disk
    assert _rows(path) == 4
    cache.set_many({"new": ENTRY})  # the fifth row stored: a purge
    assert _rows(path) == 1


def test_sqlite_cache_is_bounded_by_bytes_when_rows_are_big(tmp_path: Path) -> None:
    # Given rows of 40 KB (line-mode units), a 2 MiB bound and no row bound to speak of
    path = tmp_path / "c.sqlite3"
    cache = SqliteResultCache(path, max_bytes=2 << 20, purge_every=10**9)
    value = "x" * 40_000
    # When 200 of them (8 MB) are stored
    for i in range(200):
        cache.set_values({f"unit-{i}": value})
    cache.close()
    # Then the rows stay within the bound (purged to 90% of it, then at most an
    # eighth of it stored before the next purge), the newest kept
    with sqlite3.connect(path) as conn:
        (used,) = conn.execute("SELECT SUM(LENGTH(value)) FROM results").fetchone()
        keys = {key for (key,) in conn.execute("SELECT key FROM results")}
    assert used <= (2 << 20) * 0.9 + (2 << 20) // 8
    assert "unit-199" in keys
    assert len(keys) >= 20


def test_cache_sqlite_checkpoint_moves_written_rows_into_the_database_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.sqlite3"
    cache = SqliteResultCache(path)
    cache.set_values({"first": "row"})
    reader = sqlite3.connect(path)
    assert reader.execute("SELECT count(*) FROM results").fetchall() == [(1,)]
    marker = "checkpoint-marker-" * 20
    cache.set_values({"k": marker})
    assert marker.encode() not in path.read_bytes()  # in the write-ahead log
    cache.checkpoint()
    assert marker.encode() in path.read_bytes()
    assert cache.get_values(["k"]) == {"k": marker}
    cache.close()
    reader.close()
