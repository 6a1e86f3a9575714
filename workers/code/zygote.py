"""The warm interpreter inside bubblewrap that starts each sandboxed process.

`sandbox.CodeSandbox` starts two per worker process, each under bwrap (read-only
runtime, no network, empty environment, its own PID/IPC/UTS/mount namespaces):

- the *model* zygote forks every process that runs model code (`isolate.clone_isolated`
  then `isolate.enter_model_sandbox`) and watches it: stdout read in bounded chunks up
  to a cap, a wall deadline that kills the child's whole PID namespace. It only ever
  receives programs and stdin texts, never tests or expected values, because every
  model process is a copy of its memory;
- the *harness* zygote is the trusted harness itself: dropped to its own uid at start,
  it runs `harness.run_harness` for each rollout (it runs no model code, so it needs
  no fresh process or namespaces per rollout; see `main`).

Both read jobs from the worker over a Unix socket (fd 3) as `wire` frames; a call- or
assert-mode job brings the two pipe ends joining its harness and its model process.
Stdlib only; started as `python3 -I -S -B` with the app mounted at /rt/app.
"""

from __future__ import annotations

import fcntl
import gc
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from workers.code import isolate, runner
from workers.code.wire import (
    FRAME_BYTES,
    WireError,
    read_frame,
    recv_fds_frame,
    send_frame,
)

__all__ = ["main"]

_CHUNK = 64 * 1024
_STDERR_TAIL = 4096
_STAGE_FD = 1000  # above every descriptor a child keeps
# The harness process lives as long as its worker: its deadlines are the worker's
# wall clock per rollout, not a CPU total.
_HARNESS_CPU_S = 365 * 24 * 3600
_HARNESS_MEMORY_BYTES = 2 << 30
# Imported here once so that programs importing them start fast in every child.
_WARM = (
    "array bisect collections copy dataclasses datetime decimal enum fractions "
    "functools heapq itertools json math operator random re string typing"
)


def _limits(job: dict[str, Any], processes: int) -> isolate.RlimitSet:
    return isolate.RlimitSet(
        cpu_s=int(job["cpu_s"]),
        address_space_bytes=int(job["memory_bytes"]),
        processes=processes,
        file_size_bytes=int(job["file_size_bytes"]),
    )


def _place_fds(fds: dict[int, int]) -> None:
    """Make `fds` (target -> source) the child's only descriptors: staged above every
    target first, so a source that is also a target is never overwritten."""
    staged = {t: fcntl.fcntl(s, fcntl.F_DUPFD, _STAGE_FD) for t, s in fds.items()}
    for target, source in staged.items():
        os.dup2(source, target)
    os.closerange(max(fds) + 1, 1 << 16)


def _child_enter(job: dict[str, Any], fds: dict[int, int], ready_w: int) -> None:
    """In the clone child: put `fds` in place, isolate, then say so on the ready pipe:
    a child that dies before that never ran model code, so its rollout is a sandbox
    error, not a wrong answer."""
    ready = max(fds) + 1
    _place_fds({**fds, ready: ready_w})
    os.set_inheritable(ready, False)
    isolate.enter_model_sandbox(
        job["uid"], _limits(job, job["processes"]), job["tmpfs_bytes"]
    )
    os.write(ready, b"r")
    os.close(ready)


def _spawn_model(
    job: dict[str, Any], fds: dict[int, int], target: Any
) -> tuple[int, int]:
    """Clone an isolated child running `target()`; (pid, read end of its ready pipe)."""
    ready_r, ready_w = os.pipe()
    sys.stdout.flush()
    pid = isolate.clone_isolated()
    if pid == 0:
        try:
            _child_enter(job, fds, ready_w)
            target()
        except BaseException as exc:
            os.write(2, f"sandbox setup failed: {exc!r}\n".encode()[:500])
        os._exit(125)
    os.close(ready_w)
    return pid, ready_r


