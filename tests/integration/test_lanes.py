"""Priority lanes and per-job windows on a real redis-server and real worker processes.

Each test that checks an order has a redis-server of its own (nothing else queued) and
one worker node with one process, so the order in which the worker takes batches is
exactly the order of the "received" lines in its log.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from producer.cli import cli
from producer.client.aio import AsyncGradingClient
from producer.client.fleet import GradingClient, Rollout
from producer.client.job import DEADLINE_REASON
from tests.hooks import HANG
from workers import verifier
from workers.models import Status, Verdict
from workers.wire.contract import batch_items_key
from workers.wire.lanes import BULK, INTERACTIVE, queue_for

pytestmark = pytest.mark.integration

_RECEIVED = re.compile(r"Task gradefleet\.grade_batch\[([0-9a-f]+)\.(\d+)\] received")


def _rollouts(tag: str, n: int) -> list[Rollout]:
    """Distinct texts (nothing cached), half correct."""
    return [Rollout(f"{tag} {i}: \\boxed{{{i % 7}}}", str(i % 3)) for i in range(n)]


def _taken(log: str, names: dict[str, str]) -> list[str]:
    """The jobs of the batches a worker took, in order, by the names given to their
    job ids (other jobs' batches left out)."""
    return [names[m[1]] for m in _RECEIVED.finditer(log) if m[1] in names]


@pytest.fixture
def own_redis(start_redis_server: Callable[..., str]) -> str:
    return start_redis_server()


def test_lanes_worker_takes_interactive_first_and_bulk_every_nth(
    own_redis, make_workers
):
    # Queued before any worker runs: 3 bulk batches, then 8 interactive ones.
    with GradingClient(own_redis, batch_size=4) as client:
        bulk = client.submit(_rollouts("bulk", 12), priority=BULK)
        interactive = client.submit(_rollouts("rl", 32))  # the default: interactive
        names = {bulk.job_id: "B", interactive.job_id: "I"}
        worker = make_workers(own_redis).start(extra_env={"GRADEFLEET_BULK_EVERY": "3"})
        assert len(interactive.results(timeout_s=60)) == 32
        assert len(bulk.results(timeout_s=60)) == 12
    # Interactive first; after 3 interactive batches in a row, one bulk batch.
    assert "".join(_taken(worker.log(), names)) == "IIIBIIIBIIB"


def test_lanes_default_share_lets_no_bulk_batch_into_a_short_step(
    own_redis, make_workers
):
    with GradingClient(own_redis, batch_size=4, priority=BULK) as client:
        bulk = client.submit(_rollouts("bulk", 8))
        step = client.submit(_rollouts("rl", 16), priority=INTERACTIVE)
        names = {bulk.job_id: "B", step.job_id: "I"}
        worker = make_workers(own_redis).start()
        step.results(timeout_s=60)
        bulk.results(timeout_s=60)
    assert "".join(_taken(worker.log(), names)) == "IIIIBB"


def test_lanes_job_keeps_at_most_its_window_in_the_broker(own_redis, make_workers):
    client_redis = redis.Redis.from_url(own_redis)
    with GradingClient(own_redis, batch_size=5, max_batches_in_flight=3) as client:
        job = client.submit(_rollouts("capped", 50), priority=BULK)  # 10 batches
        assert job.in_flight == 3
        assert client_redis.llen(queue_for(BULK)) == 3
        stored = [batch_items_key(f"{job.job_id}.{n}") for n in range(10)]
        assert sum(client_redis.exists(key) for key in stored) == 3
        make_workers(own_redis).start()
        high = 0
        for _ in job.as_completed(timeout_s=60):
            high = max(high, client_redis.llen(queue_for(BULK)))
            assert job.in_flight <= 3
        assert job.progress.done == 50
        assert high <= 3
        assert sum(client_redis.exists(key) for key in stored) == 0
    client_redis.close()


def test_lanes_two_jobs_of_one_lane_take_turns(own_redis, make_workers):
    with GradingClient(own_redis, batch_size=4, max_batches_in_flight=2) as client:
        first = client.submit(_rollouts("first", 40), priority=BULK)  # 10 batches
        second = client.submit(_rollouts("second", 40), priority=BULK)
        names = {first.job_id: "A", second.job_id: "B"}
        worker = make_workers(own_redis).start()
        done: dict[str, int] = {}

        def collect(name: str, job) -> None:  # type: ignore[no-untyped-def]
            done[name] = len(job.results(timeout_s=120))

        threads = [
            threading.Thread(target=collect, args=("A", first)),
            threading.Thread(target=collect, args=("B", second)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert done == {"A": 40, "B": 40}
    order = _taken(worker.log(), names)
    assert sorted(order) == ["A"] * 10 + ["B"] * 10  # nothing lost or re-sent
    # The second job's first batch goes right after the first job's window, not
    # after all 10 of its batches (FIFO without windows: AAAAAAAAAABBBBBBBBBB).
    assert order.index("B") <= 3
    assert order[:10].count("B") >= 3


def test_lanes_job_deadline_answers_the_rest_timeout(own_redis, make_workers):
    client_redis = redis.Redis.from_url(own_redis)
    make_workers(own_redis).start(item_timeout_s=1.0)
    hangs = [Rollout(f"\\boxed{{{HANG} {i}}}", "1") for i in range(8)]
    rollouts = _rollouts("quick", 4) + hangs  # 3 batches: quick, then 2 of hangs
    with GradingClient(
        own_redis, batch_size=4, max_batches_in_flight=2, on_deadline="timeout"
    ) as client:
        job = client.submit(rollouts, priority=BULK, deadline_s=2.0)
        verdicts = job.results(timeout_s=60)
    assert len(verdicts) == 12
    expected = [verifier.grade(r.response, r.gold) for r in rollouts[:4]]
    assert [v.replace(cached=False) for v in verdicts[:4]] == expected
    late = verdicts[4:]
    assert {v.status for v in late} == {Status.TIMEOUT}
    # The batch that never went out and the one queued are cut at the deadline;
    # the one being graded may have finished some items with the item deadline.
    assert sum(v.reason == DEADLINE_REASON for v in late) >= 4
    assert {v.grader_version for v in verdicts} == {expected[0].grader_version}
    keys = [batch_items_key(f"{job.job_id}.{n}") for n in range(3)]
    assert sum(client_redis.exists(key) for key in keys) == 0
    client_redis.close()


def test_lanes_node_dedicated_to_bulk_serves_the_cli_default(
    own_redis, make_workers, tmp_path: Path
):
    make_workers(own_redis).start(extra_env={"GRADEFLEET_LANES": "bulk"})
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            f'{{"response": "\\\\boxed{{{i}}}", "gold": "{i}"}}\n' for i in range(20)
        )
    )
    out = tmp_path / "out.jsonl"
    args = ["grade", str(source), "-o", str(out), "--broker", own_redis]
    done = CliRunner().invoke(cli, [*args, "--deadline-s", "60", "-q"])
    assert done.exit_code == 0, done.output
    assert len(out.read_text().splitlines()) == 20

    # The asyncio client sends a job to the lane it is told
    async def bulk_job() -> list[Verdict]:
        async with AsyncGradingClient(own_redis) as client:
            return await client.grade([Rollout("\\boxed{2}", "2")], priority=BULK)

    assert [v.correct for v in asyncio.run(bulk_job())] == [True]
    # The same rollouts as interactive work find no worker on this node.
    with GradingClient(own_redis, on_deadline="timeout", deadline_s=1.0) as client:
        verdicts = client.grade([Rollout("\\boxed{1}", "1")])
    assert verdicts[0].reason == DEADLINE_REASON
