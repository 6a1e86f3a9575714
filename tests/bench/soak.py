"""Soak: a fleet on a private Redis fed jobs continuously for --duration-s; prints
throughput, worker RSS and Redis key count over time (issue 13: the worker's main
process must plateau, per-job keys must not pile up).

    PYTHONPATH=$PWD python3 tests/bench/soak.py --duration-s 180 --sample-s 15

One worker node (`--concurrency` processes, no result cache: every rollout is graded)
and one producer in this process submitting jobs of `--job-rollouts` real rollouts
in batches of `--batch-size` back to back. Each sample line: elapsed seconds,
rollouts/s since the previous line, tasks so far, RSS of the worker's main process
and of its prefork children (MiB), Redis keys and used memory. The closing line
gives the main process's RSS growth over the second half of the run, per 1,000
tasks: a plateau is ~0 (it was ~0.55 MB per 1,000 tasks before `workers.fleet.timers`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_procs import real_rollouts, start_redis

from producer.client.fleet import GradingClient
from tests.integration.conftest import WorkerFactory, child_pids


def rss_mib(pid: int) -> float:
    """Resident set of one process, MiB (0 if it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=180.0)
    parser.add_argument("--sample-s", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--job-rollouts", type=int, default=1_024)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="gf-soak-"))
    server = start_redis(workdir)
    factory = WorkerFactory(server.url, workdir)
    admin = redis.Redis.from_url(server.url)
    try:
        worker = factory.start(
            concurrency=args.concurrency,
            item_timeout_s=5.0,
            extra_env={"GRADEFLEET_CACHE_URL": "none"},
        )
        real = real_rollouts()
        rows = [{"response": r.response, "gold": r.gold} for r in real]
        samples = _feed(args, server.url, rows, worker.pid, admin)
    finally:
        factory.stop_all()
        server.stop()
    _summary(samples)


def _feed(
    args: argparse.Namespace,
    url: str,
    rows: list[dict[str, str]],
    worker_pid: int,
    admin: redis.Redis,
) -> list[tuple[float, int, float]]:
    """Submit jobs back to back until the duration; print a line per sample."""
    samples: list[tuple[float, int, float]] = []  # (elapsed, tasks, main RSS)
    started = last_at = time.monotonic()
    graded = last_graded = tasks = offset = 0
    print(
        "elapsed_s rollouts/s tasks main_rss_mib children_rss_mib redis_keys "
        "redis_used_mib",
        flush=True,
    )
    with GradingClient(url, batch_size=args.batch_size) as client:
        while time.monotonic() - started < args.duration_s:
            job_rows = [
                rows[(offset + i) % len(rows)] for i in range(args.job_rollouts)
            ]
            offset += args.job_rollouts
            graded += len(client.grade(job_rows))
            tasks += -(-args.job_rollouts // args.batch_size)
            now = time.monotonic()
            if now - last_at >= args.sample_s:
                main_rss = rss_mib(worker_pid)
                children = sum(rss_mib(pid) for pid in child_pids(worker_pid))
                used = int(admin.info("memory")["used_memory"]) / 2**20
                rate = (graded - last_graded) / (now - last_at)
                print(
                    f"{now - started:9.0f} {rate:10.0f} {tasks:5d} "
                    f"{main_rss:12.1f} {children:16.1f} {admin.dbsize():10d} "
                    f"{used:14.1f}",
                    flush=True,
                )
                samples.append((now - started, tasks, main_rss))
                last_at, last_graded = now, graded
    return samples


def _summary(samples: list[tuple[float, int, float]]) -> None:
    if len(samples) < 2:
        print("too short a run for a summary (raise --duration-s)")
        return
    half = samples[len(samples) // 2 - (len(samples) % 2 == 0)]
    end = samples[-1]
    tasks = end[1] - half[1]
    growth_mib = end[2] - half[2]
    per_k = growth_mib / tasks * 1000 if tasks else 0.0
    print(
        f"main RSS second half: {half[2]:.1f} -> {end[2]:.1f} MiB over {tasks} "
        f"tasks ({per_k * 1024:.0f} KiB per 1,000 tasks)"
    )


if __name__ == "__main__":
    main()