class _Watch:
    """One sandboxed child: its exit, its deadline, its ready flag."""

    def __init__(self, pid: int, ready_r: int, deadline: float) -> None:
        self.pid, self.ready_r, self.deadline = pid, ready_r, deadline
        self.pidfd = os.pidfd_open(pid)
        self.status: int | None = None
        self.ready = False
        self.killed = ""
        self.cpu_s = (
            0.0  # the child's own CPU time (its namespace's reaped processes too)
        )

    def kill(self, why: str) -> None:
        if self.status is None and not self.killed:
            self.killed = why
            os.kill(self.pid, signal.SIGKILL)  # PID 1 of its namespace: all of it dies

    def reap(self) -> None:
        _, self.status, usage = os.wait4(self.pid, 0)
        self.cpu_s = usage.ru_utime + usage.ru_stime
        if not self.ready:
            self.ready = os.read(self.ready_r, 1) == b"r"
        os.close(self.ready_r)
        os.close(self.pidfd)

    def describe(self) -> dict[str, Any]:
        assert self.status is not None
        return {
            "ready": self.ready,
            "killed": self.killed,
            "exit": os.waitstatus_to_exitcode(self.status),
            "cpu_s": self.cpu_s,
        }


def _drain(
    poller: select.poll, fd: int, sink: bytearray, cap: int, keep_tail: bool
) -> bool:
    """Read a chunk into `sink`; False once the fd is at EOF (and unregistered)."""
    chunk = os.read(fd, _CHUNK)
    if not chunk:
        poller.unregister(fd)
        os.close(fd)
        return False
    sink += chunk
    if keep_tail and len(sink) > cap:
        del sink[: len(sink) - cap]
    return True


def _run_stdio_test(
    job: dict[str, Any], stdin: str, job_deadline: float
) -> dict[str, Any]:
    """Run the program on one test's stdin; its outcome with stdout up to the cap."""
    if time.monotonic() >= job_deadline:  # the rollout's wall budget is spent
        return {
            "ready": True,
            "killed": "timeout",
            "exit": -9,
            "stdout": "",
            "stderr_tail": "",
        }
    stdin_fd = os.memfd_create("stdin", 0)
    os.write(stdin_fd, stdin.encode("utf-8", "surrogateescape"))
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    program, setup = job["program"], job["setup"]
    pid, ready_r = _spawn_model(
        job, {0: stdin_fd, 1: out_w, 2: err_w}, lambda: runner.run_stdio(program, setup)
    )
    for fd in (stdin_fd, out_w, err_w):
        os.close(fd)
    watch = _Watch(
        pid, ready_r, min(job_deadline, time.monotonic() + job["test_wall_s"])
    )
    out, err = bytearray(), bytearray()
    poller = select.poll()
    for fd in (out_r, err_r, watch.pidfd):
        poller.register(fd, select.POLLIN)
    open_fds = {out_r, err_r}
    while open_fds or watch.status is None:
        left_ms = max(0, int((watch.deadline - time.monotonic()) * 1000))
        if left_ms == 0 and not watch.killed:
            watch.kill("timeout")
        for fd, _event in poller.poll(left_ms if not watch.killed else 1000):
            if fd == watch.pidfd:
                poller.unregister(fd)
                watch.reap()
            elif not _drain(
                poller, fd, out if fd == out_r else err, _STDERR_TAIL, fd == err_r
            ):
                open_fds.discard(fd)
            elif fd == out_r and len(out) > job["output_bytes"]:
                watch.kill("output_limit")
                poller.unregister(out_r)
                os.close(out_r)
                open_fds.discard(out_r)
    outcome = watch.describe()
    outcome["stdout"] = out[: job["output_bytes"]].decode("utf-8", "replace")
    outcome["stderr_tail"] = err[-_STDERR_TAIL:].decode("utf-8", "replace")
    return outcome


def _serve(sock: socket.socket, job: dict[str, Any], fds: list[int]) -> None:
    """A call/assert job's model process: runs until the worker says `finish` (the
    harness is done), the deadline, or output past the cap; then it is killed with
    its namespace. Its stdout and stderr are counted, not kept: no test reads them,
    and an output flood ends here as `output_limit` instead of spinning."""
    program, setup, max_bytes = job["program"], job["setup"], job["max_bytes"]
    out_r, out_w = os.pipe()
    pid, ready_r = _spawn_model(
        job,
        {0: _DEVNULL, 1: out_w, 2: out_w, 3: fds[0], 4: fds[1]},
        lambda: runner.serve_calls(program, setup, 3, 4, max_bytes),
    )
    for fd in (*fds, out_w):
        os.close(fd)
    watch = _Watch(pid, ready_r, time.monotonic() + job["wall_s"])
    output = _Counted(out_r, job["output_bytes"])
    while not _serve_step(sock, watch, output):
        pass
    output.close()
    watch.kill("finish")
    if watch.status is None:
        watch.reap()
    send_frame(sock.fileno(), watch.describe(), max_bytes=FRAME_BYTES)


