"""The exact-response layer: whole verdicts by (response, gold), and the re-grade that
reads them without starting the pool."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from producer.client.grader import open_grader
from producer.settings import ProducerSettings
from workers import verifier
from workers.cache.exact import ExactLayer, exact_keyer
from workers.cache.results import SqliteResultCache
from workers.models import GradeOptions, Rollout, Status

OPTIONS = GradeOptions()


def test_exact_keys_separate_texts_options_and_versions() -> None:
    key_of = exact_keyer("v1", OPTIONS)
    keys = {
        key_of("ab", "c"),
        key_of("a", "bc"),  # the same bytes, cut elsewhere
        key_of("ab", "c\ud800"),  # a lone surrogate hashes, not raises
        exact_keyer("v2", OPTIONS)("ab", "c"),
        exact_keyer("v1", GradeOptions(allow_fallback=False))("ab", "c"),
    }
    assert len(keys) == 5
    assert key_of("ab", "c") == exact_keyer("v1", GradeOptions())("ab", "c")


def test_unit_keys_hashed_in_two_threads_keep_their_order() -> None:
    layer = ExactLayer(None, "v1")  # type: ignore[arg-type]  # keys need no cache
    units = [({"numbers": [n]}, b"%d\n" % n * 3000) for n in range(41)]
    keys = layer.unit_keys(units)
    assert keys == [layer.unit_key(unit, body) for unit, body in units]
    assert len(set(keys)) == 41
    assert layer.unit_keys(units[:3]) == keys[:3]


def test_exact_layer_round_trip_keeps_every_field(tmp_path: Path) -> None:
    cache = SqliteResultCache(tmp_path / "c.sqlite3")
    layer = ExactLayer(cache, verifier.GRADER_VERSION)
    pairs = [("so \\boxed{\\frac{1}{2}}", "0.5"), ("the answer is 7", "8")]
    verdicts = [verifier.grade(r, g) for r, g in pairs]
    assert layer.lookup(pairs, OPTIONS) == [None, None]
    layer.store(pairs, verdicts, OPTIONS)
    found = layer.lookup([*pairs, ("unseen", "1")], OPTIONS)
    assert found == [dataclasses.replace(v, cached=True) for v in verdicts] + [None]
    assert layer.lookup(pairs, GradeOptions(allow_fallback=False)) == [None, None]
    cache.close()


def test_exact_layer_never_stores_transient_verdicts(tmp_path: Path) -> None:
    cache = SqliteResultCache(tmp_path / "c.sqlite3")
    layer = ExactLayer(cache, verifier.GRADER_VERSION)
    timeout = dataclasses.replace(
        verifier.grade("\\boxed{1}", "1"), status=Status.TIMEOUT, correct=False
    )
    layer.store([("\\boxed{1}", "1")], [timeout], OPTIONS)
    assert layer.lookup([("\\boxed{1}", "1")], OPTIONS) == [None]
    cache.close()


def test_write_behind_rows_are_found_before_and_stored_at_close(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.sqlite3"
    cache = SqliteResultCache(path, write_behind_rows=100)
    cache.set_values({"k1": "v1"})
    assert cache.get_values(["k1", "k2"]) == {"k1": "v1"}  # pending, not written
    assert SqliteResultCache(path).get_values(["k1"]) == {}
    cache.close()
    assert SqliteResultCache(path).get_values(["k1"]) == {"k1": "v1"}


def test_write_behind_rows_are_written_once_they_hold_enough_bytes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.sqlite3"
    cache = SqliteResultCache(path, write_behind_rows=100, write_behind_bytes=1000)
    reader = SqliteResultCache(path)
    cache.set_values({"k1": "x" * 600})
    assert reader.get_values(["k1"]) == {}  # 600 bytes pending, under the bound
    cache.set_values({"k2": "y" * 600})
    assert reader.get_values(["k1", "k2"]) == {"k1": "x" * 600, "k2": "y" * 600}
    cache.set_values({"k3": "z" * 600})  # counted afresh after the write
    assert reader.get_values(["k3"]) == {}
    cache.close()
    reader.close()


def test_regrade_reads_whole_verdicts_without_starting_the_pool(
    tmp_path: Path,
) -> None:
    # Given rollouts graded once with the cache on
    rollouts = [Rollout(f"so \\boxed{{{n}}}", str(n % 3)) for n in range(30)]
    settings = ProducerSettings(processes=2, cache_dir=tmp_path / "cache")
    with open_grader(None, settings=settings) as grader:
        first = grader.grade(rollouts)
    # When they are graded again, one of them changed
    changed = [*rollouts[:-1], Rollout("so \\boxed{2}", "5")]
    with open_grader(None, settings=settings) as grader:
        again = grader.grade(changed[:-1])
        pool = grader._pool  # type: ignore[attr-defined]
        last = grader.grade(changed[-1:])
    # Then the same verdicts come back from the cache, no pool process started for
    # them, and the changed one is graded
    assert again == [dataclasses.replace(v, cached=True) for v in first[:-1]]
    assert pool is None
    assert last == [verifier.grade("so \\boxed{2}", "5")]
