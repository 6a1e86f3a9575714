"""Shared fixtures: a private redis-server per test session (never the system Redis)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import settings

# CI runs the property tests on a fixed seed (a red CI must be reproducible); local runs
# keep exploring new examples.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

_START_DEADLINE_S = 10.0
# `tests.helpers` and `tests.hooks` import as modules of the repository root, whichever
# way pytest was started (`python -m pytest` adds the root, the `pytest` script not).
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from tests.helpers import free_port  # noqa: E402  (needs the path set above)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + _START_DEADLINE_S
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log = log_path.read_text(errors="replace")
                pytest.fail(f"redis-server exited early ({proc.returncode}):\n{log}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.02)
        pytest.fail(f"redis-server did not answer within {_START_DEADLINE_S} s ({url})")
    finally:
        client.close()


@pytest.fixture(scope="session")
def start_redis_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., str]]:
    """`start_redis_server(*extra_args)`: a private redis-server on a free port (no
    persistence; `extra_args` are more server options); returns its URL. Every
    server started is killed at the end of the session."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (needed by integration tests)")
    started: list[subprocess.Popen[bytes]] = []

    def start(*extra_args: str) -> str:
        workdir = tmp_path_factory.mktemp("redis")
        port = free_port()
        log_path = workdir / "redis.log"
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(workdir)]
        args += ["--logfile", str(log_path), *extra_args]
        proc = subprocess.Popen(args, cwd=workdir, stdout=subprocess.DEVNULL)
        started.append(proc)
        url = f"redis://127.0.0.1:{port}/0"
        _wait_ready(url, proc, log_path)
        return url

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server(start_redis_server: Callable[..., str]) -> str:
    """A private redis-server for the session; its URL (`redis://...:PORT/0`)."""
    return start_redis_server()


@pytest.fixture
def redis_client(redis_server: str) -> Iterator[redis.Redis[bytes]]:
    """A client on the private server, with the database flushed before and after."""
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_server)
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()
