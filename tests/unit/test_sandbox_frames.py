"""Length-prefixed JSON frames between forked processes (workers.sandbox.childproc)."""

from __future__ import annotations

import os

from workers.sandbox.childproc import FrameBuffer, encode_frame, read_frame, write_frame

MESSAGES = [
    {"r": "text \\boxed{½} \ud800 end", "g": "1/2"},
    {"items": [["a" * 200_000, "b"]], "o": {"rel_tol": 1e-6}},
    [],
    {"big": 2**70, "neg": -(2**64), "text": "é \U0001d400"},  # beyond 64 bits
    {"v": {"correct": True, "extracted": None, "reason": ""}, "k": 12},
]


def test_frames_survive_byte_by_byte_delivery() -> None:
    buffer = FrameBuffer()
    stream = b"".join(encode_frame(message) for message in MESSAGES)
    popped = []
    for i in range(0, len(stream), 7):
        buffer.feed(stream[i : i + 7])
        while (message := buffer.pop()) is not None:
            popped.append(message)
    assert popped == MESSAGES
    assert buffer.pop() is None


def test_frames_over_a_pipe_until_end_of_file() -> None:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer: leaves through os._exit only
        code = 1
        try:
            os.close(read_fd)
            for message in MESSAGES:
                write_frame(write_fd, message)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    received = []
    while (message := read_frame(read_fd)) is not None:
        received.append(message)
    os.close(read_fd)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert received == MESSAGES


def test_frames_keep_every_value_exactly() -> None:
    # Integers beyond 64 bits and lone surrogates come back as they went, not as
    # floats or errors (the fast encoder refuses both; the stdlib carries them).
    for message in MESSAGES:
        buffer = FrameBuffer()
        buffer.feed(encode_frame(message))
        got = buffer.pop()
        assert got == message
        assert repr(got) == repr(message)
