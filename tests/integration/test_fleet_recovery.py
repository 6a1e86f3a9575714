"""Broker faults mid-job on real processes (issue 13): a Redis restart without
persistence, and the broker at `maxmemory` (noeviction). Each asserts nothing lost,
nothing duplicated, verdicts equal to a clean run, and prints its recovery time."""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import GradingClient
from tests.helpers import free_port, real_rollouts
from workers.models import Verdict

pytestmark = pytest.mark.integration

N_ROLLOUTS = 1_200


class RestartableRedis:
    """A redis-server on a fixed port, without persistence, that a test restarts."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self._workdir)]
        self.proc = subprocess.Popen([*args, *self._extra], stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Any]:
    made: list[RestartableRedis] = []

    def make(*extra: str) -> RestartableRedis:
        server = RestartableRedis(tmp_path, *extra)
        made.append(server)
        return server

    try:
        yield make
    finally:
        for server in made:
            server.kill()


def _rollouts(n: int = N_ROLLOUTS) -> list[dict[str, str]]:
    real = real_rollouts()
    return [
        {"response": real[i % len(real)].response, "gold": real[i % len(real)].gold}
        for i in range(n)
    ]


def _plain(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    return [{k: v for k, v in x.to_dict().items() if k != "cached"} for x in verdicts]


def _collect(
    client: GradingClient, rollouts: list[dict[str, str]]
) -> tuple[list[Verdict], Any]:
    """Grade through `as_completed`, asserting no index arrives twice."""
    job = client.submit(rollouts)
    seen: collections.Counter[int] = collections.Counter()
    verdicts: list[Verdict | None] = [None] * len(rollouts)
    for index, verdict in job.as_completed():
        seen[index] += 1
        verdicts[index] = verdict
    assert set(seen.values()) == {1}, "an index arrived twice"
    assert None not in verdicts
    return [v for v in verdicts if v is not None], job


_NO_CACHE = {"GRADEFLEET_CACHE_URL": "none"}


def test_recovery_redis_restart_without_persistence_republishes_at_once(
    restartable: Any, make_workers: Any
) -> None:
    # Given a fleet on a Redis without persistence, and a clean run's verdicts
    server = restartable()
    factory = make_workers(server.url)
    for worker in [factory.start(concurrency=2, extra_env=_NO_CACHE, wait=False)]:
        worker.wait_ready()
    rollouts = _rollouts()
    # deadline 25 s: below the stall timer (>= 34 s), the old way back
    with GradingClient(server.url, batch_size=16, deadline_s=25) as client:
        clean, _ = _collect(client, rollouts)
        # When Redis is killed and restarted empty 1 s into a second run
        restarted_at: list[float] = []

        def restart() -> None:
            time.sleep(1.0)
            server.kill()
            server.start()
            restarted_at.append(time.monotonic())

        thread = threading.Thread(target=restart)
        started = time.monotonic()
        thread.start()
        verdicts, job = _collect(client, rollouts)
        finished = time.monotonic()
        thread.join()
    # Then every rollout comes back once, as in the clean run, after one detected
    # restart
    assert _plain(verdicts) == _plain(clean)
    assert job.broker_restarts == 1
    print(
        f"\nredis restart without persistence: job of {N_ROLLOUTS} done "
        f"{finished - restarted_at[0]:.2f} s after Redis was back "
        f"(job {finished - started:.2f} s; clean run for scale); "
        f"{job.resent_batches} batches re-published"
    )


def test_recovery_broker_out_of_memory_never_exits_zero_and_job_completes(
    restartable: Any, make_workers: Any
) -> None:
    # Given a fleet on a broker capped at 64 MB with noeviction
    server = restartable("--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
    factory = make_workers(server.url)
    worker = factory.start(concurrency=2, extra_env=_NO_CACHE)
    rollouts = _rollouts(4 * N_ROLLOUTS)  # long enough to span the fault
    admin = redis.Redis.from_url(server.url)
    with GradingClient(server.url, batch_size=16, deadline_s=120) as client:
        clean, _ = _collect(client, rollouts)
        # When, 1 s into a second run, the broker is filled to maxmemory for 5 s
        events: dict[str, float] = {}

        def fill_then_free() -> None:
            time.sleep(1.0)
            n = 0
            for size in (1 << 20, 1 << 14, 1 << 8):  # down to the last bytes
                try:
                    while n < 100_000:
                        admin.set(f"junk:{n}", b"x" * size)
                        n += 1
                except redis.exceptions.OutOfMemoryError:
                    events["full"] = time.monotonic()
            time.sleep(5.0)
            admin.delete(*[f"junk:{i}" for i in range(n)])
            events["freed"] = time.monotonic()

        thread = threading.Thread(target=fill_then_free)
        thread.start()
        job = client.submit(rollouts)
        seen: collections.Counter[int] = collections.Counter()
        verdicts: list[Verdict | None] = [None] * len(rollouts)
        restarts = 0
        iterator = job.as_completed()
        while True:
            # A supervisor's part: a worker that exits non-zero is restarted.
            if worker.proc.poll() is not None:
                assert worker.proc.returncode != 0, worker.log()
                assert "unrecoverable error" in worker.log()
                restarts += 1
                worker = factory.start(concurrency=2, extra_env=_NO_CACHE)
            try:
                index, verdict = next(iterator)
            except StopIteration:
                break
            seen[index] += 1
            verdicts[index] = verdict
        finished = time.monotonic()
        thread.join()
    # Then nothing is lost or duplicated, the verdicts equal the clean run's, and
    # no worker ever exited with status 0
    assert "full" in events, "the broker never reached maxmemory"
    assert set(seen.values()) == {1}
    assert _plain([v for v in verdicts if v is not None]) == _plain(clean)
    for started in factory.started:
        assert started.proc.poll() is None or started.proc.returncode != 0
    print(
        f"\nbroker OOM for {events['freed'] - events['full']:.1f} s: job done "
        f"{finished - events['freed']:.2f} s after memory was freed; "
        f"{restarts} worker restarts (exit status != 0)"
    )
