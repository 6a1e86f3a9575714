"""Broker faults on real processes (issue 13): a Redis restart without persistence
mid-job (nothing lost or duplicated, verdicts equal to a clean run, recovery time
printed), a worker refused by the broker, copies of an answered batch."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import GradingClient
from tests.helpers import free_port
from tests.integration.faults import (
    NO_CACHE,
    collect,
    counter_total,
    fleet_rollouts,
    plain,
)
from workers.models import Verdict

pytestmark = pytest.mark.integration

N_ROLLOUTS = 1_200


def test_recovery_redis_restart_without_persistence_republishes_at_once(
    restartable: Any, make_workers: Any
) -> None:
    # Given a fleet on a Redis without persistence, and a clean run's verdicts
    server = restartable()
    factory = make_workers(server.url)
    for worker in [factory.start(concurrency=2, extra_env=NO_CACHE, wait=False)]:
        worker.wait_ready()
    rollouts = fleet_rollouts(N_ROLLOUTS)
    # Re-send timers far past the deadline: only the restart check can bring the
    # job back in time (before it, the stall timer did, after >= 34 s).
    slow_timers = {"resend_after_s": 600.0, "stall_after_s": 600.0}
    with GradingClient(
        server.url, batch_size=16, deadline_s=120, **slow_timers
    ) as client:
        clean, _ = collect(client, rollouts)
        # When Redis is killed and restarted empty once 100 verdicts of a second
        # run have arrived
        started = time.monotonic()
        job = client.submit(rollouts)
        seen: collections.Counter[int] = collections.Counter()
        got: list[Verdict | None] = [None] * len(rollouts)
        restarted_at = 0.0
        for index, verdict in job.as_completed():
            seen[index] += 1
            got[index] = verdict
            if sum(seen.values()) == 100:
                server.kill()
                server.start()
                restarted_at = time.monotonic()
        finished = time.monotonic()
    assert set(seen.values()) == {1}, "an index arrived twice"
    verdicts = [v for v in got if v is not None]
    # Then every rollout comes back once, as in the clean run, after one detected
    # restart
    assert plain(verdicts) == plain(clean)
    assert job.broker_restarts == 1
    print(
        f"\nredis restart without persistence: job of {N_ROLLOUTS} done "
        f"{finished - restarted_at:.2f} s after Redis was back "
        f"(whole job {finished - started:.2f} s); "
        f"{job.resent_batches} batches re-published"
    )


def test_recovery_worker_refused_by_broker_exits_non_zero(
    restartable: Any, make_workers: Any
) -> None:
    # Given a broker user that may not touch Celery's mailbox keys
    server = restartable()
    admin = redis.Redis.from_url(server.url)
    admin.execute_command(
        "ACL", "SETUSER", "narrow", "on", ">narrow-pw", "~gradefleet*", "~_kombu.*"
    )
    admin.execute_command("ACL", "SETUSER", "narrow", "&*", "+@all")
    url = f"redis://narrow@127.0.0.1:{server.port}/0"
    # When a worker starts with it
    worker = make_workers(url).start(
        extra_env={"GRADEFLEET_REDIS_PASSWORD": "narrow-pw"}, wait=False
    )
    worker.proc.wait(timeout=60)
    # Then it stops with a non-zero status and says why (it used to exit 0)
    assert worker.proc.returncode == 1, worker.log()
    assert "NoPermissionError" in worker.log()
    assert "stopped by an unrecoverable error" in worker.log()


def _publish(url: str, wire: Any, items_json: str, batch_id: str) -> None:
    from celery import Celery

    from workers.contract import GRADE_BATCH, QUEUE

    redis.Redis.from_url(url).set(wire["items_key"], items_json, ex=600)
    app = Celery("producer", broker=url, set_as_current=False)
    try:
        app.send_task(GRADE_BATCH, args=[wire], task_id=batch_id, queue=QUEUE)
    finally:
        app.close()


def test_recovery_copy_of_an_answered_batch_is_not_graded_again(
    restartable: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a worker, and a batch of 32 rollouts it has answered
    from workers.contract import batch_to_wire, detach_items
    from workers.models import GradeOptions
    from workers.protocol import task_meta_key

    server = restartable()
    port = free_port()
    env = {
        **NO_CACHE,
        "GRADEFLEET_METRICS_PORT": str(port),
        "GRADEFLEET_METRICS_DIR": str(tmp_path / "m"),
    }
    worker = make_workers(server.url).start(concurrency=1, extra_env=env)
    items = [(n, r["response"], r["gold"]) for n, r in enumerate(fleet_rollouts(32))]
    wire, items_json = detach_items(
        batch_to_wire(
            job_id="j",
            batch_id="j.0",
            items=items,
            options=GradeOptions(),
            enqueued_at=time.time(),
        )
    )
    client = redis.Redis.from_url(server.url)
    _publish(server.url, wire, items_json, "j.0")
    deadline = time.monotonic() + 60
    while client.get(task_meta_key("j.0")) is None or b"SUCCESS" not in (
        client.get(task_meta_key("j.0")) or b""
    ):
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.05)
    # When two more copies of it are delivered (re-sends after a lost worker)
    _publish(server.url, wire, items_json, "j.0")
    _publish(server.url, wire, items_json, "j.0")
    while worker.log().count("acknowledged without grading") < 2:
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.05)
    # Then they are acknowledged without grading: 32 rollouts graded in all, and
    # no per-batch bookkeeping key is left
    assert counter_total(port, "gradefleet_rollouts_graded_total") == 32
    assert list(client.scan_iter(match="gradefleet:v1:attempts:*")) == []
    assert list(client.scan_iter(match="gradefleet:v1:partial:*")) == []
