"""LocalPool (embedded mode) with real worker processes, sandboxes and SQLite."""

from __future__ import annotations

import functools
import random
import sqlite3
import time
from pathlib import Path

import pytest

from tests.helpers import (
    gsm8k_groups,
    hostile_grade,
    kill_when_marked,
    misbehave_while_prepared,
    qwen_groups,
)
from workers import verifier
from workers.cache.exact import ExactLayer
from workers.cache.results import SqliteResultCache
from workers.embedded.batch import GradeItem
from workers.embedded.pool import LocalPool
from workers.errors import SandboxError
from workers.models import GradeOptions, Status

OPTIONS = GradeOptions()
MIB = 1 << 20


def real_rollouts() -> list[GradeItem]:
    """Qwen2.5-Math outputs (800) and 200 GSM8K ones (the 6B models' columns)."""
    groups = qwen_groups() + [group[:2] for group in gsm8k_groups()[:100]]
    rollouts = [rollout for group in groups for rollout in group]
    return [GradeItem(i, r.response, r.gold) for i, r in enumerate(rollouts)]


def make_pool(**kw: object) -> LocalPool:
    args: dict[str, object] = {
        "processes": 2,
        "item_timeout_s": 5.0,
        "item_memory_bytes": 512 * MIB,
        "cache_path": None,
        "grade_fn": hostile_grade,
    }
    args.update(kw)
    return LocalPool(**args)  # type: ignore[arg-type]


def test_local_pool_keeps_order_of_2000_items() -> None:
    items = [GradeItem(i, f"\\boxed{{{i}}}", str(i - i % 2)) for i in range(2000)]
    progress: list[int] = []
    with make_pool(batch_size=64) as pool:
        verdicts = pool.grade(items, OPTIONS, on_progress=progress.append)
    assert [v.extracted for v in verdicts] == [str(i) for i in range(2000)]
    assert [v.correct for v in verdicts] == [i % 2 == 0 for i in range(2000)]
    assert progress == sorted(progress)
    assert progress[-1] == 2000
    assert 1 < len(progress) <= 32  # at most one call per batch


def test_local_pool_equals_in_process_grading_on_real_data() -> None:
    items = real_rollouts()
    expected = [verifier.grade(it.response, it.gold, options=OPTIONS) for it in items]
    with make_pool(grade_fn=None, batch_size=50) as pool:
        assert pool.grade(items, OPTIONS) == expected


def test_local_pool_answers_repeated_across_batches_grade_as_in_process() -> None:
    # Given real rollouts shuffled, so a prompt's samples (which mostly reach the
    # same answers) fall in different small batches of one worker, whose memo of
    # decided answers (`DecisionMemo`) then answers most of them
    items = real_rollouts()
    random.Random(5).shuffle(items)
    items = [GradeItem(i, it.response, it.gold) for i, it in enumerate(items)]
    expected = [verifier.grade(it.response, it.gold, options=OPTIONS) for it in items]
    # When one worker grades them in batches of 16
    with make_pool(grade_fn=None, processes=1, batch_size=16) as pool:
        graded = pool.grade(items, OPTIONS)
    # Then each verdict is in-process grade()'s: own extraction, `cached` false
    assert graded == expected


def test_local_pool_hostile_item_times_out_and_neighbours_are_graded() -> None:
    items = [GradeItem(i, f"\\boxed{{{i}}}", str(i)) for i in range(20)]
    items[7] = GradeItem(7, "hang", "7")
    with make_pool(item_timeout_s=0.3, batch_size=10) as pool:
        verdicts = pool.grade(items, OPTIONS)
    assert verdicts[7].status is Status.TIMEOUT
    assert all(v.correct for i, v in enumerate(verdicts) if i != 7)


def test_local_pool_identical_with_cache_cold_and_warm(tmp_path: Path) -> None:
    items = real_rollouts()[:400]
    with make_pool(cache_path=None) as pool:
        uncached = pool.grade(items, OPTIONS)
    with make_pool(cache_path=tmp_path / "cache.db") as pool:
        cold = pool.grade(items, OPTIONS)
    with make_pool(cache_path=tmp_path / "cache.db", processes=1) as pool:
        warm = pool.grade(items, OPTIONS)
    # Workers share the file, so even a cold run may hit what the other one stored.
    assert [v.replace(cached=False) for v in cold] == uncached
    assert [v.replace(cached=False) for v in warm] == uncached
    assert not any(v.cached for v in uncached)
    assert sum(v.cached for v in warm) > 0


def test_local_pool_workers_write_their_cache_rows_once_idle(tmp_path: Path) -> None:
    # Given a pool whose workers hold their rows back (300 items: far under the
    # write-behind bounds), and a call that has returned
    items = real_rollouts()[:300]
    path = tmp_path / "cache.db"
    with make_pool(cache_path=path, grade_fn=None) as pool:
        graded = pool.grade(items, OPTIONS)
        # When nothing more comes for the workers, the rows are in the file while
        # the pool still runs (not only once it closes)
        reader = ExactLayer(SqliteResultCache(path), verifier.GRADER_VERSION)
        pairs = [(item.response, item.gold) for item in items]
        found = 0
        for _attempt in range(100):  # 5 s at most
            found = sum(v is not None for v in reader.lookup(pairs, OPTIONS))
            if found == len(items):
                break
            time.sleep(0.05)
        reader._cache.close()  # type: ignore[attr-defined]
    # Then every verdict is there, as graded
    assert found == len(items)
    assert len(graded) == len(items)


