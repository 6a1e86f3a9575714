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

from producer.client.fleet import GradingClient
from tests.integration.faults import (
    NO_CACHE,
    collect,
    counter_total,
    fleet_rollouts,
    metered_worker,
    plain,
    publish_batch,
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


def test_recovery_copy_of_an_answered_batch_is_not_graded_again(
    restartable: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a worker, and a batch of 32 rollouts it has answered
    from workers.wire.protocol import task_meta_key

    server = restartable()
    worker, port = metered_worker(make_workers, server.url, tmp_path, concurrency=1)
    items = [(n, r["response"], r["gold"]) for n, r in enumerate(fleet_rollouts(32))]
    client = redis.Redis.from_url(server.url)
    publish_batch(server.url, "j.0", items)
    deadline = time.monotonic() + 60
    while client.get(task_meta_key("j.0")) is None or b"SUCCESS" not in (
        client.get(task_meta_key("j.0")) or b""
    ):
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.05)
    # When two more copies of it are delivered (re-sends after a lost worker)
    publish_batch(server.url, "j.0", items)
    publish_batch(server.url, "j.0", items)
    while worker.log().count("acknowledged without grading") < 2:
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.05)
    # Then they are acknowledged without grading: 32 rollouts graded in all, and
    # no per-batch bookkeeping key is left
    assert counter_total(port, "gradefleet_rollouts_graded_total") == 32
    assert list(client.scan_iter(match="gradefleet:v1:attempts:*")) == []
    assert list(client.scan_iter(match="gradefleet:v1:partial:*")) == []


def _stored_result(client: redis.Redis, batch_id: str) -> list[Any] | None:
    from workers.wire.protocol import read_task_meta, task_meta_key

    raw = client.get(task_meta_key(batch_id))
    meta = None if raw is None else read_task_meta(raw)
    if meta is None or meta.results is None:
        return None
    return plain([verdict for _, verdict in sorted(meta.results)])


def test_recovery_copy_delivered_while_graded_is_not_graded_twice(
    restartable: Any, make_workers: Any, tmp_path: Path, wait_until: Any
) -> None:
    # Given a worker of 2 processes, and a batch of 32 rollouts of which 3 hang
    # until the 1 s item deadline (the batch takes seconds), graded once cleanly
    from tests.hooks import HANG

    server = restartable()
    worker, port = metered_worker(make_workers, server.url, tmp_path, concurrency=2)
    texts = [(r["response"], r["gold"]) for r in fleet_rollouts(32)]
    for n in (5, 17, 29):
        texts[n] = (HANG, "1")
    items = [(n, response, gold) for n, (response, gold) in enumerate(texts)]
    client = redis.Redis.from_url(server.url)

    publish_batch(server.url, "clean.0", items)
    clean = wait_until(
        lambda: _stored_result(client, "clean.0"), timeout_s=90, what=worker.log()
    )
    graded_before = counter_total(port, "gradefleet_rollouts_graded_total")
    # When the same batch is delivered twice at once (both processes take one)
    started = time.monotonic()
    publish_batch(server.url, "twice.0", items)
    publish_batch(server.url, "twice.0", items)

    def skipped() -> float:
        return counter_total(port, "gradefleet_batches_skipped_total")

    wait_until(lambda: skipped() == 1, timeout_s=90, what=worker.log())
    # Then one delivery grades it and the other is acknowledged without grading:
    # 32 rollouts graded, the verdicts of the clean run, no claim left behind
    assert _stored_result(client, "twice.0") == clean
    assert counter_total(port, "gradefleet_rollouts_graded_total") == (
        graded_before + 32
    )
    assert list(client.scan_iter(match="gradefleet:v1:claim:*")) == []
    reason = "answered" if "already stored" in worker.log() else "claimed"
    print(
        f"\ncopy delivered while its batch was graded: skipped ({reason}) "
        f"{time.monotonic() - started:.1f} s after both were published; "
        "32 rollouts graded once"
    )
