"""Length-prefixed frames of plain data (`workers.code.plain`) over pipes and sockets.

Every channel of the code grader uses these frames: worker <-> zygotes (a Unix socket,
which also carries the pipe ends of a rollout as SCM_RIGHTS), harness <-> model (two
pipes). A frame is a 4-byte big-endian length and the plain-data encoding. The reader
bounds the length before reading and decodes with `decode_plain`, which builds only
exact builtin types, so a frame from a hostile writer is a value or a `WireError`,
never code. Reads take an absolute deadline (`time.monotonic()` seconds). Stdlib only.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

from workers.code.errors import CodeGraderError, PlainDataError
from workers.code.plain import decode_plain, encode_plain

__all__ = [
    "FRAME_BYTES",
    "WireError",
    "WireTimeout",
    "read_frame",
    "recv_fds_frame",
    "send_frame",
]

# The bound of one frame between the worker and its zygotes.
FRAME_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")


class WireError(CodeGraderError):
    """The other end closed, sent a malformed frame, or one over the size bound."""


class WireTimeout(WireError):
    """No complete frame before the deadline."""


def _wait_readable(fd: int, deadline: float | None) -> None:
    if deadline is None:
        return
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise WireTimeout("deadline passed")


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    while size:
        _wait_readable(fd, deadline)
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise WireError("channel closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def encode_frame(value: Any, max_bytes: int) -> bytes:
    payload = encode_plain(value, max_bytes=max_bytes)
    return _HEADER.pack(len(payload)) + payload


def send_frame(fd: int, value: Any, *, max_bytes: int, fds: Sequence[int] = ()) -> None:
    """Write one frame; `fds` (a socket only) travel with its first bytes."""
    data = encode_frame(value, max_bytes)
    if fds:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sent = socket.send_fds(sock, [data[: _HEADER.size]], list(fds))
        if sent != _HEADER.size:
            raise WireError("short write of a frame header")
        data = data[_HEADER.size :]
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _payload(
    fd: int, header: bytes, max_bytes: int, deadline: float | None, timed: bool
) -> Any:
    (size,) = _HEADER.unpack(header)
    if size > max_bytes:
        raise WireError(f"frame of {size} bytes over the bound of {max_bytes}")
    data = _read_exact(fd, size, deadline)
    try:
        if timed and deadline is not None:
            return _decode_by(data, max_bytes, deadline)
        return decode_plain(data, max_bytes)
    except PlainDataError as exc:
        raise WireError(f"malformed frame: {exc}") from None


def _on_alarm(signum: int, frame: Any) -> None:
    raise WireTimeout("deadline passed while decoding")


def _decode_by(data: bytes, max_bytes: int, deadline: float) -> Any:
    """`decode_plain` stopped at `deadline` by SIGALRM: a hostile value can cost
    quadratic time to build (dict keys whose hashes all collide), and the decoder
    builds containers in Python, where the signal's handler gets to run."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise WireTimeout("deadline passed")
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        return decode_plain(data, max_bytes)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def read_frame(
    fd: int, *, max_bytes: int, deadline: float | None = None, timed: bool = False
) -> Any:
    """The next frame's value; `WireError` on EOF, oversize or garbage.

    `timed` (a single-threaded reader's main thread only, the harness): decoding too
    ends at `deadline`, by SIGALRM.
    """
    header = _read_exact(fd, _HEADER.size, deadline)
    return _payload(fd, header, max_bytes, deadline, timed)


def recv_fds_frame(
    sock: socket.socket, *, max_bytes: int, max_fds: int
) -> tuple[Any, list[int]]:
    """The next frame from a Unix socket with the descriptors sent along with it."""
    header, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
    if len(header) < _HEADER.size and header:
        header += _read_exact(sock.fileno(), _HEADER.size - len(header), None)
    if not header:
        raise WireError("channel closed")
    try:
        return _payload(sock.fileno(), header, max_bytes, None, False), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