def test_local_pool_reruns_the_batch_of_a_dead_worker(tmp_path: Path) -> None:
    # Given an item that hangs the first time it is seen
    mark = tmp_path / "worker.pid"
    items = [GradeItem(i, f"\\boxed{{{i}}}", str(i)) for i in range(40)]
    items[25] = GradeItem(25, f"once:{mark}", "x")
    with make_pool(item_timeout_s=30.0, batch_size=10) as pool:
        # When the worker process running it is SIGKILLed mid-batch
        verdicts = kill_when_marked(mark, lambda: pool.grade(items, OPTIONS))
    # Then its batch is re-run elsewhere: nothing lost, nothing out of order
    assert [v.correct for v in verdicts] == [i != 25 for i in range(40)]
    assert verdicts[25].status is not Status.ERROR


def test_local_pool_item_killing_its_worker_every_time_ends_as_its_error() -> None:
    # Given an item whose grading process is SIGKILLed (as by the OOM killer) each
    # time it is on it: the death is not known to be the item's doing
    items = [GradeItem(i, f"\\boxed{{{i}}}", str(i)) for i in range(30)]
    items[12] = GradeItem(12, "kill-me", "x")
    with make_pool(batch_size=10, max_attempts=2) as pool:
        verdicts = pool.grade(items, OPTIONS)
        again = pool.grade(items[:10], OPTIONS)  # the pool still works afterwards
    # Then its batch is run again, and once the attempts are spent only the item the
    # worker was on is answered `error`; its neighbours are graded
    assert all(v.correct for i, v in enumerate(verdicts) if i != 12)
    assert verdicts[12].status is Status.ERROR
    assert "poison batch: its worker was lost 2 times" in verdicts[12].reason
    assert all(v.correct for v in again)


def test_local_pool_batch_queued_behind_a_lost_one_is_not_charged() -> None:
    # Given one worker, sent two batches at once, each with an item killing it
    items = [GradeItem(i, f"\\boxed{{{i}}}", str(i)) for i in range(20)]
    items[3] = GradeItem(3, "kill-me", "x")
    items[13] = GradeItem(13, "kill-me", "x")
    with make_pool(processes=1, batch_size=10, max_attempts=2) as pool:
        verdicts = pool.grade(items, OPTIONS)
        again = pool.grade(items[:3], OPTIONS)
    # Then each batch is charged only for the losses while it was being graded
    assert "its worker was lost 2 times" in verdicts[3].reason
    assert "its worker was lost 2 times" in verdicts[13].reason
    assert all(v.correct for i, v in enumerate(verdicts) if i not in (3, 13))
    assert all(v.correct for v in again)


@pytest.mark.parametrize(
    ("response", "status", "reason"),
    [
        ("hang", Status.TIMEOUT, "exceeded the 2 s item deadline"),
        ("alloc-at-once", Status.MEMORY_LIMIT, "MemoryError (RLIMIT_AS)"),
        ("alloc-slowly", Status.MEMORY_LIMIT, ""),
        ("abort", Status.ERROR, "sandbox child killed by SIGABRT"),
        ("segv", Status.ERROR, "sandbox child killed by SIGSEGV"),
        ("raise", Status.ERROR, "grader raised KeyError"),
    ],
)
def test_local_pool_hostile_item_is_answered_and_its_batch_graded(
    response: str, status: Status, reason: str
) -> None:
    # Given a batch with one item that hangs, bloats, crashes or raises
    items = [GradeItem(i, f"\\boxed{{{i}}}", str(i)) for i in range(12)]
    items[5] = GradeItem(5, response, "5")
    with make_pool(
        processes=1, item_timeout_s=2.0, item_memory_bytes=256 * MIB, batch_size=12
    ) as pool:
        started = time.monotonic()
        verdicts = pool.grade(items, OPTIONS)
        took_s = time.monotonic() - started
    # Then that item gets its failure verdict at once (no batch retries), with the
    # extraction it still has, and every other item of its batch is graded
    assert verdicts[5].status is status
    assert reason in verdicts[5].reason
    assert verdicts[5].extracted == verifier.grade(response, "5").extracted
    assert all(v.correct for i, v in enumerate(verdicts) if i != 5)
    assert took_s < 10


def test_local_pool_worker_survives_an_item_that_raises() -> None:
    items = [GradeItem(i, f"\\boxed{{{i}}}", str(i)) for i in range(8)]
    items[2] = GradeItem(2, "raise", "2")
    with make_pool(processes=1, batch_size=4) as pool:
        pool.grade(items[:1], OPTIONS)
        before = pool.worker_pids
        verdicts = pool.grade(items, OPTIONS)
        assert pool.worker_pids == before
    assert verdicts[2].status is Status.ERROR


