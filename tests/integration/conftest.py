"""Real worker processes (`python -m workers`) on the private redis-server fixture."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.integration.faults import RestartableRedis
from tests.serve_procs import ServeProcess, start_serve

_READY_DEADLINE_S = 60.0
_STOP_DEADLINE_S = 20.0
REPO_ROOT = Path(__file__).resolve().parents[2]


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (read from /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 (ppid) follows the ")" that closes the command name.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return sorted(children)


@dataclass
class WorkerProcess:
    """One `python -m workers` node started by a fixture (its own session)."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    hostname: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pool_pids(self) -> list[int]:
        """The prefork children."""
        return child_pids(self.pid)

    def sandbox_pids(self) -> list[int]:
        """Sandbox children of every prefork child."""
        return [pid for pool in self.pool_pids() for pid in child_pids(pool)]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + _READY_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"worker exited early ({self.proc.returncode}):\n{self.log()}"
                )
            if " ready." in self.log():
                return
            time.sleep(0.05)
        pytest.fail(f"worker not ready in {_READY_DEADLINE_S} s:\n{self.log()}")

    def kill_all(self) -> None:
        """SIGKILL the worker's whole process group (worker, pool, sandboxes)."""
        if self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=_STOP_DEADLINE_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=_STOP_DEADLINE_S)
        # Whatever is left of the group (a stuck child): SIGKILL it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=_STOP_DEADLINE_S)


class WorkerFactory:
    """Starts workers against one Redis URL; stops them all at teardown."""

    def __init__(self, redis_url: str, log_dir: Path) -> None:
        self.redis_url = redis_url
        self._log_dir = log_dir
        self.started: list[WorkerProcess] = []

    def start(
        self,
        *,
        concurrency: int = 1,
        item_timeout_s: float = 1.0,
        extra_env: dict[str, str] | None = None,
        wait: bool = True,
        argv_prefix: Sequence[str] = (),
        args: Sequence[str] = (),
    ) -> WorkerProcess:
        """Start a worker node; `argv_prefix` wraps its command (e.g. `ip netns exec
        NAME`, to run it in another network namespace), `args` are more options of
        `gradefleet worker` (e.g. `--kinds code`)."""
        name = f"w{len(self.started)}-{uuid.uuid4().hex[:6]}@localhost"
        hooks = str(REPO_ROOT / "tests" / "hooks.py")
        env = {**os.environ, "GRADEFLEET_TEST_HOOKS": hooks, **(extra_env or {})}
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
        )
        log_path = self._log_dir / f"{name.split('@')[0]}.log"
        argv = [*argv_prefix, sys.executable, "-m", "workers"]
        argv += ["--broker", self.redis_url]
        argv += [
            "--concurrency",
            str(concurrency),
            "--item-timeout-s",
            str(item_timeout_s),
        ]
        argv += ["--hostname", name, "--loglevel", "INFO", *args]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = WorkerProcess(proc=proc, log_path=log_path, hostname=name, env=env)
        self.started.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop()


@pytest.fixture
def workers(redis_server: str, tmp_path: Path) -> Iterator[WorkerFactory]:
    """Start workers for one test; all are stopped (then killed) afterwards."""
    factory = WorkerFactory(redis_server, tmp_path)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def make_workers(tmp_path: Path) -> Iterator[Callable[[str], WorkerFactory]]:
    """`make_workers(redis_url)`: a factory for another broker (stopped afterwards)."""
    made: list[WorkerFactory] = []

    def make(redis_url: str) -> WorkerFactory:
        factory = WorkerFactory(redis_url, tmp_path)
        made.append(factory)
        return factory

    try:
        yield make
    finally:
        for factory in made:
            factory.stop_all()


@pytest.fixture(scope="module")
def fleet(
    redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerFactory]:
    """Two workers (1 process each, item deadline 1 s), shared by a test module."""
    factory = WorkerFactory(redis_server, tmp_path_factory.mktemp("fleet"))
    try:
        for worker in [factory.start(wait=False), factory.start(wait=False)]:
            worker.wait_ready()
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def fleet_redis(redis_server: str) -> Iterator[redis.Redis]:
    """A client on the private server WITHOUT flushing (workers' queue bindings live
    there); tests keep apart by unique job ids and texts."""
    client: redis.Redis = redis.Redis.from_url(redis_server)
    try:
        yield client
    finally:
        client.close()


def _wait_until(
    predicate, *, timeout_s: float, interval_s: float = 0.02, what: str = ""
):
    """Poll `predicate` until truthy (returned) or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what or predicate}")


@pytest.fixture
def wait_until():
    """`wait_until(predicate, timeout_s=...)`: poll with a deadline, no fixed sleeps."""
    return _wait_until


@pytest.fixture(scope="module")
def service(fleet, redis_server: str, tmp_path_factory) -> Iterator[ServeProcess]:
    """`gradefleet serve` on the module's two-worker fleet, no token."""
    server = start_serve(tmp_path_factory.mktemp("serve"), broker=redis_server)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Callable[..., RestartableRedis]]:
    """`restartable(*redis_args)`: a private redis-server a test may kill, restart
    or starve of memory; all are killed afterwards."""
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
