"""The exact-response layer of the embedded cache: whole verdicts by raw text.

The answer layer (`workers.cache.results.cache_key`) keys a verdict by what the verifier
extracted, so every lookup needs the response prepared first. This layer keys whole
verdicts by the raw texts, so a file graded before is answered without extracting:

- per rollout, (response, gold) -> verdict: for `Grader.grade` callers (the CLI
  in item mode, the service's embedded backend), looked up before the pool;
- per unit of the CLI's line mode (`workers.lines.units`), a hash of the unit's lines,
  numbers, fields and options -> its rows' verdicts: one row per 64 rollouts,
  stored by the pool worker that graded the unit, looked up by the CLI, which
  renders a stored unit from its input lines without starting the pool (after
  a chunk with a unit it lacked, by the pool's workers, which render it).

Worth its space for eval re-runs, measured (`tests/bench/bench_overhead.py`, 60,760
rollouts, 2 cores, issue 11): per rollout, a row cost the cold run some 15 us a
rollout (hash, lookup, one SQLite insert each) and the file 491 bytes a rollout with
the answer layer; per unit, 132 bytes a rollout, the cold run 0.94-0.97x of one
without the cache run beside it (`tests/bench/bench_cache_phases.py` says where:
a worker's CPU +55 ms, ~15 of it unit keys, ~30 held rows; a worker hashes each
unit, ~36 us, looks up only some (`workers.embedded.pool._Probes`), builds its row's
text after the reply, ~15 us, and writes it while it would idle, ~60 us with the
checkpoint: ~4.5% more CPU in all, which on two busy cores is the time lost;
hashing while idle too measured no faster), and a re-graded file 3.1-3.2x faster
than its cold run. Storing a unit's
output lines instead (1 KB a rollout) made re-grades 5x but cost the cold run 12 us
a rollout in JSON escaping and SQLite writes (0.85x): not worth it. Kept to the
embedded cache: on a fleet the rows would go to the Redis that also carries the
broker's queues.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from workers.cache.results import SqliteResultCache
from workers.code.item import CODE_GOLD_PREFIX
from workers.code.version import CODE_GRADER_VERSION
from workers.jsontext import json_text
from workers.models import GradeOptions, Verdict, is_final

__all__ = ["ExactLayer", "exact_keyer", "stored_unit", "unit_text"]

# Domain separation: no exact key can equal an answer-layer key (whose hashed JSON
# starts with '{"decision_key":').
_EXACT_HEAD = b"gradefleet exact v1\x00"
_UNIT_HEAD = b"gradefleet unit v1\x00"
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
# Units from which `ExactLayer.unit_keys` hashes in two threads (for fewer, starting
# the thread costs about what it saves).
_THREADED_UNIT_KEYS = 16


def exact_keyer(
    grader_version: str, options: GradeOptions
) -> Callable[[str, str], str]:
    """(response, gold) -> sha256 hex digest, grader version and options fixed.

    A code item (its gold is encoded tests, `workers.code.item`) is keyed under the
    code grader's version as well: a new code grader misses its old verdicts."""
    head = _EXACT_HEAD + _CANONICAL_JSON.encode(
        [grader_version, options.to_dict()]
    ).encode("ascii")
    code_head = _EXACT_HEAD + _CANONICAL_JSON.encode(
        [grader_version, CODE_GRADER_VERSION, options.to_dict()]
    ).encode("ascii")
    sha256 = hashlib.sha256

    def key_of(response: str, gold: str) -> str:
        # surrogatepass: model text may carry lone surrogates; they must hash.
        text = response.encode("utf-8", "surrogatepass")
        digest = sha256(code_head if gold.startswith(CODE_GOLD_PREFIX) else head)
        digest.update(b"%d\x00" % len(text))  # where the response ends
        digest.update(text)
        digest.update(gold.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    return key_of


def _stored(verdict: Verdict) -> str:
    fields = verdict.to_dict()
    del fields["cached"]
    return json_text(fields)


def _json_value(raw: str | bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw)  # an escaped lone surrogate (see `json_text`)
        except ValueError:
            return None


def unit_text(stored: Any) -> str:
    """What `ExactLayer.store_units` keeps for a unit, from JSON for it (its rows'
    verdicts: the CLI renders them again); `stored_unit` reads it back."""
    return json_text({"unit": stored})


def stored_unit(raw: str | bytes) -> Any:
    """What `ExactLayer.store_units` kept, from its stored text; None if malformed."""
    stored = _json_value(raw)
    return stored.get("unit") if isinstance(stored, dict) else None


def _verdict(raw: str) -> Verdict | None:
    """The verdict of a stored value (cached=True); None when malformed or transient."""
    fields = _json_value(raw)
    if not isinstance(fields, dict):
        return None
    fields["cached"] = True
    try:
        verdict = Verdict.from_dict(fields)
    except (KeyError, TypeError, ValueError):
        return None
    return verdict if is_final(verdict) else None


class ExactLayer:
    """Whole verdicts by (response, gold) in a `SqliteResultCache` file (the same
    table as the answer layer; keys cannot collide, see `_EXACT_HEAD`)."""

    def __init__(self, cache: SqliteResultCache, grader_version: str) -> None:
        self._cache = cache
        self._grader_version = grader_version
        self._keyers: dict[GradeOptions, Callable[[str, str], str]] = {}

    def _key_of(self, options: GradeOptions) -> Callable[[str, str], str]:
        keyer = self._keyers.get(options)
        if keyer is None:
            keyer = self._keyers[options] = exact_keyer(self._grader_version, options)
        return keyer

    def lookup(
        self, pairs: Sequence[tuple[str, str]], options: GradeOptions
    ) -> list[Verdict | None]:
        """The stored verdict of each (response, gold) pair, None where there is none.

        Raises:
            CacheError: the lookup failed.
        """
        key_of = self._key_of(options)
        keys = [key_of(response, gold) for response, gold in pairs]
        found = self._cache.get_values(keys)
        verdicts: list[Verdict | None] = []
        for key in keys:
            raw = found.get(key)
            verdicts.append(None if raw is None else _verdict(raw))
        return verdicts

    def store(
        self,
        pairs: Sequence[tuple[str, str]],
        verdicts: Sequence[Verdict],
        options: GradeOptions,
    ) -> None:
        """Store the final verdicts (transient ones are left out).

        Raises:
            CacheError: the store failed.
        """
        key_of = self._key_of(options)
        values = {
            key_of(response, gold): _stored(verdict)
            for (response, gold), verdict in zip(pairs, verdicts, strict=True)
            if is_final(verdict)
        }
        if values:
            self._cache.set_values(values)

    def unit_key(self, unit: Any, body: bytes) -> str:
        """The key of a whole unit of the embedded pool's line mode: its JSON (line
        numbers, field names, options) and its bytes (the lines), under this grader
        version and the code grader's (a unit's lines may hold code rows)."""
        digest = hashlib.sha256(_UNIT_HEAD)
        digest.update(self._grader_version.encode() + b"\x00")
        digest.update(CODE_GRADER_VERSION.encode() + b"\x00")
        digest.update(orjson.dumps(unit, option=orjson.OPT_SORT_KEYS) + b"\x00")
        digest.update(body)
        return digest.hexdigest()

    def unit_keys(self, units: Sequence[tuple[Any, bytes]]) -> list[str]:
        """`unit_key` of each (unit, body), half of them hashed in a second thread:
        sha256 lets go of the GIL on a unit's bytes, and the CLI hashes a chunk's
        units while the pool's cores wait for them (issue 11: 8.8 -> 5.5 ms for a
        20,000-line chunk's 313 units; the whole file's 31 ms was a cold run's
        largest cost of the cache)."""

        def keys_of(some: Sequence[tuple[Any, bytes]]) -> list[str]:
            return [self.unit_key(unit, body) for unit, body in some]

        if len(units) < _THREADED_UNIT_KEYS:
            return keys_of(units)
        half = len(units) // 2
        with ThreadPoolExecutor(1) as helper:  # joined here: no thread at a fork
            second = helper.submit(keys_of, units[half:])
            return keys_of(units[:half]) + second.result()

    def lookup_units(self, keys: Sequence[str]) -> dict[str, str]:
        """The stored text of each unit key found, undecoded (`stored_unit` reads
        it; the CLI hands it to the process that renders the unit as it is).

        Raises:
            CacheError: the lookup failed.
        """
        return self._cache.get_values(list(dict.fromkeys(keys)))

    def store_units(self, texts: Mapping[str, str]) -> None:
        """Store units' `unit_text` by unit key.

        Raises:
            CacheError: the store failed.
        """
        self._cache.set_values(texts)