def _add_pids(seen: set[int], pool: LocalPool, _done: int) -> None:
    seen.update(pool.worker_pids)


def test_local_pool_recycles_its_workers_and_keeps_their_cache_rows(
    tmp_path: Path,
) -> None:
    items = real_rollouts()[:300]
    expected = [verifier.grade(it.response, it.gold, options=OPTIONS) for it in items]
    runs = {}
    for recycle_after in (100, 10_000):
        seen: set[int] = set()
        kw = {
            "processes": 1,
            "recycle_after_items": recycle_after,
            "batch_size": 20,
            "grade_fn": None,
            "cache_path": tmp_path / f"cache-{recycle_after}.db",
        }
        with make_pool(**kw) as pool:
            note_pids = functools.partial(_add_pids, seen, pool)
            first = pool.grade(items, OPTIONS, note_pids)
        with make_pool(**kw) as pool:
            again = pool.grade(items, OPTIONS)
        assert [v.replace(cached=False) for v in first] == expected
        assert [v.replace(cached=False) for v in again] == expected
        runs[recycle_after] = (len(seen), sum(v.cached for v in again))
    # 300 items, a fresh worker every 100 (not every one shows up in a progress call)
    assert runs[100][0] >= 2
    assert runs[10_000][0] == 1
    # and every row a recycled worker held was written out when it left
    assert runs[100][1] == runs[10_000][1] > 0


def test_local_pool_identical_texts_read_as_two_answers_are_as_grade_says() -> None:
    # A text graded against itself: as an answer it is \boxed{6}, as a gold 5.
    text = "#### 5\n\\boxed{6}"
    with LocalPool(
        processes=1, item_timeout_s=5.0, item_memory_bytes=512 * MIB, cache_path=None
    ) as pool:
        (verdict,) = pool.grade([GradeItem(0, text, text)], OPTIONS)
    assert verdict == verifier.grade(text, text)
    assert verdict.status is Status.UNSUPPORTED


def test_local_pool_close_leaves_no_processes() -> None:
    pool = make_pool()
    pool.grade([GradeItem(0, "\\boxed{1}", "1")], OPTIONS)
    pids = pool.worker_pids
    assert len(pids) == 2
    pool.close()
    assert pool.worker_pids == []
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)


def test_local_pool_item_failing_while_prepared_is_answered_without_preparing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given items whose preparing (extraction) hangs or raises, in the workers
    # (forked from here, so they run this patched verifier)
    misbehave_while_prepared(monkeypatch)
    items = [GradeItem(i, f"\\boxed{{{i}}}", str(i)) for i in range(10)]
    items[3] = GradeItem(3, "hang while prepared", "3")
    items[6] = GradeItem(6, "raise while prepared", "6")
    with make_pool(processes=1, item_timeout_s=1.0, batch_size=10) as pool:
        verdicts = pool.grade(items, OPTIONS)
    # Then they are answered without being prepared again (that would hang or raise
    # here), and the others are graded
    assert verdicts[3].status is Status.TIMEOUT
    assert verdicts[6].status is Status.ERROR
    assert "grader raised KeyError" in verdicts[6].reason
    assert verdicts[3].extracted is None
    assert verdicts[6].extracted is None
    assert all(v.correct for i, v in enumerate(verdicts) if i not in (3, 6))


def test_local_pool_refuses_to_fork_while_the_cache_file_is_open_here(
    tmp_path: Path,
) -> None:
    # Given this process holding an SQLite connection to the pool's cache file
    cache_path = tmp_path / "cache.db"
    conn = sqlite3.connect(cache_path)
    conn.execute("CREATE TABLE t (x)")
    items = [GradeItem(0, "\\boxed{1}", "1")]
    try:
        # Then grading fails at once, naming the file (forked workers would wait
        # on its locks for the busy timeout, again and again)
        started = time.monotonic()
        with (
            make_pool(cache_path=cache_path) as pool,
            pytest.raises(SandboxError, match=r"cache\.db is open in this process"),
        ):
            pool.grade(items, OPTIONS)
        assert time.monotonic() - started < 10
    finally:
        conn.close()
    # and once it is closed, the pool grades
    with make_pool(cache_path=cache_path, grade_fn=None) as pool:
        assert pool.grade(items, OPTIONS)[0].correct


def test_local_pool_replaces_a_worker_whose_heap_grew_a_quarter_of_the_cap() -> None:
    # "keep" leaves 100 MiB allocated in the worker: past a quarter of a 256 MiB
    # cap, a fresh worker takes the next batch; below a quarter (1 GiB), none does.
    for cap_mib, replaced in ((256, True), (1024, False)):
        with make_pool(processes=1, item_memory_bytes=cap_mib * MIB) as pool:
            pool.grade([GradeItem(0, "\\boxed{1}", "1")], OPTIONS)
            first = pool.worker_pids
            kept = pool.grade([GradeItem(0, "keep", "1")], OPTIONS)
            after = pool.grade([GradeItem(0, "\\boxed{2}", "2")], OPTIONS)
            assert kept[0] == verifier.grade("keep", "1", options=OPTIONS)
            assert after[0].correct
            assert (pool.worker_pids != first) is replaced
