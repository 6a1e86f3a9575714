"""Broker out of memory and a killed producer, on real processes (issue 13).

Each test asserts nothing lost, nothing duplicated and verdicts equal to a clean run,
and prints its recovery time (no timed assertions: a loaded 2-core machine runs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest
import redis

from producer.client.fleet import GradingClient
from producer.commands.sweep import REFUSED_REASON
from producer.errors import DeadlinePassedError
from tests.integration.conftest import REPO_ROOT
from tests.integration.faults import (
    collect,
    counter_total,
    fleet_rollouts,
    metered_worker,
    plain,
)
from workers.wire.protocol import KEY_PREFIX

pytestmark = pytest.mark.integration

# Only a detected refusal (or restart) may bring a job back: the re-send timers are
# far past every wait here.
SLOW_TIMERS = {"resend_after_s": 600.0, "stall_after_s": 600.0}
WAIT_S = 100.0


def _graded(port: int) -> float:
    return counter_total(port, "gradefleet_rollouts_graded_total")


def test_broker_oom_mid_job_is_waited_out_and_the_job_resumes(
    restartable: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a fleet and a clean run's verdicts
    server = restartable()
    worker, _ = metered_worker(make_workers, server.url, tmp_path, concurrency=2)
    rollouts = fleet_rollouts(600)
    with GradingClient(
        server.url, batch_size=16, deadline_s=WAIT_S, **SLOW_TIMERS
    ) as client:
        clean, _ = collect(client, rollouts)
        # When the broker reaches maxmemory (noeviction) once 100 verdicts of a
        # second run have arrived, and gets memory back 5 s later
        job = client.submit(rollouts)
        got: dict[int, Any] = {}
        freed_at: list[float] = []

        def feed_later() -> None:
            time.sleep(5.0)
            server.feed()
            freed_at.append(time.monotonic())

        try:
            for index, verdict in job.as_completed():
                assert index not in got, "an index arrived twice"
                got[index] = verdict
                if len(got) == 100:
                    server.starve()
                    threading.Thread(target=feed_later, daemon=True).start()
        except DeadlinePassedError as exc:  # say what the worker did meanwhile
            pytest.fail(f"{exc}\nworker log (end):\n{worker.log()[-6000:]}")
        finished = time.monotonic()
    # Then every rollout comes back once, as in the clean run; the job saw the
    # refusal, and the worker waited it out (still running, no crash)
    assert plain([got[i] for i in range(len(rollouts))]) == plain(clean)
    assert job.broker_refusals == 1
    assert worker.proc.poll() is None, worker.log()
    assert "OutOfMemoryError" in worker.log() or "maxmemory" in worker.log()
    assert "Unrecoverable error" not in worker.log()
    print(
        f"\nbroker OOM for 5 s mid-job: job of {len(rollouts)} done "
        f"{finished - freed_at[0]:.2f} s after memory was freed; "
        f"{job.resent_batches} batches re-published"
    )


_CLI = [sys.executable, "-c", "from producer.cli import main; main()"]


@contextlib.contextmanager
def _gradefleet(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`gradefleet ARGS` in its own process (stdout and stderr piped), killed if the
    block leaves while it still runs (a failed or timed-out test: Popen's own exit
    would wait for it, and a run against a dead broker waits out its deadline)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen(
        [*_CLI, *args], cwd=REPO_ROOT, env=env, stdout=PIPE, stderr=PIPE
    ) as run:
        try:
            yield run
        finally:
            if run.poll() is None:
                run.kill()


def _gradefleet_rc(*args: str) -> int:
    """`gradefleet ARGS` to its end: its exit status."""
    with _gradefleet(*args) as run:
        run.communicate(timeout=WAIT_S)
    return run.returncode


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _verdict_fields(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["correct"], r["status"], r["extracted"]) for r in rows]


def test_broker_oom_cli_writes_what_arrived_exits_8_and_resume_finishes(
    restartable: Any, make_workers: Any, tmp_path: Path, wait_until: Any
) -> None:
    # Given a fleet, an input file and its clean grading
    server = restartable()
    _, port = metered_worker(make_workers, server.url, tmp_path, concurrency=2)
    rollouts = fleet_rollouts(2_400)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    common = ["--broker", server.url, "--batch-size", "16", "-q"]
    clean_out = tmp_path / "clean.jsonl"
    assert _gradefleet_rc("grade", str(source), "-o", str(clean_out), *common) == 0
    # When the broker reaches maxmemory once the run has verdicts, and stays there
    # past --refused-limit-s
    out = tmp_path / "out.jsonl"
    graded_before = _graded(port)
    limit = ["--refused-limit-s", "3"]
    with _gradefleet("grade", str(source), "-o", str(out), *common, *limit) as run:
        wait_until(
            lambda: _graded(port) > graded_before + 64,
            timeout_s=WAIT_S,
            what="the first verdicts",
        )
        server.starve()
        starved_at = time.monotonic()
        _, stderr = run.communicate(timeout=WAIT_S)
    ended_s = time.monotonic() - starved_at
    # Then it ends with exit 8 and the broker's own error, having written every
    # row: the verdicts that arrived, the rest as `error` stand-ins
    assert run.returncode == 8, stderr.decode()
    assert b"OutOfMemoryError" in stderr, stderr.decode()
    rows = _rows(out)
    assert len(rows) == len(rollouts)
    clean_rows = _rows(clean_out)
    kept = [i for i, r in enumerate(rows) if r["reason"] != REFUSED_REASON]
    assert 0 < len(kept) < len(rows), stderr.decode()
    assert [_verdict_fields([rows[i]]) for i in kept] == [
        _verdict_fields([clean_rows[i]]) for i in kept
    ]
    # And once memory is back, --resume grades only the rest (the kept rows come
    # back `cached`): equal to the clean run
    server.feed()
    assert (
        _gradefleet_rc("grade", str(source), "-o", str(out), *common, "--resume") == 0
    )
    resumed = _rows(out)
    assert _verdict_fields(resumed) == _verdict_fields(clean_rows)
    assert [i for i, r in enumerate(resumed) if r["cached"]] == kept
    print(
        f"\nbroker OOM, CLI: exit 8 {ended_s:.1f} s after the broker filled up "
        f"(--refused-limit-s 3), {len(kept)} of {len(rows)} verdicts kept; "
        "--resume finished the file"
    )


def test_broker_oom_at_submit_exits_8_and_leaves_no_items(
    restartable: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a broker already at maxmemory
    server = restartable()
    server.starve()
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in fleet_rollouts(64)))
    # When a run starts on it
    out = tmp_path / "out.jsonl"
    with _gradefleet(
        "grade", str(source), "-o", str(out), "--broker", server.url
    ) as run:
        _, stderr = run.communicate(timeout=WAIT_S)
    # Then it says the broker refused (exit 8, not 5 "unreachable"), writes every
    # row as an `error` stand-in, and leaves no stored items behind
    assert run.returncode == 8, stderr.decode()
    assert b"OutOfMemoryError" in stderr
    assert {r["status"] for r in _rows(out)} == {"error"}
    admin = redis.Redis.from_url(server.url)
    assert list(admin.scan_iter(match=f"{KEY_PREFIX}items:*")) == []


# A producer of 200 batches of 16, each with one rollout that hangs its sandbox
# until the worker's 1 s item deadline (`tests.hooks`): a batch takes over a second,
# so most batches are still queued when the producer is killed.
_PRODUCER = """
import sys
from producer.client.fleet import GradingClient
from producer.errors import DeadlinePassedError
from tests.hooks import HANG
pairs = [{"response": r, "gold": g} for r, g in zip(*[iter(sys.argv[3:])] * 2)]
rollouts = [
    {"response": HANG, "gold": "1"} if i % 16 == 0 else pairs[i % len(pairs)]
    for i in range(3_200)
]
with GradingClient(sys.argv[1], batch_size=16, max_batches_in_flight=10_000,
                   job_ttl_s=int(sys.argv[2]), resend_after_s=600.0,
                   stall_after_s=600.0) as client:
    job = client.submit(rollouts)
    for n, _ in enumerate(job.as_completed(), 1):
        print(n, flush=True)
