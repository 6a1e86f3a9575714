"""Killing things mid-job: sandbox children, whole workers, SIGTERM; nothing is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from producer.client.fleet import GradingClient, Rollout
from tests.helpers import free_port
from tests.hooks import HANG
from workers import verifier
from workers.models import Status

pytestmark = pytest.mark.integration


def _normal(k: int) -> Rollout:
    return Rollout(f"step {k}: so \\boxed{{{k % 9}}}", str(k % 4))


def _assert_graded_like_grade(rollouts, verdicts, skip=()):
    assert len(verdicts) == len(rollouts)
    for i, (rollout, verdict) in enumerate(zip(rollouts, verdicts, strict=True)):
        if i in skip:
            continue
        want = verifier.grade(rollout.response, rollout.gold)
        assert verdict.replace(cached=False) == want, i


def _asleep(pids: list[int]) -> list[int]:
    """The processes among `pids` sleeping in nanosleep (the hang hook's sleep)."""
    asleep = []
    for pid in pids:
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text()
        except OSError:  # gone meanwhile
            continue
        if "nanosleep" in wchan:
            asleep.append(pid)
    return asleep


def test_fleet_sigkill_of_sandbox_child_costs_one_item(workers, wait_until):
    # Given one worker with a long item deadline, grading a hang item then 20 normal
    worker = workers.start(item_timeout_s=30)
    rollouts = [Rollout(f"\\boxed{{{HANG}}}", "1")] + [_normal(k) for k in range(20)]
    with GradingClient(workers.redis_url, deadline_s=60) as client:
        started = time.monotonic()
        job = client.submit(rollouts)
        # When the sandbox child is SIGKILLed while it works on the hang item
        # (the one asleep in the hang: a child killed before it received the item
        # is replaced, and the fresh child then rightly waits out the deadline)
        sandbox_pid = wait_until(
            lambda: _asleep(worker.sandbox_pids()), timeout_s=20, what="hang"
        )[0]
        os.kill(sandbox_pid, signal.SIGKILL)
        verdicts = job.results()
    # Then that item is an `error` naming the signal, long before its deadline...
    assert verdicts[0].status is Status.ERROR
    assert "SIGKILL" in verdicts[0].reason
    assert time.monotonic() - started < 25
    # ...and every other item is graded as in-process
    _assert_graded_like_grade(rollouts, verdicts, skip={0})


def test_fleet_sigkill_of_whole_worker_loses_nothing(workers, wait_until):
    # Given two workers, and 16 batches of 8 that each hold one 1-second hang item
    doomed = workers.start(wait=False)
    survivor = workers.start(wait=False)
    doomed.wait_ready()
    survivor.wait_ready()
    rollouts = [
        Rollout(f"\\boxed{{{HANG} {k}}}", "1") if k % 8 == 3 else _normal(k)
        for k in range(128)
    ]
    with GradingClient(
        workers.redis_url, batch_size=8, resend_after_s=3.0, deadline_s=90
    ) as client:
        job = client.submit(rollouts)
        # When one worker is SIGKILLed (worker, pool child, sandbox) mid-batch
        wait_until(lambda: job.progress.done >= 16, timeout_s=30, what="progress")
        wait_until(doomed.sandbox_pids, timeout_s=30, what="doomed sandbox")
        doomed.kill_all()
        verdicts = job.results()
        resent = job.resent_batches
    # Then the producer re-sent the lost batch and every index has one verdict
    assert resent >= 1
    hangs = {k for k in range(128) if k % 8 == 3}
    assert all(verdicts[k].status is Status.TIMEOUT for k in hangs)
    _assert_graded_like_grade(rollouts, verdicts, skip=hangs)


def test_fleet_slow_batch_is_alive_not_resent(workers):
    # Given a batch whose first item hangs to its 4 s deadline (the batch's `done`
    # count stands still meanwhile) and a producer that re-sends after 2 s of silence
    workers.start(item_timeout_s=4.0)
    rollouts = [Rollout(f"\\boxed{{{HANG}}}", "1")] + [_normal(k) for k in range(7)]
    with GradingClient(
        workers.redis_url, batch_size=8, resend_after_s=2.0, deadline_s=60
    ) as client:
        job = client.submit(rollouts)
        verdicts = job.results()
        resent = job.resent_batches
    # Then the heartbeats (a new value every second) kept it alive: nothing re-sent
    assert resent == 0
    assert verdicts[0].status is Status.TIMEOUT
    _assert_graded_like_grade(rollouts, verdicts, skip={0})


def test_fleet_sigterm_is_a_warm_shutdown(workers, wait_until):
    # Given a worker busy with a batch that takes a few seconds (3 hang items)
    worker = workers.start(item_timeout_s=1.0)
    rollouts = [
        Rollout(f"\\boxed{{{HANG} {k}}}", "1") if k % 4 == 0 else _normal(k)
        for k in range(12)
    ]
    with GradingClient(workers.redis_url, deadline_s=60) as client:
        job = client.submit(rollouts)
        wait_until(worker.sandbox_pids, timeout_s=20, what="the batch to start")
        # When it receives SIGTERM mid-batch
        worker.proc.send_signal(signal.SIGTERM)
        verdicts = job.results()
    # Then the batch still completes and the worker exits cleanly
    assert worker.proc.wait(timeout=30) == 0
    assert [v.status for v in verdicts[::4]] == [Status.TIMEOUT] * 3
    _assert_graded_like_grade(rollouts, verdicts, skip={0, 4, 8})


def test_fleet_batch_backstop_still_answers_every_item(workers):
    # Given a worker sized for 1-item batches (soft limit ~12 s at a 1 s deadline)
    workers.start(item_timeout_s=1.0, extra_env={"GRADEFLEET_MAX_BATCH_SIZE": "1"})
    hangs = [Rollout(f"\\boxed{{{HANG} {k}}}", "1") for k in range(16)]
    rollouts = [_normal(k) for k in range(16)] + hangs
    # When one batch with 16 s of hanging items runs into the backstop
    with GradingClient(workers.redis_url, batch_size=32, deadline_s=60) as client:
        verdicts = client.grade(rollouts)
    # Then the items graded before it keep their verdicts and the rest are `timeout`
    _assert_graded_like_grade(rollouts[:16], verdicts[:16])
    assert [v.status for v in verdicts[16:]] == [Status.TIMEOUT] * 16
    assert verdicts[-1].reason == "batch time limit reached before this item"


def _start_private_redis(port: int, workdir) -> subprocess.Popen[bytes]:
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
    args += ["--save", "", "--appendonly", "no", "--dir", str(workdir)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL)


def test_fleet_redis_restart_mid_job_resends_lost_batches(
    tmp_path, wait_until, make_workers
):
    # Given a private Redis (it will lose everything) and a worker on it
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = _start_private_redis(port, tmp_path)
    client_redis = redis.Redis.from_url(url, socket_timeout=1)
    try:
        wait_until(lambda: _pings(client_redis), timeout_s=10, what="private redis")
        make_workers(url).start(item_timeout_s=1.0)
        rollouts = [
            Rollout(f"\\boxed{{{HANG} {k}}}", "1") if k % 8 == 0 else _normal(k)
            for k in range(64)
        ]
        with GradingClient(url, batch_size=8, resend_after_s=2.0, deadline_s=90) as gc:
            job = gc.submit(rollouts)
            wait_until(lambda: job.progress.done >= 8, timeout_s=30, what="progress")
            # When Redis is killed and comes back empty (queue and results gone)
            server.kill()
            server.wait(timeout=10)
            server = _start_private_redis(port, tmp_path)
            wait_until(lambda: _pings(client_redis), timeout_s=10, what="restart")
            verdicts = job.results()
            resent = job.resent_batches
        # Then the producer re-sent what was lost and every item has its verdict
        assert resent >= 1
        assert all(verdicts[k].status is Status.TIMEOUT for k in range(0, 64, 8))
        _assert_graded_like_grade(rollouts, verdicts, skip=set(range(0, 64, 8)))
    finally:
        client_redis.close()
        server.kill()
        server.wait(timeout=10)


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
