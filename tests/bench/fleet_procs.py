"""Fleet benchmark processes: a private redis-server and `python -m workers` nodes.

Also loads the real rollouts from tests/data, and holds the hostile answers the
benches mix in.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import redis

# Answers that would run for minutes or grow without bound without the verifier's
# input bounds and the per-item deadline (the hostile-step sections of bench_fleet
# and bench_overhead).
HOSTILE = [
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "\\boxed{1000000!}",
    "\\boxed{10^{10^{100}}}",
    "\\boxed{" + "(" * 5_000 + "1" + ")" * 5_000 + "}",
    "\\boxed{" + "9" * 200_000 + "}",
    "\\boxed{" + "x+" * 20_000 + "1}",
    "\\boxed{\\frac{" * 2_000 + "1" + "}{2}" * 2_000 + "}",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
# For `tests.helpers`: a script has only its own folder on the path.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from producer.client.fleet import Rollout  # noqa: E402
from tests.helpers import (  # noqa: E402
    free_port,
    gsm8k_groups,
    qwen_groups,
    real_rollouts,
)

__all__ = [
    "RedisServer",
    "Worker",
    "prompts_with_samples",
    "real_rollouts",
    "start_redis",
    "start_workers",
]


def prompts_with_samples() -> list[list[Rollout]]:
    """Real rollouts grouped by prompt (8 per MATH prompt, 4 per GSM8K prompt)."""
    return qwen_groups() + gsm8k_groups()


@dataclass
class RedisServer:
    proc: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def start_redis(workdir: Path) -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--dir", str(workdir)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with suppress(redis.ConnectionError):
            if client.ping():
                return RedisServer(proc, url)
        time.sleep(0.02)
    proc.kill()
    raise SystemExit("redis-server did not start")


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def start_workers(
    broker_url: str,
    count: int,
    *,
    item_timeout_s: float = 5.0,
    cache_url: str | None = None,
    log_dir: Path | None = None,
    test_hooks: bool = False,
    code_root: Path = REPO_ROOT,
) -> list[Worker]:
    """Start `count` worker nodes (concurrency 1 each); wait until all are ready.

    `code_root`: the checkout whose worker code runs (another one: an A/B of two
    commits' workers, `bench_fleet_ab.py`).

    `test_hooks`: load tests/hooks.py (the magic answers that hang, bloat or abort).
    Off unless a bench sends those answers: with it, the sandbox child decides each
    item with `hooked_grade` (the whole `grade()`, extraction again) instead of from
    what it prepared, which is not what a production worker runs.
    """
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="gf-bench-"))
    path = os.pathsep.join(filter(None, [str(code_root), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    if test_hooks:
        env["GRADEFLEET_TEST_HOOKS"] = str(REPO_ROOT / "tests" / "hooks.py")
    if cache_url is not None:
        env["GRADEFLEET_CACHE_URL"] = cache_url
    started = []
    for n in range(count):
        log_path = log_dir / f"worker{n}.log"
        args = [sys.executable, "-m", "workers", "--broker", broker_url]
        args += ["--concurrency", "1", "--item-timeout-s", str(item_timeout_s)]
        args += ["--hostname", f"bench{n}@%h", "--loglevel", "WARNING"]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                args,
                cwd=code_root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(Worker(proc, log_path))
    try:
        _wait_consuming(broker_url, count)
    except SystemExit:
        for worker in started:
            tail = worker.log_path.read_text(errors="replace")[-2000:]
            print(f"--- {worker.log_path} ---\n{tail}", file=sys.stderr)
        raise
    return started


def _wait_consuming(broker_url: str, count: int, timeout_s: float = 120.0) -> None:
    # A tiny app pings the nodes over the broker (no worker code imported here).
    from celery import Celery

    app = Celery("bench-ping", broker=broker_url, set_as_current=False)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            replies = app.control.ping(timeout=0.5) or []
            if len(replies) >= count:
                return
        raise SystemExit(f"only some of {count} workers answered in {timeout_s} s")
    finally:
        app.close()


def scaling_row(count: int, rate: float, first_rate: float, walls: list[float]) -> str:
    """The start of a scaling table's row: `count` workers' rollouts/s, its ratio to
    the first count's, and each run's wall seconds (the caller closes the bracket)."""
    return (
        f"    {count:3d} workers: {rate:9,.0f} rollouts/s  "
        f"{rate / first_rate:5.2f}x the first  (walls: "
        + ", ".join(f"{wall:.2f}" for wall in walls)
        + " s"
    )
