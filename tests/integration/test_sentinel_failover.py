"""High availability (issue 13) on real processes: workers and the producer reach
Redis through three sentinels (`sentinel://` URL: broker, results and cache); the
master is SIGKILLed mid-job, the sentinels promote the replica, and the job
completes with nothing lost or duplicated, verdicts equal to a clean run. And the
CLI (`grade`, `status`) on a Sentinel URL whose master asks a password."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from producer.cli import cli
from producer.client.fleet import GradingClient
from tests.helpers import real_rollouts
from tests.integration.redis_procs import SentinelGroup, wait_for
from workers.models import Verdict

pytestmark = pytest.mark.integration

N_ROLLOUTS = 1_200
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample.jsonl"
PASSWORD = "sentinel-test-pw"
_KILL_AFTER_VERDICTS = 200
# Bounds the test if recovery fails (the assertions then say what is missing).
_JOB_DEADLINE_S = 60.0


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "redis")
    try:
        yield group
    finally:
        group.kill_all()


def _rollouts() -> list[dict[str, str]]:
    real = real_rollouts()[:N_ROLLOUTS]
    return [{"response": r.response, "gold": r.gold} for r in real]


def _plain(verdicts: list[Verdict | None]) -> list[dict[str, Any] | None]:
    return [
        None if v is None else {k: x for k, x in v.to_dict().items() if k != "cached"}
        for v in verdicts
    ]


def test_sentinel_failover_master_killed_mid_job_loses_nothing(
    sentinel_group: SentinelGroup, make_workers: Any
) -> None:
    # Given two workers and a producer on the sentinels' URL (the cache too), and a
    # clean run's verdicts
    url = sentinel_group.url
    factory = make_workers(url)
    for worker in [factory.start(wait=False), factory.start(wait=False)]:
        worker.wait_ready()
    rollouts = _rollouts()
    old_master = sentinel_group.master
    with GradingClient(url, batch_size=16, deadline_s=_JOB_DEADLINE_S) as client:
        clean = client.grade(rollouts)
        # (the second run grades again rather than reading the clean run's cache)
        admin = old_master.client()
        cached = list(admin.scan_iter(match="gradefleet:v1:result:*", count=1_000))
        assert cached, "the cache on the sentinel URL stored nothing"
        admin.delete(*cached)
        # When the master is SIGKILLed once 200 verdicts of a second run arrived
        started = time.monotonic()
        job = client.submit(rollouts)
        seen: collections.Counter[int] = collections.Counter()
        got: list[Verdict | None] = [None] * len(rollouts)
        killed_at = 0.0
        for index, verdict in job.as_completed():
            seen[index] += 1
            got[index] = verdict
            if sum(seen.values()) == _KILL_AFTER_VERDICTS:
                old_master.kill()
                killed_at = time.monotonic()
        finished = time.monotonic()
    # Then the replica was promoted, every rollout came back exactly once, and
    # the verdicts are the clean run's
    new_port = wait_for(
        lambda: (
            sentinel_group.master_port() != old_master.port
            and sentinel_group.master_port()
        ),
        timeout_s=10,
        what="the sentinels to name a new master",
    )
    assert new_port == sentinel_group.replica.port
    assert set(seen.values()) == {1}, "an index arrived twice"
    assert _plain(got) == _plain(list(clean))
    assert job.broker_restarts >= 1, "the producer did not notice the new master"
    for worker in factory.started:
        assert worker.proc.poll() is None, f"a worker died:\n{worker.log()}"
    print(
        f"\nsentinel failover: job of {N_ROLLOUTS} done {finished - killed_at:.2f} s "
        f"after the master was killed (whole job {finished - started:.2f} s); "
        f"{job.resent_batches} batches re-published"
    )


def test_sentinel_cli_grade_and_status_on_a_sentinel_url(
    sentinel_group: SentinelGroup, make_workers: Any, tmp_path: Path
) -> None:
    # Given a worker on the sentinels' URL, the master and replica asking a
    # password that comes from the environment (not the URL)
    sentinel_group.require_password(PASSWORD)
    url = sentinel_group.url
    env = {"GRADEFLEET_REDIS_PASSWORD": PASSWORD}
    make_workers(url).start(extra_env=env, item_timeout_s=30.0)
    out = tmp_path / "graded.jsonl"
    # When the sample is graded through the CLI and the status is asked
    runner = CliRunner(env=env)
    grade = runner.invoke(cli, ["grade", str(SAMPLE), "-o", str(out), "--broker", url])
    status = runner.invoke(cli, ["status", "--broker", url, "--window-s", "0.2"])
    # Then every line is graded, and the status names the live worker and the URL
    # with the password it was given redacted
    assert grade.exit_code == 0, grade.output
    assert "rollouts graded  197" in grade.stderr
    assert len(out.read_text("utf-8").splitlines()) == 197
    assert status.exit_code == 0, status.output
    assert "1 live" in status.stdout
    redacted = url.replace("sentinel://", "sentinel://:***@")
    assert f"broker       {redacted}" in status.stdout
    assert PASSWORD not in grade.output + status.output
