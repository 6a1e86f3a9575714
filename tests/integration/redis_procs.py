"""Real redis-server processes for the high-availability tests: a master, a replica
and three sentinels (`SentinelGroup`), each on a free port, killed at teardown."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from tests.helpers import free_port

__all__ = ["MASTER_NAME", "RedisProc", "SentinelGroup", "wait_for"]

MASTER_NAME = "mymaster"
_START_DEADLINE_S = 10.0
# Low, so a test's failover takes seconds: a master silent for 1 s is subjectively
# down; 2 of 3 sentinels agreeing make it objectively down and start the failover.
_DOWN_AFTER_MS = 1_000
_FAILOVER_TIMEOUT_MS = 5_000
_QUORUM = 2

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], *, timeout_s: float, what: str) -> T:
    """Poll `predicate` (redis errors count as "not yet") until it is truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (redis.RedisError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


class RedisProc:
    """One redis-server (or sentinel) without persistence, listening on `binds`
    (the first is the address of `url` and `client`)."""

    def __init__(
        self, workdir: Path, *args: str, binds: tuple[str, ...] = ("127.0.0.1",)
    ) -> None:
        self.host = binds[0]
        self.port = free_port()
        self.url = f"redis://{self.host}:{self.port}/0"
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"redis-{self.port}.log"
        base = ["--port", str(self.port), "--bind", *binds, "--dir", str(workdir)]
        base += ["--save", "", "--appendonly", "no", "--logfile", str(self.log_path)]
        self.proc = subprocess.Popen(
            ["redis-server", *args, *base], stdout=subprocess.DEVNULL
        )
        client = self.client()
        try:
            wait_for(client.ping, timeout_s=_START_DEADLINE_S, what=self.url)
        finally:
            client.close()

    def client(self) -> redis.Redis[bytes]:
        return redis.Redis(
            host=self.host, port=self.port, socket_timeout=2, socket_connect_timeout=1
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


class SentinelGroup:
    """A master, one replica (`--replicaof`) and three sentinels watching them."""

    def __init__(self, workdir: Path) -> None:
        self.procs: list[RedisProc] = []
        try:
            self.master = self._start(workdir / "master")
            self.replica = self._start(
                workdir / "replica", "--replicaof", "127.0.0.1", str(self.master.port)
            )
            self.sentinels = [
                self._start_sentinel(workdir / f"sentinel{n}") for n in range(3)
            ]
            self._wait_until_watched()
        except BaseException:
            self.kill_all()
            raise

    @property
    def url(self) -> str:
        """The fleet's URL: every sentinel, and the name of the master they watch."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"sentinel://{hosts}/0?master_name={MASTER_NAME}"

    def _start(self, workdir: Path, *args: str) -> RedisProc:
        proc = RedisProc(workdir, *args)
        self.procs.append(proc)
        return proc

    def _start_sentinel(self, workdir: Path) -> RedisProc:
        # A sentinel rewrites its config file (what it learns), so each has its own.
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "sentinel.conf"
        conf.write_text(
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} {_QUORUM}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {_DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} {_FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        return self._start(workdir, str(conf), "--sentinel")

    def _wait_until_watched(self) -> None:
        # A failover needs the replica in sync, and every sentinel knowing the
        # replica and its two peers (hello messages every 2 s); else no quorum.
        replica = self.replica.client()
        wait_for(
            lambda: replica.info("replication").get("master_link_status") == "up",
            timeout_s=_START_DEADLINE_S,
            what="the replica to sync",
        )
        for sentinel in self.sentinels:
            client = sentinel.client()
            wait_for(
                lambda c=client: _knows_everyone(c),  # type: ignore[misc]
                timeout_s=30,
                what=f"sentinel {sentinel.port} to see its peers and the replica",
            )

    def require_password(self, password: str) -> None:
        """Master and replica ask `password` (the sentinels are told it first, so
        that they do not take the refused PINGs for a dead master)."""
        for sentinel in self.sentinels:
            sentinel.client().sentinel_set(MASTER_NAME, "auth-pass", password)
        for server in (self.replica, self.master):
            admin = server.client()
            admin.config_set("masterauth", password)
            admin.config_set("requirepass", password)

    def master_port(self) -> int:
        """The port the sentinels name as master now."""
        client = self.sentinels[0].client()
        _host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(port)

    def kill_all(self) -> None:
        for proc in self.procs:
            proc.kill()


def _knows_everyone(client: redis.Redis[bytes]) -> bool:
    state = client.sentinel_master(MASTER_NAME)
    return (
        int(state["num-other-sentinels"]) == 2
        and int(state["num-slaves"]) == 1
        and not client.sentinel_slaves(MASTER_NAME)[0]["is_sdown"]
    )
