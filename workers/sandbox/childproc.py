"""Forked helper processes (sandbox children, local pool workers): fork hygiene and
length-prefixed JSON frames over pipes.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import signal
import struct
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from workers.errors import SandboxError
from workers.sizing import RECYCLE_GROWN_SHARE

__all__ = [
    "FrameBuffer",
    "encode_frame",
    "fork_child",
    "limit_address_space",
    "open_statm",
    "read_body_frame",
    "read_frame",
    "recycle_rss_bytes",
    "self_size_bytes",
    "statm_rss_bytes",
    "write_all",
    "write_body_frame",
    "write_frame",
]

_HEADER = struct.Struct("!I")
_ASCII_JSON = json.JSONEncoder(separators=(",", ":"))
_PR_SET_PDEATHSIG = 1
EXIT_CRASH = 70  # an unexpected exception escaped the child's main function

# --- frames: 4-byte big-endian length + JSON ---
# orjson encodes and parses frames several times faster than the stdlib, and every
# item crosses two or three pipes each way. It refuses what JSON text from a model
# may hold and the stdlib accepts (a lone surrogate, an integer beyond 64 bits): such
# a frame is written by the stdlib as ASCII JSON after a leading space, and read
# back by the stdlib (orjson would read a big integer back as a float).
_STDLIB_MARK = b" "


def encode_frame(obj: Any) -> bytes:
    payload = _encode(obj)
    return _HEADER.pack(len(payload)) + payload


def _encode(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _STDLIB_MARK + _ASCII_JSON.encode(obj).encode("ascii")


def _decode(payload: bytes) -> Any:
    if payload.startswith(_STDLIB_MARK):
        return json.loads(payload)
    return orjson.loads(payload)


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to a blocking fd (BrokenPipeError if the reader is gone)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_frame(fd: int, obj: Any) -> None:
    write_all(fd, encode_frame(obj))


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any | None:
    """Read one frame from a blocking fd; None at end of file."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    payload = _read_exact(fd, _HEADER.unpack(header)[0])
    return None if payload is None else _decode(payload)


# --- frames with a body: 2 x 4-byte big-endian lengths + JSON + raw bytes ---
# For payloads that are bytes already (the embedded pool's units of JSONL lines and
# their output lines): they cross as they are, not as JSON text.
_BODY_HEADER = struct.Struct("!II")


def write_body_frame(fd: int, obj: Any, body: bytes = b"") -> None:
    """One frame of JSON `obj` and raw `body` (see `read_body_frame`)."""
    payload = _encode(obj)
    write_all(fd, _BODY_HEADER.pack(len(payload), len(body)) + payload + body)


def read_body_frame(fd: int) -> tuple[Any, bytes] | None:
    """Read one `write_body_frame` frame from a blocking fd; None at end of file."""
    header = _read_exact(fd, _BODY_HEADER.size)
    if header is None:
        return None
    size, body_size = _BODY_HEADER.unpack(header)
    payload = _read_exact(fd, size + body_size)
    if payload is None:
        return None
    return _decode(payload[:size]), payload[size:]


class FrameBuffer:
    """Bytes read so far by a polling (deadline-bound) reader; pops complete frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def pop(self) -> Any | None:
        if len(self._buf) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(self._buf)
        end = _HEADER.size + size
        if len(self._buf) < end:
            return None
        payload = bytes(self._buf[_HEADER.size : end])
        del self._buf[:end]
        return _decode(payload)


# --- fork hygiene ---


def _set_parent_death_signal(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL us when our parent dies; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)


def _reset_signal_handlers() -> None:
    """Drop Python handlers inherited from the parent (Celery installs several).

    SIGINT is ignored rather than defaulted: a Ctrl-C on the terminal reaches the whole
    process group, and the parent (which may be finishing a warm shutdown) decides when
    its child dies; the child dies with its parent anyway (PR_SET_PDEATHSIG).
    """
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _close_fds_except(keep: Sequence[int]) -> None:
    """Close every inherited fd above stderr except `keep` (sockets, Celery pipes,
    other children's pipes: a stray copy of a write end would hide a child's death).
    """
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def self_size_bytes() -> tuple[int, int]:
    """(virtual size, resident set) of this process, in bytes."""
    with open("/proc/self/statm", "rb") as f:
        fields = f.read().split()
    return int(fields[0]) * _PAGE_BYTES, int(fields[1]) * _PAGE_BYTES


def statm_rss_bytes(statm_fd: int) -> int:
    """The resident set of the process whose statm `statm_fd` is (`open_statm`);
    0 once it is gone."""
    try:
        return int(os.pread(statm_fd, 128, 0).split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def limit_address_space(limit_bytes: int, *, soft_only: bool = False) -> None:
    """RLIMIT_AS of this process = `limit_bytes` (never above the hard limit).

    `soft_only`: the hard limit stays as it is, for a process that runs only our own
    code but starts the code sandbox (`workers.code.sandbox`), whose processes set
    their own, larger limits and could not raise an inherited hard one."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = limit_bytes if hard == resource.RLIM_INFINITY else min(hard, limit_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard if soft_only else limit))


def open_statm(pid: int, what: str) -> int:
    """An fd on a child's /proc/<pid>/statm, to sample its memory while it works;
    if that cannot be opened, the child is killed and reaped (SandboxError): a
    child whose memory cannot be watched must not grade."""
    try:
        return os.open(f"/proc/{pid}/statm", os.O_RDONLY)
    except OSError as exc:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise SandboxError(f"cannot watch {what} {pid}: {exc}") from exc


def recycle_rss_bytes(statm_fd: int, item_memory_bytes: int) -> int:
    """The RSS past which a child just forked (`open_statm`) is replaced once its
    work in hand is done: its own size now, not its parent's (a forked child starts
    without the parent's file-backed pages, shared libraries and mapped files, in
    its RSS), plus `RECYCLE_GROWN_SHARE` of the item cap."""
    return statm_rss_bytes(statm_fd) + int(item_memory_bytes * RECYCLE_GROWN_SHARE)


def fork_child(main: Callable[[int, int], int]) -> tuple[int, int, int]:
    """Fork a child running `main(request_fd, reply_fd)`; returns (pid, to_fd, from_fd).

    The child freezes inherited objects (no finalizer of the parent's files or sockets
    ever runs in it), resets signal handlers, dies with its parent, keeps only its two
    pipe ends, and always leaves through `os._exit` (never returning into the parent's
    code). The parent keeps the other two ends.
    """
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    parent_pid = os.getpid()
    for stream in (sys.stdout, sys.stderr):  # or the child would print them twice
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    pid = os.fork()
    if pid == 0:
        code = EXIT_CRASH
        try:
            gc.freeze()
            _reset_signal_handlers()
            _set_parent_death_signal(parent_pid)
            _close_fds_except((to_r, from_w))
            code = main(to_r, from_w)
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
        finally:
            os._exit(code)
    os.close(to_r)
    os.close(from_w)
    return pid, to_w, from_r
