"""The fleet end to end: real redis-server, two real `python -m workers` processes."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid

import pytest
from celery import Celery

from producer.client.aio import AsyncGradingClient
from producer.client.fleet import GradingClient, Rollout
from producer.client.grader import open_grader
from producer.errors import DeadlinePassedError
from producer.settings import ProducerSettings
from tests.helpers import hostile_grade, real_rollouts
from tests.hooks import ABORT, HANG, OOM, hooked_grade
from tests.integration.faults import save_first_verdict
from workers import verifier
from workers.embedded.pool import LocalPool
from workers.models import GradeOptions, Status, Verdict
from workers.wire.contract import GRADE_BATCH, QUEUE, batch_to_wire
from workers.wire.protocol import (
    attempts_key,
    job_done_key,
    partial_key,
    results_from_wire,
    task_meta_key,
)

pytestmark = pytest.mark.integration


def _expected(rollouts: list[Rollout]) -> list[Verdict]:
    """In-process `grade()` of each distinct pair (the reference verdicts)."""
    memo: dict[tuple[str, str], Verdict] = {}
    for r in rollouts:
        if (r.response, r.gold) not in memo:
            memo[r.response, r.gold] = verifier.grade(r.response, r.gold)
    return [memo[r.response, r.gold] for r in rollouts]


def _same(got: Verdict, want: Verdict) -> bool:
    return got.replace(cached=False) == want.replace(cached=False)


def _differing(first: list[Verdict], second: list[Verdict]) -> list[int]:
    """Indexes where two verdict lists differ (apart from the cache flag)."""
    pairs = zip(first, second, strict=True)
    return [i for i, (a, b) in enumerate(pairs) if not _same(a, b)]


def test_fleet_grades_10k_real_rollouts_in_order_like_grade(fleet):
    # Given 10,000 real rollouts (the real data, repeated and shuffled)
    base = real_rollouts()
    rollouts = (base * 2)[:10_000]
    random.Random(7).shuffle(rollouts)
    want = _expected(rollouts)
    # When the fleet grades them
    with GradingClient(fleet.redis_url, deadline_s=110) as client:
        got = client.grade(rollouts)
    # Then every verdict is there, in input order, equal to in-process grading
    assert len(got) == len(rollouts)
    bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if not _same(g, w)]
    assert bad == [], (len(bad), bad[:5], got[bad[0]], want[bad[0]])


def test_fleet_verdicts_equal_embedded_local_pool(fleet):
    # Given real rollouts with the hostile items mixed in
    rollouts = real_rollouts()[::3] + _hostile_batch()
    # When the fleet and the embedded pool (same limits, no cache) grade them
    with GradingClient(fleet.redis_url, deadline_s=60) as client:
        remote = client.grade(rollouts)
    with LocalPool(
        processes=2,
        item_timeout_s=1.0,
        item_memory_bytes=1024 * 1024 * 1024,
        cache_path=None,
        grade_fn=hooked_grade,
    ) as pool:
        local = pool.grade(rollouts, GradeOptions())
    # Then the verdicts are identical (apart from the cache flag)
    diff = _differing(remote, local)
    assert diff == [], (len(diff), remote[diff[0]], local[diff[0]])


def test_fleet_and_embedded_graders_give_identical_verdicts(fleet):
    # Given real rollouts
    rollouts = real_rollouts()[::7]
    settings = ProducerSettings(processes=2, cache_dir=None, deadline_s=60)
    # When the same rollouts go through the fleet's and the embedded `Grader`
    got = {}
    for url in (fleet.redis_url, None):
        ticks: list[int] = []
        with open_grader(url, settings=settings) as grader:
            got[url] = grader.grade(rollouts, on_progress=ticks.append, deadline_s=60)
        assert sum(ticks) == len(rollouts)
    # Then the verdicts are identical (apart from the cache flag)
    assert _differing(got[fleet.redis_url], got[None]) == []


def test_fleet_duplicate_answers_graded_once(fleet, fleet_redis):
    # Given 200 rollouts with different reasoning but only 5 distinct answers,
    # numbers no earlier test used (so the cache is cold for them)
    base = random.randrange(10**12, 10**13)
    before = len(fleet_redis.keys("gradefleet:v1:result:*"))

    def rollouts(tag: str) -> list[Rollout]:
        return [
            Rollout(f"{tag} #{k}. So \\boxed{{{base + k % 5}}}", str(base + 1))
            for k in range(200)
        ]

    # When one batch holds all 200
    with GradingClient(fleet.redis_url, batch_size=200, deadline_s=60) as client:
        first = client.grade(rollouts("first"))
    # Then the cache gained exactly 5 entries (graded once per distinct answer)
    assert len(fleet_redis.keys("gradefleet:v1:result:*")) - before == 5
    assert sum(v.correct for v in first) == 40
    # When new reasoning with the same answers comes in small batches
    with GradingClient(fleet.redis_url, batch_size=20, deadline_s=60) as client:
        second = client.grade(rollouts("second"))
    # Then every verdict is a cache hit, identical apart from the flag
    assert all(v.cached for v in second)
    pairs = zip(second, first, strict=True)
    diff = [i for i, (a, b) in enumerate(pairs) if not _same(a, b)]
    assert diff == [], (diff[:3], second[diff[0]], first[diff[0]])
    assert second[3].extracted == str(base + 3)


def _hostile_batch() -> list[Rollout]:
    normal = [Rollout(f"so \\boxed{{{k}}}", str(k + k % 2)) for k in range(8)]
    hostile = [
        Rollout(f"\\boxed{{{HANG}}}", "1"),
        Rollout("\\boxed{9^{9^{9^{9}}}}", "1"),
        Rollout(f"\\boxed{{{OOM}}}", "1"),
        Rollout(f"\\boxed{{{ABORT}}}", "1"),
    ]
    return normal[:4] + hostile + normal[4:]


def test_fleet_hostile_items_mid_batch_leave_neighbours_intact(fleet):
    # Given one batch with a hang, a power tower, a memory bomb and an abort mid-way
    rollouts = _hostile_batch()
    # When the fleet grades it (item deadline 1 s)
    started = time.monotonic()
    with GradingClient(fleet.redis_url, deadline_s=60) as client:
        got = client.grade(rollouts)
    # Then each hostile item gets its own verdict...
    assert got[4].status is Status.TIMEOUT
    assert got[5].status in (Status.UNSUPPORTED, Status.TIMEOUT)
    assert got[6].status is Status.MEMORY_LIMIT
    assert got[7].status is Status.ERROR
    assert "SIGABRT" in got[7].reason
    # ...the neighbours are graded exactly as in-process, and it cost ~one deadline
    for i in [*range(4), *range(8, 12)]:
        assert _same(got[i], verifier.grade(rollouts[i].response, rollouts[i].gold))
    assert time.monotonic() - started < 15


def test_fleet_submit_yields_each_index_once_with_progress(fleet):
    rollouts = [Rollout(f"\\boxed{{{k % 13}}}", str(k % 11)) for k in range(1_000)]
    with GradingClient(fleet.redis_url, batch_size=50) as client:
        job = client.submit(rollouts, deadline_s=60)
        seen = [index for index, _ in job.as_completed()]
        assert sorted(seen) == list(range(1_000))
        assert job.progress.done == job.progress.total == 1_000
        want = [k % 13 == k % 11 for k in range(1000)]
        assert [v.correct for v in job.results()] == want


def test_fleet_deadline_raises_listing_missing_indexes(fleet):
    # Given hanging items (1 s each) and a deadline shorter than that
    rollouts = [Rollout(f"\\boxed{{{HANG} {k}}}", "1") for k in range(3)]
    client = GradingClient(fleet.redis_url, batch_size=1, deadline_s=0.3)
    # Then the client raises, naming what is missing, instead of a partial list
    with client, pytest.raises(DeadlinePassedError, match=r"missing indexes: 0-2"):
        client.grade(rollouts)


def test_fleet_async_client_matches_and_does_not_block_loop(fleet):
    rollouts = [Rollout(f"\\boxed{{{k % 7}}}", str(k % 3)) for k in range(2_000)]

    async def scenario() -> tuple[list[Verdict], int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        async with AsyncGradingClient(fleet.redis_url, deadline_s=60) as client:
            verdicts = await client.grade(rollouts)
            job = await client.submit(rollouts[:300])
            seen = sorted([index async for index, _ in job])
        tick_task.cancel()
        assert seen == list(range(300))
        assert job.progress.done == 300
        return verdicts, ticks

    verdicts, ticks = asyncio.run(scenario())
    assert [v.correct for v in verdicts] == [k % 7 == k % 3 for k in range(2_000)]
    assert ticks >= 3  # the loop kept running while grading went on


def _send_wire(url: str, wire: dict, *, serializer: str = "json") -> None:
    app = Celery("test-sender", broker=url, set_as_current=False)
    app.conf.update(task_serializer=serializer, accept_content=[serializer])
    try:
        app.send_task(GRADE_BATCH, args=[wire], task_id=wire["batch_id"], queue=QUEUE)
    finally:
        app.close()


def _task_result(redis_client, task_id: str, wait_until) -> dict:
    key = task_meta_key(task_id)

    def finished():
        raw = redis_client.get(key)
        meta = None if raw is None else json.loads(raw)
        return meta if meta and meta["status"] in ("SUCCESS", "FAILURE") else None

    return wait_until(finished, timeout_s=30, what=f"result of {task_id}")


def _wire(batch_id: str) -> dict:
    items = [(0, "\\boxed{3}", "3"), (1, "\\boxed{4}", "5")]
    return dict(
        batch_to_wire(
            job_id="test",
            batch_id=batch_id,
            items=items,
            options=GradeOptions(),
            enqueued_at=time.time(),
        )
    )


def test_fleet_worker_pushes_batch_id_to_job_done_list_after_result(
    fleet, fleet_redis, wait_until
):
    # Given a batch of job "test" sent straight to the queue
    batch_id = f"done-{uuid.uuid4().hex}"
    fleet_redis.delete(job_done_key("test"))
    _send_wire(fleet.redis_url, _wire(batch_id))
    # When its result is stored
    meta = _task_result(fleet_redis, batch_id, wait_until)
    assert meta["status"] == "SUCCESS"
    # Then the worker has pushed the batch id to the job's done list (with a TTL)
    wait_until(
        lambda: batch_id.encode() in fleet_redis.lrange(job_done_key("test"), 0, -1),
        timeout_s=10,
        what="the batch id on the job's done list",
    )
    assert fleet_redis.ttl(job_done_key("test")) > 0


def test_fleet_client_deletes_its_done_list_when_the_job_completes(fleet, fleet_redis):
    with GradingClient(fleet.redis_url, deadline_s=30) as client:
        job = client.submit([Rollout("\\boxed{2}", "2")] * 3)
        assert [v.correct for v in job.results()] == [True] * 3
    assert not fleet_redis.exists(job_done_key(job.job_id))


def test_fleet_slow_batch_saves_its_verdicts_while_it_runs(
    fleet, fleet_redis, wait_until
):
    # Given one batch of 40 whose 1st chunk (16 items) holds a hang item (1 s
    # deadline) and whose 31st item hangs too
    rollouts = [Rollout(f"saves \\boxed{{{k}}}", str(k)) for k in range(40)]
    # A gold no other test uses: the verifier reads "<marker> saves 3" as the answer
    # 3, and a cached verdict for (3, gold) would answer the hang item ungraded.
    gold = str(random.randrange(10**12, 10**13))
    for k in (3, 30):
        rollouts[k] = Rollout(f"\\boxed{{{HANG} saves {k}}}", gold)
    with GradingClient(fleet.redis_url, batch_size=40, deadline_s=60) as client:
        job = client.submit(rollouts)
        # When the slow first chunk is done, Then its verdicts are saved at once
        # (a worker lost now costs the re-delivery no re-grading of them)
        key = partial_key(f"{job.job_id}.0")
        wait_until(
            lambda: fleet_redis.hlen(key) >= 16, timeout_s=30, what="saved chunk"
        )
        saved = fleet_redis.hgetall(key)
        verdicts = job.results()
    assert {int(index) for index in saved} >= set(range(16))
    assert json.loads(saved[b"3"])["status"] == "timeout"
    assert [v.status.value for v in verdicts].count("timeout") == 2
    # And once the result is stored, the saved verdicts are dropped
    wait_until(lambda: not fleet_redis.exists(key), timeout_s=10, what="drop")


def test_fleet_poison_batch_answered_error_not_looped(fleet, fleet_redis, wait_until):
    # Given a batch whose earlier deliveries all died (3 = max attempts)
    batch_id = f"poison-{uuid.uuid4().hex}"
    fleet_redis.set(attempts_key(batch_id), 3)
    # When it is delivered once more
    _send_wire(fleet.redis_url, _wire(batch_id))
    meta = _task_result(fleet_redis, batch_id, wait_until)
    # Then its items are answered `error` instead of being graded again
    pairs = results_from_wire(meta["result"])
    assert [v.status for _, v in pairs] == [Status.ERROR, Status.ERROR]
    assert pairs[0][1].reason == "poison batch: its worker was lost 3 times"


def test_fleet_and_local_pool_give_the_same_poison_verdict(
    fleet, fleet_redis, wait_until
):
    # Given a batch whose answers can be extracted, but whose grading process dies on
    # every delivery of its first item: in the fleet, 3 deliveries that never
    # finished (3 = max attempts) ...
    items = [(0, "kill-me \\boxed{3}", "3"), (1, "so \\boxed{x^2}", "y")]
    batch_id = f"poison-{uuid.uuid4().hex}"
    fleet_redis.set(attempts_key(batch_id), 3)
    wire = batch_to_wire(
        job_id="test",
        batch_id=batch_id,
        items=items,
        options=GradeOptions(),
        enqueued_at=time.time(),
    )
    # When the fleet gets it a 4th time and the local pool loses 3 workers on it
    _send_wire(fleet.redis_url, dict(wire))
    fleet_pairs = results_from_wire(
        _task_result(fleet_redis, batch_id, wait_until)["result"]
    )
    with LocalPool(
        processes=1,
        item_timeout_s=5.0,
        item_memory_bytes=1024 * 1024 * 1024,
        cache_path=None,
        grade_fn=hostile_grade,
        max_attempts=3,
    ) as pool:
        local = pool.grade([Rollout(r, g) for _, r, g in items], GradeOptions())
    # Then both answer the item with the same error verdict, extraction kept; a
    # fleet delivery cannot tell which item its process died on, so it answers the
    # whole batch so, while the pool, which reads it in its worker's progress slot,
    # grades the other item
    fleet_verdicts = [verdict for _, verdict in fleet_pairs]
    assert fleet_verdicts[0] == local[0]
    assert [v.status for v in fleet_verdicts] == [Status.ERROR, Status.ERROR]
    assert [v.extracted for v in fleet_verdicts] == ["3", "x^2"]
    assert "poison batch: its worker was lost 3 times" in local[0].reason
    assert local[1] == verifier.grade(items[1][1], items[1][2])


def test_fleet_redelivered_batch_reuses_saved_verdicts(fleet, fleet_redis, wait_until):
    # Given a batch whose item 0 was graded (and saved) by a delivery that died
    batch_id = f"partial-{uuid.uuid4().hex}"
    saved = save_first_verdict(fleet_redis, batch_id)
    # When it is delivered again
    _send_wire(fleet.redis_url, _wire(batch_id))
    pairs = results_from_wire(_task_result(fleet_redis, batch_id, wait_until)["result"])
    # Then item 0 is not re-graded and item 1 is graded normally
    assert pairs[0] == (0, saved)
    assert pairs[1][1].status is Status.WRONG
    # And the saved verdicts are dropped once the result holds them all
    wait_until(
        lambda: not fleet_redis.exists(partial_key(batch_id)),
        timeout_s=10,
        what="the partial-results hash deleted",
    )


class _Trap:
    """Unpickling this creates a file: proof that a worker deserialized pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_fleet_rejects_pickle_and_keeps_serving(
    fleet, fleet_redis, tmp_path, wait_until
):
    # Given a pickle-serialized task whose unpickling would create a file
    marker = tmp_path / "unpickled"
    batch_id = f"pickle-{uuid.uuid4().hex}"
    wire = {"batch_id": batch_id, "trap": _Trap(str(marker))}
    _send_wire(fleet.redis_url, wire, serializer="pickle")
    # When a worker receives it
    wait_until(
        lambda: any("untrusted content" in w.log() for w in fleet.started),
        timeout_s=30,
        what="a worker refusing the pickle message",
    )
    # Then it was never deserialized nor run, and JSON work is still served
    with GradingClient(fleet.redis_url, deadline_s=30) as client:
        assert client.grade([Rollout("\\boxed{2}", "2")])[0].correct
    assert not marker.exists()
    assert fleet_redis.get(f"celery-task-meta-{batch_id}") is None
