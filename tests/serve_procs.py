"""`gradefleet serve` as a real subprocess on a free port (tests and benchmarks)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.helpers import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
_READY_DEADLINE_S = 90.0


@dataclass
class ServeProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        """Resident memory of the server process (from /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.terminate(timeout_s=20.0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=20)


def start_serve(
    log_dir: Path,
    *,
    broker: str | None = None,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> ServeProcess:
    """Start `gradefleet serve` (this tree's code) and wait for /healthz."""
    port = free_port()
    command = [sys.executable, "-c", "from producer.cli import main; main()", "serve"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    if broker:
        command += ["--broker", broker]
    command += list(args)
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    full_env = {**os.environ, "PYTHONPATH": path}
    for name in ("GRADEFLEET_BROKER_URL", "GRADEFLEET_SERVE_TOKEN"):
        full_env.pop(name, None)  # only what the caller passes
    full_env.update(env or {})
    log_path = log_dir / f"serve-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = ServeProcess(proc, f"http://127.0.0.1:{port}", log_path)
    if wait:
        wait_healthy(server)
    return server


def wait_healthy(server: ServeProcess) -> None:
    deadline = time.monotonic() + _READY_DEADLINE_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"serve exited ({server.proc.returncode}):\n{server.log()}"
            )
        try:
            if httpx.get(server.url + "/healthz", timeout=1.0).status_code == 200:
                # The lifespan (pool start, broker ping) runs before the port opens.
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"serve not healthy in {_READY_DEADLINE_S} s:\n{server.log()}")


async def post_json(url: str, path: str, body: bytes) -> tuple[int, bytes, float]:
    """One POST on its own connection: `(status, body, seconds)` (see below)."""
    import asyncio

    import h11

    host, port = url.removeprefix("http://").split(":")
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    conn = h11.Connection(h11.CLIENT)
    headers = [
        ("Host", f"{host}:{port}"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
    ]
    request = h11.Request(method="POST", target=path, headers=headers)
    writer.write(conn.send(request) + conn.send(h11.Data(data=body)))
    writer.write(conn.send(h11.EndOfMessage()))
    status, chunks = 0, []
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return status, b"".join(chunks), time.perf_counter() - started


async def post_json_many(
    url: str, path: str, bodies: Sequence[bytes], *, timeout_s: float = 300.0
) -> list[tuple[int, bytes, float]]:
    """POST every body at once, one connection each: `(status, body, seconds)`.

    A load generator for thousands of concurrent requests. httpx's connection pool
    re-scans its whole queue on every state change, so with thousands of queued
    requests the client, not the server, would be measured; this opens one plain
    asyncio connection per request and speaks HTTP/1.1 through h11 (the protocol
    library httpx and uvicorn use).
    """
    import asyncio

    return list(
        await asyncio.wait_for(
            asyncio.gather(*(post_json(url, path, body) for body in bodies)),
            timeout=timeout_s,
        )
    )
