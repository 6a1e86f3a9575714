"""Fleet benchmark processes: a private redis-server and `python -m workers` nodes.

Also loads the real rollouts from tests/data.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import redis

from producer.client import Rollout

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIRS = (REPO_ROOT / "tests" / "data",)


def data_dir() -> Path:
    for path in DATA_DIRS:
        if path.is_dir():
            return path
    raise SystemExit(f"no data directory among {DATA_DIRS}")


def real_rollouts() -> list[Rollout]:
    """Qwen2.5-Math MATH outputs (800) then GSM8K GPT-3 outputs (5,276)."""
    out: list[Rollout] = []
    with (data_dir() / "qwen25math_math_cot_100.jsonl").open() as lines:
        for line in lines:
            record = json.loads(line)
            out += [Rollout(code, record["gt"]) for code in record["code"]]
    with (data_dir() / "gsm8k_example_model_solutions.jsonl").open() as lines:
        for line in lines:
            record = json.loads(line)
            for key, value in record.items():
                if key not in ("question", "ground_truth"):
                    sample = (
                        value if isinstance(value, dict) else ast.literal_eval(value)
                    )
                    out.append(Rollout(sample["solution"], record["ground_truth"]))
    return out


def prompts_with_samples() -> list[list[Rollout]]:
    """Real rollouts grouped by prompt (8 per MATH prompt, 4 per GSM8K prompt)."""
    groups: list[list[Rollout]] = []
    with (data_dir() / "qwen25math_math_cot_100.jsonl").open() as lines:
        for line in lines:
            record = json.loads(line)
            groups.append([Rollout(code, record["gt"]) for code in record["code"]])
    with (data_dir() / "gsm8k_example_model_solutions.jsonl").open() as lines:
        for line in lines:
            record = json.loads(line)
            group = []
            for key, value in record.items():
                if key not in ("question", "ground_truth"):
                    sample = (
                        value if isinstance(value, dict) else ast.literal_eval(value)
                    )
                    group.append(Rollout(sample["solution"], record["ground_truth"]))
            groups.append(group)
    return groups


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
    port = _free_port()
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
) -> list[Worker]:
    """Start `count` worker nodes (concurrency 1 each); wait until all are ready."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="gf-bench-"))
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "GRADEFLEET_TEST_HOOKS": "1", "PYTHONPATH": path}
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
                cwd=REPO_ROOT,
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
