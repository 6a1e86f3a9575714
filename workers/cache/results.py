"""The result cache: `cache_key()` (sha256 of canonical JSON), its entries, and the
SQLite store (the Redis store is `workers.cache.redis_store`, apart so that the embedded
CLI reads its cache without importing a Redis client).

Only answer-dependent verdict fields are stored; per-response fields (extracted,
extraction_method, format_valid) always come from the item itself. A batch keys its
items through one `cache_keyer()`, which encodes the grader version and options once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson

from workers.errors import CacheError
from workers.models import (
    ANSWER_FIELDS,
    CODE_FIELDS,
    PER_RESPONSE_FIELDS,
    STATUS_BY_VALUE,
    TRANSIENT_STATUSES,
    VERIFY_METHOD_BY_VALUE,
    GradeOptions,
    OwnFields,
    Status,
    Verdict,
    build_verdict,
)

__all__ = [
    "ANSWER_FIELDS",
    "CacheBackend",
    "SqliteResultCache",
    "cache_entry",
    "cache_key",
    "cache_keyer",
    "code_verdict_from_entry",
    "verdict_from_entry",
]

_ANSWER_FIELD_SET = frozenset(ANSWER_FIELDS)
# A code verdict's entry: its answer fields and, under "code", its own fields (a code
# item's key is its whole response, so its per-response fields are the key's too).
_CODE_PART = "code"
_CODE_ENTRY_SET = _ANSWER_FIELD_SET | {_CODE_PART}
_CODE_PART_FIELDS = (*CODE_FIELDS, *PER_RESPONSE_FIELDS)
_SQLITE_CHUNK = 500
_STATUS_VALUES = frozenset(s.value for s in Status if s not in TRANSIENT_STATUSES)

# Built once: `json.dumps` with non-default arguments builds a new encoder every call.
# Same settings, so same output, as `json.dumps(obj, sort_keys=True, separators=(",",
# ":"))`: with `ensure_ascii=False` for cache keys, without it for stored entries.
_CANONICAL_JSON = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False
)
_ENTRY_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_KEY_HEAD = b'{"decision_key":'  # a cache key's canonical JSON, up to its first value

log = logging.getLogger(__name__)


def _dumps(obj: object) -> str:
    return _CANONICAL_JSON.encode(obj)


def _utf8(text: str) -> bytes:
    # surrogatepass: model text may carry lone surrogates; they must hash, not raise.
    return text.encode("utf-8", "surrogatepass")


def cache_keyer(grader_version: str, options: GradeOptions) -> Callable[[str], str]:
    """`cache_key` with the grader version and options fixed: decision_key -> digest.

    The canonical JSON (see `cache_key`) is assembled from its parts, keys already in
    sorted order: everything after the decision key is encoded here, once, so build
    one keyer per batch rather than calling `cache_key` per item.
    """
    tail = _utf8(
        f',"grader_version":{_dumps(grader_version)},'
        f'"options":{_dumps(options.to_dict())}}}'
    )
    encode_str = _CANONICAL_JSON.encode
    sha256 = hashlib.sha256

    def key_of(decision_key: str) -> str:
        text = encode_str(decision_key).encode("utf-8", "surrogatepass")  # as _utf8()
        return sha256(_KEY_HEAD + text + tail).hexdigest()

    return key_of


def cache_key(grader_version: str, options: GradeOptions, decision_key: str) -> str:
    """sha256 hex digest of the canonical JSON of everything that decides a verdict.

    The canonical JSON is `json.dumps({"decision_key", "grader_version", "options":
    options.to_dict()}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`,
    encoded as UTF-8 with lone surrogates passed through. For many keys with the same
    version and options, use `cache_keyer()` (same digests, options encoded once).
    """
    return cache_keyer(grader_version, options)(decision_key)


def cache_entry(verdict: Verdict) -> dict[str, Any]:
    """The stored form of a verdict: its answer-dependent fields only."""
    if verdict.status in TRANSIENT_STATUSES:
        raise ValueError(f"transient verdict {verdict.status} must not be cached")
    full = verdict.to_dict()
    entry = {name: full[name] for name in ANSWER_FIELDS}
    if verdict.kind != "math":
        entry[_CODE_PART] = {name: full[name] for name in _CODE_PART_FIELDS}
    return entry


def code_verdict_from_entry(entry: Mapping[str, Any], cached: bool) -> Verdict | None:
    """The whole verdict of a code item's entry (None: the entry is a math one, or
    its code part does not read as a verdict: a miss)."""
    code = entry.get(_CODE_PART)
    if not isinstance(code, dict):
        return None
    fields = {name: entry[name] for name in ANSWER_FIELDS}
    fields.update(code)
    fields["cached"] = cached
    try:
        return Verdict.from_dict(fields)
    except (KeyError, TypeError, ValueError):
        return None


def _valid_entry(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    keys = entry.keys()
    if keys != _ANSWER_FIELD_SET and not (
        keys == _CODE_ENTRY_SET and isinstance(entry[_CODE_PART], dict)
    ):
        return False
    if not isinstance(entry["correct"], bool):
        return False
    status, method = entry["status"], entry["verify_method"]
    if not (isinstance(status, str) and status in _STATUS_VALUES):
        return False
    if not (isinstance(method, str) and method in VERIFY_METHOD_BY_VALUE):
        return False
    optional_strs = (entry["canonical_pred"], entry["canonical_gold"])
    if not all(value is None or isinstance(value, str) for value in optional_strs):
        return False
    return isinstance(entry["reason"], str) and isinstance(entry["grader_version"], str)


def _decode_entry(raw: bytes | str | None) -> dict[str, Any] | None:
    """A stored entry, or None when missing or malformed (treated as a miss)."""
    if raw is None:
        return None
    try:
        entry = orjson.loads(raw)  # several times faster than json.loads
    except orjson.JSONDecodeError:
        try:  # what orjson refuses and the stdlib reads: an escaped lone surrogate
            entry = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        except (UnicodeDecodeError, ValueError):
            return None
    return entry if _valid_entry(entry) else None


def verdict_from_entry(
    entry: Mapping[str, Any], own: OwnFields, cached: bool
) -> Verdict:
    """The verdict of a response whose answer has `entry` (a valid one, as
    `get_many` returns; an unknown status or verify method raises KeyError): the
    entry's answer fields, the response's `own` ones.

    One construction (`build_verdict`), once per cache hit: not a verdict built
    from the entry and then `replace`d.
    """
    return build_verdict(
        entry["correct"],
        STATUS_BY_VALUE[entry["status"]],
        own.format_valid,
        own.extracted,
        own.extraction_method,
        entry["canonical_pred"],
        entry["canonical_gold"],
        VERIFY_METHOD_BY_VALUE[entry["verify_method"]],
        entry["reason"],
        entry["grader_version"],
        cached,
    )


def _encode_entry(entry: Mapping[str, Any]) -> str:
    return _ENTRY_JSON.encode(entry)


class CacheBackend(Protocol):
    """A store of cache entries keyed by `cache_key()` digests."""

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Entries found (missing and malformed ones are left out)."""
        ...

    def set_many(self, entries: Mapping[str, dict[str, Any]]) -> None:
        """Store entries (digest -> `cache_entry()`)."""
        ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    expires_at REAL NOT NULL
)
"""
# Purging walks entries by age, so it needs them ordered by expiry.
_INDEX = "CREATE INDEX IF NOT EXISTS results_expires_at ON results (expires_at)"


# A purge runs once this share of `max_bytes` has been stored since the last, and
# leaves the rows in at most this fraction of it.
_PURGE_SHARE = 8
_PURGE_TO = 0.9


class SqliteResultCache:
    """Results in a local SQLite file (WAL; several processes may read and write).

    Each process opens its own connection lazily (a connection must not cross a fork).

    Bounded by age and size, as it runs: after every `purge_every` rows it stores
    (or an eighth of `max_bytes`), a process deletes the expired rows and, past
    `max_rows` rows or `max_bytes` of pages, the oldest ones (an answer row is about
    470 bytes, a line-mode unit's some 8 KB; the default bound is 2 GiB of disk).

    With `write_behind_rows` > 1, stored rows are held in memory (and found by
    lookups) until that many are pending (or `write_behind_bytes` of their text),
    then written in one transaction: a commit
    rewrites every B-tree page its rows touch, and the keys are random, so 64-row
    commits cost some 15-20 us a row against 5 for 2,048-row ones (measured on the
    2-core CI machine). A process killed before `flush`/`close` loses those rows
    only: they are graded again on the next run.

    Raises:
        CacheError: on any SQLite error.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        ttl_s: float = 30 * 86_400,
        max_rows: int = 1_000_000,
        max_bytes: int = 2 << 30,
        purge_every: int = 10_000,
        busy_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        write_behind_rows: int = 1,
        write_behind_bytes: int = 1 << 62,
    ) -> None:
        bounds = (max_rows, max_bytes, purge_every, write_behind_rows)
        if min(*bounds, write_behind_bytes) < 1:
            raise ValueError(
                "max_rows, max_bytes, purge_every, write_behind_rows and "
                "write_behind_bytes must be >= 1"
            )
        self._path = Path(path)
        self._ttl_s = ttl_s
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._purge_every = purge_every
        self._stored_since_purge = 0
        self._bytes_since_purge = 0
        self._busy_timeout_s = busy_timeout_s
        self._clock = clock
        self._write_behind_rows = write_behind_rows
        self._write_behind_bytes = write_behind_bytes
        self._pending: dict[str, str] = {}
        self._pending_bytes = 0  # of the values set since the last flush
        self._conn: sqlite3.Connection | None = None
        self._conn_pid = -1

    @property
    def pending_rows(self) -> int:
        """Rows set but not yet written (`write_behind_rows`)."""
        return len(self._pending)

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for key, raw in self.get_values(keys).items():
            entry = _decode_entry(raw)
            if entry is not None:
                found[key] = entry
        return found

    def set_many(self, entries: Mapping[str, dict[str, Any]]) -> None:
        self.set_values({key: _encode_entry(entry) for key, entry in entries.items()})

    def get_values(self, keys: Sequence[str]) -> dict[str, str]:
        """The stored text of each unexpired key found (written-behind ones too)."""
        found: dict[str, str] = {}
        pending = self._pending
        if pending:
            found = {key: pending[key] for key in keys if key in pending}
            keys = [key for key in keys if key not in found]
        now = self._clock()
        with self._errors("lookup"):
            conn = self._connection()
            for start in range(0, len(keys), _SQLITE_CHUNK):
                chunk = list(keys[start : start + _SQLITE_CHUNK])
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT key, value FROM results WHERE key IN ({marks})"
                    " AND expires_at > ?",
                    [*chunk, now],
                ).fetchall()
                found.update(rows)
        return found

    def set_values(self, values: Mapping[str, str]) -> None:
        """Store text by key: at once, or with `write_behind_rows`, once that many
        are pending, or `write_behind_bytes` of them (and on `flush` and `close`)."""
        self._pending.update(values)
        self._pending_bytes += sum(len(value) for value in values.values())
        if (
            len(self._pending) >= self._write_behind_rows
            or self._pending_bytes >= self._write_behind_bytes
        ):
            self.flush()

    def flush(self) -> None:
        """Write the pending rows in one transaction."""
        if not self._pending:
            return
        expires_at = self._clock() + self._ttl_s
        rows = [(key, value, expires_at) for key, value in self._pending.items()]
        self._pending, self._pending_bytes = {}, 0
        with self._errors("store"):
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT OR REPLACE INTO results (key, value, expires_at)"
                    " VALUES (?, ?, ?)",
                    rows,
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        self._stored_since_purge += len(rows)
        self._bytes_since_purge += sum(len(value) for _k, value, _e in rows)
        if (
            self._stored_since_purge >= self._purge_every
            or self._bytes_since_purge >= self._max_bytes // _PURGE_SHARE
        ):
            self.purge()

    def purge_expired(self) -> int:
        """Delete expired rows; returns how many."""
        with self._errors("purge"):
            cursor = self._connection().execute(
                "DELETE FROM results WHERE expires_at <= ?", (self._clock(),)
            )
            return cursor.rowcount

    def purge(self) -> int:
        """Delete expired rows, then the oldest beyond `max_rows` or beyond what
        fits in `max_bytes` (a unit of the CLI's line mode is one row of some 8 KB:
        rows alone would not bound the file); returns how many."""
        self._stored_since_purge = self._bytes_since_purge = 0
        deleted = self.purge_expired()
        with self._errors("purge"):
            conn = self._connection()
            (rows,) = conn.execute("SELECT COUNT(*) FROM results").fetchone()
            excess = rows - self._max_rows
            used_bytes = self._used_bytes(conn)
            if used_bytes > self._max_bytes and rows:
                # Rows are of one size or two (answers, units): delete the oldest
                # share that brings the file under the bound, with room to spare.
                keep = rows * (self._max_bytes * _PURGE_TO) // used_bytes
                excess = max(excess, rows - int(keep))
            if excess > 0:
                cursor = conn.execute(
                    "DELETE FROM results WHERE key IN (SELECT key FROM results"
                    " ORDER BY expires_at LIMIT ?)",
                    (excess,),
                )
                deleted += cursor.rowcount
        return deleted

    @staticmethod
    def _used_bytes(conn: sqlite3.Connection) -> int:
        """Bytes of the file's pages in use (freed pages are reused, not returned)."""
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (free,) = conn.execute("PRAGMA freelist_count").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
        return int((pages - free) * size)

    def checkpoint(self) -> None:
        """Copy the write-ahead log into the database file now, as far as no other
        connection is in the way (PASSIVE: never waits). The last connection to
        close does it otherwise, with the database's fsync, while its process's
        parent waits for it to exit (issue 11: 12 ms of a 2.5 s run's tail)."""
        if self._conn is None or self._conn_pid != os.getpid():
            return  # nothing written by this process
        with self._errors("checkpoint"):
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def close(self) -> None:
        """Write what is pending, then close (a failed write is logged: it only
        costs those rows' grading on a later run)."""
        pending = len(self._pending)
        try:
            self.flush()
        except CacheError as exc:
            log.warning("result cache: %d pending rows not stored: %s", pending, exc)
        finally:
            self._pending = {}
            if self._conn is not None and self._conn_pid == os.getpid():
                self._conn.close()
            self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._conn_pid != os.getpid():
            self._path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self._path, timeout=self._busy_timeout_s, isolation_level=None
            )
            try:
                self._set_up(conn)
            except BaseException:
                conn.close()
                raise
            self._conn, self._conn_pid = conn, os.getpid()
        return self._conn

    def _set_up(self, conn: sqlite3.Connection) -> None:
        """WAL mode and the table, retried: when several processes open a new file at
        once, switching it to WAL can fail with "locked" without waiting for the busy
        timeout (measured: 4 failures in 15 runs of 4 openers).
        """
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                conn.execute("PRAGMA synchronous=NORMAL")
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(_SCHEMA)
                conn.execute(_INDEX)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            raise CacheError(
                f"sqlite cache {action} at {self._path} failed: {exc}"
            ) from exc
