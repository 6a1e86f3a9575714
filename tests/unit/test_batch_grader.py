"""BatchGrader with a real sandbox child and real caches (SQLite, unreachable Redis)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.helpers import QWEN_FILE
from workers import verifier
from workers.cache.redis_store import RedisResultCache
from workers.cache.results import SqliteResultCache
from workers.embedded.batch import BatchGrader, DecisionMemo, GradeItem
from workers.errors import CacheError
from workers.models import GradeOptions, Status, Verdict
from workers.sandbox.process import Sandbox

OPTIONS = GradeOptions()
MIB = 1 << 20
# Set by a test before the sandbox forks; the child inherits it and logs each call.
CALL_LOG: str | None = None


def logging_grade(
    response: str, gold: str, *, options: GradeOptions | None = None
) -> Verdict:
    if CALL_LOG is not None:
        fd = os.open(CALL_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, b"x\n")
        os.close(fd)
    if response.startswith("hang"):
        time.sleep(60)
    return verifier.grade(response, gold, options=options)


def load_rollouts(limit: int) -> list[GradeItem]:
    items: list[GradeItem] = []
    with QWEN_FILE.open() as f:
        for line in f:
            record = json.loads(line)
            for response in record["code"]:
                items.append(GradeItem(len(items), response, record["gt"]))
    return items[:limit]


class RecordingObserver:
    def __init__(self) -> None:
        self.graded: list[tuple[Verdict, float]] = []
        self.lookups: list[tuple[int, int]] = []

    def item_graded(self, verdict: Verdict, duration_s: float) -> None:
        self.graded.append((verdict, duration_s))

    def cache_lookup(self, *, hits: int, misses: int) -> None:
        self.lookups.append((hits, misses))

    def sandbox_restarted(self, reason: str) -> None:
        pass


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(
        item_timeout_s=10.0, item_memory_bytes=512 * MIB, grade_fn=logging_grade
    ) as box:
        yield box


@pytest.fixture
def call_log(tmp_path: Path) -> Iterator[Path]:
    global CALL_LOG
    path = tmp_path / "calls.log"
    path.touch()
    CALL_LOG = str(path)
    yield path
    CALL_LOG = None


def calls(path: Path) -> int:
    return len(path.read_text().splitlines())


def without_cached_flag(
    verdicts: list[tuple[int, Verdict]],
) -> list[tuple[int, Verdict]]:
    return [(index, v.replace(cached=False)) for index, v in verdicts]


def test_batch_identical_with_cache_off_cold_and_warm(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    # Given ~300 real rollouts and their in-process verdicts
    items = load_rollouts(304)
    expected = [
        (it.index, verifier.grade(it.response, it.gold, options=OPTIONS))
        for it in items
    ]
    cache = SqliteResultCache(tmp_path / "cache.db")
    # When grading without cache, with a cold cache, then with the warm cache
    off = BatchGrader(sandbox=sandbox, cache=None).grade(items, OPTIONS)
    cold = BatchGrader(sandbox=sandbox, cache=cache).grade(items, OPTIONS)
    warm = BatchGrader(sandbox=sandbox, cache=cache).grade(items, OPTIONS)
    # Then every run equals in-process grading, except the `cached` flag
    assert off == expected
    assert cold == expected
    assert without_cached_flag(warm) == expected
    assert not any(v.cached for _, v in cold)
    cacheable = [
        verifier.prepare(it.response, it.gold, options=OPTIONS).decision_key is not None
        for it in items
    ]
    assert [v.cached for _, v in warm] == cacheable
    assert any(cacheable)


def test_batch_duplicates_graded_once(sandbox: Sandbox, call_log: Path) -> None:
    # Given 16 samples ending in the same boxed answer, with different reasoning
    items = [GradeItem(i, f"reasoning {i} ... \\boxed{{42}}", "42") for i in range(16)]
    items.append(GradeItem(99, "other \\boxed{41}", "42"))
    observer = RecordingObserver()
    results = BatchGrader(sandbox=sandbox, cache=None, observer=observer).grade(
        items, OPTIONS
    )
    # Then the sandbox graded two answers, and every item got its verdict in order
    assert calls(call_log) == 2
    assert [index for index, _ in results] == [*range(16), 99]
    assert [v.correct for _, v in results] == [True] * 16 + [False]
    assert len(observer.graded) == 17
    assert sum(1 for _, d in observer.graded if d > 0) == 2


def test_batch_cache_hits_skip_the_sandbox(
    sandbox: Sandbox, call_log: Path, tmp_path: Path
) -> None:
    cache = SqliteResultCache(tmp_path / "cache.db")
    items = [GradeItem(i, f"\\boxed{{{i % 3}}}", "1") for i in range(9)]
    observer = RecordingObserver()
    grader = BatchGrader(sandbox=sandbox, cache=cache, observer=observer)
    first = grader.grade(items, OPTIONS)
    second = grader.grade(items, OPTIONS)
    assert calls(call_log) == 3
    assert observer.lookups == [(0, 3), (3, 0)]
    assert without_cached_flag(second) == first
    assert all(v.cached for _, v in second)


def test_batch_per_response_fields_are_the_items_own(sandbox: Sandbox) -> None:
    items = [GradeItem(0, "\\boxed{7}", "7"), GradeItem(1, "text \\boxed{7} end", "7")]
    results = BatchGrader(sandbox=sandbox, cache=None).grade(items, OPTIONS)
    for item, (_, verdict) in zip(items, results, strict=True):
        assert verdict == verifier.grade(item.response, item.gold, options=OPTIONS)


def test_batch_uncacheable_items_each_go_to_the_sandbox(
    sandbox: Sandbox, call_log: Path, tmp_path: Path
) -> None:
    # Items without a decision key are graded one by one; keyed copies only once.
    items = [GradeItem(i, "no answer at all", "3") for i in range(4)]
    keyed = verifier.prepare("no answer at all", "3").decision_key is not None
    cache = SqliteResultCache(tmp_path / "cache.db")
    results = BatchGrader(sandbox=sandbox, cache=cache).grade(items, OPTIONS)
    assert calls(call_log) == (1 if keyed else 4)
    assert [v.status for _, v in results] == [Status.NO_ANSWER] * 4


def test_batch_transient_verdicts_are_not_cached(
    call_log: Path, tmp_path: Path
) -> None:
    cache = SqliteResultCache(tmp_path / "cache.db")
    items = [GradeItem(0, "\\boxed{1}", "1"), GradeItem(1, "hang", "1")]
    with Sandbox(
        item_timeout_s=0.3, item_memory_bytes=256 * MIB, grade_fn=logging_grade
    ) as box:
        grader = BatchGrader(sandbox=box, cache=cache)
        first = grader.grade(items, OPTIONS)
        second = grader.grade(items, OPTIONS)
    assert [v.status for _, v in first] == [Status.CORRECT, Status.TIMEOUT]
    assert [v.status for _, v in second] == [Status.CORRECT, Status.TIMEOUT]
    assert [v.cached for _, v in second] == [True, False]


def test_batch_cache_error_degrades_to_no_cache(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a Redis cache nobody listens to (port 1)
    client: redis.Redis[bytes] = redis.Redis(
        host="127.0.0.1",
        port=1,
        socket_connect_timeout=0.2,
        retry=Retry(NoBackoff(), 0),
    )
    items = [GradeItem(i, f"\\boxed{{{i}}}", "2") for i in range(4)]
    observer = RecordingObserver()
    grader = BatchGrader(
        sandbox=sandbox, cache=RedisResultCache(client), observer=observer
    )
    # When grading, Then the batch is graded anyway and the failure is logged
    results = grader.grade(items, OPTIONS)
    client.close()
    assert [v.correct for _, v in results] == [False, False, True, False]
    assert observer.lookups == []
    assert "cache lookup failed" in caplog.text
    assert "cache store failed" not in caplog.text  # not retried within the batch


class ReadOnlyCache:
    """A cache backend (the Protocol's seam) that reads fine but refuses writes."""

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {}

    def set_many(self, entries: Mapping[str, dict[str, Any]]) -> None:
        raise CacheError("read-only replica")


def test_batch_cache_store_error_keeps_the_verdicts(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    items = [GradeItem(i, f"\\boxed{{{i}}}", "1") for i in range(3)]
    results = BatchGrader(sandbox=sandbox, cache=ReadOnlyCache()).grade(items, OPTIONS)
    assert [v.correct for _, v in results] == [False, True, False]
    assert "cache store failed" in caplog.text


def test_batch_own_fields_copy_keeps_every_other_field() -> None:
    # Given a verdict with no default left in any field, and another response's prep
    from workers.embedded.batch import _with_own_fields
    from workers.models import ExtractionMethod, VerifyMethod

    verdict = Verdict(
        correct=True,
        status=Status.CORRECT,
        format_valid=True,
        extracted="2",
        extraction_method=ExtractionMethod.BOXED,
        canonical_pred="2",
        canonical_gold="2",
        verify_method=VerifyMethod.NUMERIC,
        reason="equal",
        grader_version="gv",
        cached=False,
    )
    own = verifier.prepare("The answer is: 2.0", "2")
    # When the per-response fields are swapped in
    copy = _with_own_fields(verdict, own, True)
    # Then it equals `replace` of exactly those fields (a new Verdict field would show)
    assert copy == verdict.replace(
        extracted=own.extracted,
        extraction_method=own.extraction_method,
        format_valid=own.format_valid,
        cached=True,
    )


def test_batch_extracts_each_response_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given real rollouts, a sandbox deciding with the verifier, and a parent process
    # in which preparing (extraction) would fail loudly
    items = load_rollouts(96)
    expected = [
        (it.index, verifier.grade(it.response, it.gold, options=OPTIONS))
        for it in items
    ]
    cache = SqliteResultCache(tmp_path / "cache.db")
    with Sandbox(item_timeout_s=10.0, item_memory_bytes=512 * MIB) as box:
        box.grade("\\boxed{1}", "1", OPTIONS)  # the child forks with the real prepare

        def no_prepare_here(*args: object, **kwargs: object) -> None:
            raise AssertionError("the parent prepared a response")

        monkeypatch.setattr(verifier, "prepare", no_prepare_here)
        # When grading without cache, cold and warm
        off = BatchGrader(sandbox=box, cache=None).grade(items, OPTIONS)
        cold = BatchGrader(sandbox=box, cache=cache).grade(items, OPTIONS)
        warm = BatchGrader(sandbox=box, cache=cache).grade(items, OPTIONS)
    # Then only the child prepared, and the verdicts are in-process grade()'s
    assert off == expected
    assert cold == expected
    assert without_cached_flag(warm) == expected
    assert any(v.cached for _, v in warm)


def test_batch_child_lost_mid_chunk_keeps_copies_and_cache(tmp_path: Path) -> None:
    # Given a chunk where the child aborts deciding one item, with copies of an
    # answer decided before the crash and of one decided after it
    from tests.hooks import ABORT, hooked_grade

    items = [
        GradeItem(0, "first \\boxed{7}", "7"),
        GradeItem(1, "x \\boxed{8}", "7"),
        GradeItem(2, f"\\boxed{{{ABORT}}}", "7"),
        GradeItem(3, "second \\boxed{7}", "7"),  # copy of 0
        GradeItem(4, "y \\boxed{9}", "9"),
        GradeItem(5, "z \\boxed{8}", "7"),  # copy of 1
        GradeItem(6, "w \\boxed{9}", "9"),  # copy of 4, decided after the crash
    ]
    cache = SqliteResultCache(tmp_path / "cache.db")
    with Sandbox(
        item_timeout_s=10.0, item_memory_bytes=512 * MIB, grade_fn=hooked_grade
    ) as box:
        results = BatchGrader(sandbox=box, cache=cache).grade(items, OPTIONS)
        again = BatchGrader(sandbox=box, cache=cache).grade(items, OPTIONS)
    # Then the aborting item alone is an error; every other verdict is grade()'s
    assert results[2][1].status is Status.ERROR
    assert "SIGABRT" in results[2][1].reason
    for (index, verdict), item in zip(results, items, strict=True):
        if index != 2:
            assert verdict == verifier.grade(item.response, item.gold, options=OPTIONS)
    # And the second run reads every decided answer from the cache
    assert [v.cached for _, v in again] == [True, True, False, True, True, True, True]


class CountingCache:
    """A real SQLite cache that counts the writes it is asked for."""

    def __init__(self, path: Path) -> None:
        self.inner = SqliteResultCache(path)
        self.writes: list[int] = []

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        return self.inner.get_many(keys)

    def set_many(self, entries: Mapping[str, dict[str, Any]]) -> None:
        self.writes.append(len(entries))
        self.inner.set_many(entries)


def test_batch_held_stores_are_found_then_written_once(
    sandbox: Sandbox, call_log: Path, tmp_path: Path
) -> None:
    # Given a grader that holds its stores (a fleet task's chunks)
    cache = CountingCache(tmp_path / "cache.db")
    observer = RecordingObserver()
    grader = BatchGrader(
        sandbox=sandbox, cache=cache, observer=observer, hold_stores=True
    )
    first = [GradeItem(i, f"\\boxed{{{i}}}", "1") for i in range(3)]
    second = [GradeItem(10 + i, f"so \\boxed{{{i}}}", "1") for i in range(5)]
    # When two chunks are graded, the second repeating the first's answers
    graded = grader.grade(first, OPTIONS) + grader.grade(second, OPTIONS)
    # Then each answer was decided once, the repeats found among the held entries
    # (as if stored), and nothing was written yet
    assert calls(call_log) == 5
    assert observer.lookups == [(0, 3), (3, 2)]
    assert [v.cached for _, v in graded] == [False] * 3 + [True] * 3 + [False] * 2
    assert cache.writes == []
    expected = [verifier.grade(it.response, it.gold) for it in first + second]
    assert [v.replace(cached=False) for _, v in graded] == expected
    # And a flush writes all five in one call, for the next grader to find
    grader.flush_stores()
    grader.flush_stores()  # nothing held: nothing written
    assert cache.writes == [5]
    again = BatchGrader(sandbox=sandbox, cache=cache).grade(second, OPTIONS)
    assert all(v.cached for _, v in again)
    assert calls(call_log) == 5


def test_batch_held_store_error_is_logged_on_flush(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    grader = BatchGrader(sandbox=sandbox, cache=ReadOnlyCache(), hold_stores=True)
    items = [GradeItem(i, f"\\boxed{{{i}}}", "1") for i in range(3)]
    results = grader.grade(items, OPTIONS)
    assert "cache store failed" not in caplog.text
    grader.flush_stores()
    assert [v.correct for _, v in results] == [False, True, False]
    assert "cache store failed" in caplog.text


def test_batch_memo_decides_an_answer_once_across_batches(
    sandbox: Sandbox, call_log: Path
) -> None:
    # Given two batches whose samples reach the same answers, with other reasoning
    first = [GradeItem(i, f"try {i}: \\boxed{{{42 - i % 2}}}", "42") for i in range(4)]
    second = [
        GradeItem(10, "again \\boxed{42}", "42"),
        GradeItem(11, "so $\\boxed{7}$", "42"),
        GradeItem(12, "or \\boxed{41}", "42"),
    ]
    # When one grader with a memo grades both
    grader = BatchGrader(sandbox=sandbox, cache=None, memo=DecisionMemo())
    graded = grader.grade(first, OPTIONS) + grader.grade(second, OPTIONS)
    # Then only the new answer of the second batch was decided, and every verdict
    # is in-process grade()'s, each with its own extraction and `cached` false
    assert calls(call_log) == 3
    expected = [verifier.grade(it.response, it.gold) for it in first + second]
    assert [v for _, v in graded] == expected
    # And without a memo, the second batch decides its answers again
    BatchGrader(sandbox=sandbox, cache=None).grade(second, OPTIONS)
    assert calls(call_log) == 6


def test_batch_memo_keeps_each_options_decisions_apart(
    sandbox: Sandbox, call_log: Path
) -> None:
    # Given an answer found by a fallback, credited only when fallbacks count
    items = [GradeItem(0, "after all that, the result is 12", "12")]
    strict = GradeOptions(allow_fallback=False)
    grader = BatchGrader(sandbox=sandbox, cache=None, memo=DecisionMemo())
    # When the same memo serves both options
    lenient = grader.grade(items, OPTIONS)
    strictly = grader.grade(items, strict)
    # Then each options decided it, and each verdict is grade()'s under them
    assert calls(call_log) == 2
    assert lenient == [(0, verifier.grade(items[0].response, "12", options=OPTIONS))]
    assert strictly == [(0, verifier.grade(items[0].response, "12", options=strict))]
    assert lenient[0][1].correct != strictly[0][1].correct


def test_batch_memo_forgets_no_timeout(call_log: Path) -> None:
    # Given a keyed answer whose deciding hangs past the item deadline
    items = [GradeItem(0, "hang \\boxed{5}", "5")]
    assert verifier.prepare(items[0].response, "5").decision_key is not None
    with Sandbox(
        item_timeout_s=0.3, item_memory_bytes=256 * MIB, grade_fn=logging_grade
    ) as box:
        grader = BatchGrader(sandbox=box, cache=None, memo=DecisionMemo())
        first = grader.grade(items, OPTIONS)
        second = grader.grade(items, OPTIONS)
    # Then the second batch decided it again: a timeout is the load's, not the answer's
    assert calls(call_log) == 2
    assert [v.status for _, v in first + second] == [Status.TIMEOUT] * 2


def test_decision_memo_starts_over_once_full() -> None:
    verdict = verifier.grade("\\boxed{1}", "1")
    approximate = GradeOptions(approximate=True)
    memo = DecisionMemo(max_entries=3, max_chars=1_000)
    # Entries bound it: a table of an options counts as one, each answer as one
    for key in ("a", "b", "c"):
        memo.remember(OPTIONS, key, verdict)
    assert memo.answers(OPTIONS) == {"c": verdict}
    # Characters bound it too (key and extracted text): a long key fills it at once
    memo.remember(OPTIONS, "k" * 999, verdict)
    memo.remember(approximate, "d", verdict)
    assert memo.answers(approximate) == {"d": verdict}
    assert memo.answers(OPTIONS) == {}
    # And options a service's callers choose cannot grow it past the bound
    for k in range(50):
        memo.answers(GradeOptions(rel_tol=1e-6 * (k + 1)))
        assert memo.entries <= 3