"""


def test_producer_killed_its_queued_batches_are_skipped(
    restartable: Any, make_workers: Any, tmp_path: Path, wait_until: Any
) -> None:
    # Given a worker (one process) and a clean run of a small job
    server = restartable()
    worker, port = metered_worker(make_workers, server.url, tmp_path, concurrency=1)
    small = fleet_rollouts(160)
    with GradingClient(server.url, batch_size=16, **SLOW_TIMERS) as client:
        started = time.monotonic()
        clean, _ = collect(client, small)
        clean_s = time.monotonic() - started
    graded_before = counter_total(port, "gradefleet_rollouts_graded_total")
    # When a producer of 200 slow batches (3,200 rollouts; board entry TTL 3 s)
    # is SIGKILLed once its first verdicts arrived
    texts = [t for r in small for t in (r["response"], r["gold"])]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, server.url, "3", *texts],
        cwd=REPO_ROOT,
        env=env,
        stdout=PIPE,
        text=True,
    ) as producer:
        assert producer.stdout is not None
        for line in producer.stdout:
            if line.strip() == "32":
                break
        producer.send_signal(signal.SIGKILL)
        producer.wait(timeout=WAIT_S)
    killed_at = time.monotonic()
    # and a new job is submitted right after it
    with GradingClient(server.url, batch_size=16, **SLOW_TIMERS) as client:
        after, _ = collect(client, small)
    new_job_s = time.monotonic() - killed_at
    # Then the new job is graded as the clean run, and the dead job's queued
    # batches were acknowledged without grading: most of its rollouts never were
    assert plain(after) == plain(clean)
    admin = redis.Redis.from_url(server.url)
    wait_until(
        lambda: admin.llen("gradefleet") == 0 and admin.hlen("unacked") == 0,
        timeout_s=WAIT_S,
        what="the dead job's batches to leave the queue",
    )
    skipped = counter_total(
        port, "gradefleet_batches_skipped_total", reason="abandoned"
    )
    assert skipped > 0
    dead_graded = (
        counter_total(port, "gradefleet_rollouts_graded_total")
        - graded_before
        - len(small)
    )
    assert dead_graded < 3_200 / 2, worker.log()
    assert list(admin.scan_iter(match=f"{KEY_PREFIX}items:*")) == []
    print(
        f"\nproducer SIGKILLed with 200 batches queued: {skipped:.0f} skipped "
        f"unread, {dead_graded:.0f} of its 3,200 rollouts graded; a new job of "
        f"{len(small)} done {new_job_s:.1f} s after the kill (clean run "
        f"{clean_s:.1f} s)"
    )