class _Counted:
    """A child's output pipe, read and dropped, with a cap on the bytes."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap, self.total = fd, cap, 0

    def read(self) -> bool:
        """Read a chunk; False once at EOF or past the cap (the caller kills the
        writer first, then closes: a closed pipe would only give it an error)."""
        chunk = os.read(self.fd, _CHUNK)
        self.total += len(chunk)
        return bool(chunk) and self.total <= self.cap

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _serve_step(sock: socket.socket, watch: _Watch, output: _Counted) -> bool:
    """One wait of `_serve`'s loop; True when the worker said `finish`."""
    alive = watch.status is None
    waits = [sock.fileno(), *([watch.pidfd] if alive else []), output.fd]
    waits = [fd for fd in waits if fd >= 0]
    left = max(0.0, watch.deadline - time.monotonic())
    readable = select.select(
        waits, [], [], left if alive and not watch.killed else None
    )
    if not readable[0]:
        watch.kill("timeout")
    elif output.fd in readable[0]:
        if not output.read():
            if output.total > output.cap:
                watch.kill("output_limit")
            output.close()
    elif alive and watch.pidfd in readable[0]:
        watch.reap()
    elif sock.fileno() in readable[0]:
        read_frame(sock.fileno(), max_bytes=FRAME_BYTES)  # "finish"
        return True
    return False


def _harness(sock: socket.socket, job: dict[str, Any], fds: list[int]) -> None:
    """Run one rollout's tests here, in the harness process itself (see `main`)."""
    from workers.code.harness import run_harness

    started = time.process_time()
    try:
        reply = run_harness(job, fds[0], fds[1])
    finally:
        for fd in fds:
            os.close(fd)
    reply["cpu_s"] = time.process_time() - started
    send_frame(sock.fileno(), reply, max_bytes=FRAME_BYTES)


def _loop(sock: socket.socket) -> None:
    while True:
        try:
            job, fds = recv_fds_frame(sock, max_bytes=FRAME_BYTES, max_fds=2)
        except WireError:
            return  # the worker went away
        op = job["op"]
        if op == "stdio":
            job_deadline = time.monotonic() + job["wall_s"]
            for stdin in job["stdins"]:
                outcome = _run_stdio_test(job, stdin, job_deadline)
                if outcome["killed"] == "timeout":  # no more time for this program
                    job_deadline = 0.0
                send_frame(sock.fileno(), outcome, max_bytes=FRAME_BYTES)
        elif op == "serve":
            _serve(sock, job, fds)
        elif op == "harness":
            _harness(sock, job, fds)
        elif op == "times":
            send_frame(sock.fileno(), list(os.times())[:4], max_bytes=FRAME_BYTES)


_DEVNULL = -1


def main(sock_fd: int, role: str, harness_uid: int = 0) -> None:
    """Entry point under bwrap: `sock_fd` is the worker's socket.

    The model zygote keeps the capabilities it needs to start isolated children. The
    harness zygote is itself the harness: it drops to its own uid, hard limits and no
    capabilities at once, and runs every rollout's tests in-process (a fork per
    rollout cost 3 ms of copied pages here). That is sound because it never runs
    model code and only ever holds plain data from the model; each test runs in a
    fresh namespace, and a harness that overruns is killed and replaced by the worker.
    """
    global _DEVNULL
    for name in _WARM.split():
        __import__(name)
    # bwrap --clearenv left only the loader path (already used): children get nothing.
    for name in list(os.environ):
        del os.environ[name]
    _DEVNULL = os.open("/dev/null", os.O_RDWR)
    os.dup2(_DEVNULL, 0)
    os.dup2(_DEVNULL, 1)
    if role == "harness":
        import workers.code.harness  # noqa: F401

        limits = isolate.RlimitSet(
            cpu_s=_HARNESS_CPU_S,
            address_space_bytes=_HARNESS_MEMORY_BYTES,
            processes=1,
            file_size_bytes=0,
        )
        isolate.drop_privileges(harness_uid, limits)
    isolate.prepare()
    # Every child is a copy of this process: keep the collector away from the
    # objects imported so far, or its first full pass in a child writes to (and so
    # copies) every page of them (gc.freeze, as prefork servers do).
    gc.collect()
    gc.freeze()
    sock = socket.socket(fileno=sock_fd)
    send_frame(sock.fileno(), {"ready": os.getpid()}, max_bytes=FRAME_BYTES)
    _loop(sock)
