"""The sandbox's child process: its grading loop, and the parent's handle on it.

`spawn_child` forks a warm child (see `workers.sandbox.childproc` for the fork
hygiene) under RLIMIT_AS; `ChildProcess` is the parent's view: pipes, RSS sampling,
kill and reap.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from workers import verifier
from workers.models import GradeOptions, Status, Verdict
from workers.sandbox.childproc import (
    FrameBuffer,
    fork_child,
    limit_address_space,
    open_statm,
    read_frame,
    recycle_rss_bytes,
    self_size_bytes,
    statm_rss_bytes,
    write_frame,
)
from workers.sandbox.progress import DECIDE, ProgressSlot

__all__ = [
    "EXIT_MEMORY",
    "ChildProcess",
    "GradeFn",
    "death_status",
    "decide_item",
    "spawn_child",
]

# A grading process's exit status when a MemoryError (RLIMIT_AS) ended it: this
# child's, and the embedded pool's worker's (`workers.embedded.inline`); `death_status`
# reads it for both.
EXIT_MEMORY = 86
# How much deciding a child holds before it sends the answers (`_decide_chunk`).
_FLUSH_AFTER_S = 0.02


class GradeFn(Protocol):
    """A grading function run inside the child instead of the verifier's decision
    (tests inject hostile ones); the verifier still prepares each item."""

    def __call__(
        self, response: str, gold: str, *, options: GradeOptions | None = None
    ) -> Verdict: ...


# --- in the child (after fork_child's hygiene) ---


def _child_prepare(
    response: str, gold: str, options: GradeOptions
) -> tuple[verifier.Prepared | None, list[Any] | dict[str, Any]]:
    """The item's prepared form, and the answer that tells the parent its key:
    [decision key, extracted, extraction method, format valid]."""
    try:
        prepared = verifier.prepare(response, gold, options=options)
    except MemoryError:
        return None, {"mem": True}
    except Exception as exc:  # a grader bug becomes an `error` verdict, not a crash
        return None, {"exc": type(exc).__name__}
    return prepared, [
        prepared.decision_key,
        prepared.extracted,
        prepared.extraction_method.value,
        prepared.format_valid,
    ]


def decide_item(
    grade_fn: GradeFn | None,
    prepared: verifier.Prepared,
    item: tuple[str, str],
    options: GradeOptions,
) -> Verdict:
    """An item's verdict from what was prepared (None: the verifier decides, as
    grade() does; else `grade_fn` grades the texts)."""
    if grade_fn is None:
        return verifier.decide(prepared, options=options)
    return grade_fn(item[0], item[1], options=options)


def _child_decide(
    grade_fn: GradeFn | None,
    prepared: verifier.Prepared,
    item: tuple[str, str],
    options: GradeOptions,
) -> list[Any] | dict[str, Any]:
    """[seconds, *verdict row] (`Verdict.to_row`), or why there is no verdict."""
    started = time.perf_counter()
    try:
        verdict = decide_item(grade_fn, prepared, item, options)
    except MemoryError:
        return {"mem": True}
    except Exception as exc:  # a grader bug becomes an `error` verdict, not a crash
        return {"exc": type(exc).__name__, "s": time.perf_counter() - started}
    return [time.perf_counter() - started, *verdict.to_row()]


def _child_loop(
    req_fd: int,
    resp_fd: int,
    grade_fn: GradeFn | None,
    as_bytes: int,
    slot: ProgressSlot,
) -> int:
    """Serve chunks in two steps: prepare every item (one reply for the chunk, an
    entry per item with its decision key), then decide the items the parent asks
    for (`_decide_chunk`).

    The parent looks the keys up in its cache between the two steps, so no item is
    extracted twice and a cached or duplicate answer is never decided again.
    """
    limit_address_space(as_bytes)
    try:
        while (request := read_frame(req_fd)) is not None:
            options = GradeOptions.from_dict(request["o"])
            items = request["items"]
            prepared: list[verifier.Prepared | None] = []
            replies: list[list[Any] | dict[str, Any]] = []
            for response, gold in items:
                prep, reply = _child_prepare(response, gold, options)
                prepared.append(prep)
                replies.append(reply)
            write_frame(resp_fd, {"p": replies})  # one frame: preparing is bounded
            wanted = read_frame(req_fd)
            if wanted is None:
                return 0
            _decide_chunk(
                resp_fd, slot, grade_fn, prepared, items, wanted["d"], options
            )
    except MemoryError:
        return EXIT_MEMORY
    except BrokenPipeError:  # the parent went away
        return 0
    return 0


def _decide_chunk(
    resp_fd: int,
    slot: ProgressSlot,
    grade_fn: GradeFn | None,
    prepared: list[verifier.Prepared | None],
    items: list[tuple[str, str]],
    indexes: list[int],
    options: GradeOptions,
) -> None:
    """Decide the items at `indexes`, each marked in `slot` as it starts (the
    parent's deadline clock: deciding is where an item may hang); the answers go
    back in frames of those decided since the last, one once `_FLUSH_AFTER_S` has
    passed and one at the end. A fast chunk costs one frame, not one per item
    (issue 11), and a kill loses at most that long's work besides its culprit.
    The slot goes idle only after the last frame: until then it tells the parent
    which item is running."""
    answers: list[list[Any] | dict[str, Any]] = []
    flushed_at = time.monotonic()
    for position, index in enumerate(indexes):
        slot.begin(0, position, DECIDE)
        prep = prepared[index]
        if prep is None:  # never asked for by a well-behaved parent
            answers.append({"exc": "NotPrepared"})
            continue
        answer = _child_decide(grade_fn, prep, items[index], options)
        answers.append(answer)
        if isinstance(answer, dict) and answer.get("mem"):
            break  # the parent replaces this child, and sends the rest again
        if time.monotonic() - flushed_at >= _FLUSH_AFTER_S:
            write_frame(resp_fd, {"v": answers})
            answers, flushed_at = [], time.monotonic()
    if answers:
        write_frame(resp_fd, {"v": answers})
    slot.idle()


# --- in the parent ---


@dataclass(slots=True, kw_only=True)
class ChildProcess:
    """The parent's handle on one sandbox child."""

    pid: int
    req_fd: int
    resp_fd: int
    statm_fd: int
    rss_cap_bytes: int
    recycle_rss_bytes: int  # grown past this (after a chunk): replaced
    poller: Any
    slot: ProgressSlot  # the item the child is deciding, and since when
    buffer: FrameBuffer = field(default_factory=FrameBuffer)
    items_done: int = 0

    def rss_bytes(self) -> int:
        return statm_rss_bytes(self.statm_fd)

    def exited(self) -> bool:
        """True (and reaped, fds closed) if the child is already gone."""
        try:
            pid, _status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid = self.pid
        if pid == 0:
            return False
        self._close_fds()
        return True

    def kill_and_reap(self) -> int:
        """SIGKILL (if still running), reap, close our fds; returns the wait status."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return self.reap()

    def reap(self) -> int:
        try:
            _pid, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # already reaped (SIGCHLD ignored by the embedder)
            status = 0
        self._close_fds()
        return status

    def _close_fds(self) -> None:
        for fd in (self.req_fd, self.resp_fd, self.statm_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def spawn_child(
    grade_fn: GradeFn | None, item_memory_bytes: int, as_headroom: int
) -> ChildProcess:
    """Fork a child deciding with the verifier (or `grade_fn`, given one), capped at
    this process's size + headroom."""
    vm_bytes, rss_bytes = self_size_bytes()
    as_bytes = vm_bytes + as_headroom
    slot = ProgressSlot()  # before the fork: the child shares it
    pid, req_fd, resp_fd = fork_child(
        lambda req, resp: _child_loop(req, resp, grade_fn, as_bytes, slot)
    )
    statm_fd = open_statm(pid, "sandbox child")
    poller = select.poll()
    poller.register(resp_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return ChildProcess(
        pid=pid,
        req_fd=req_fd,
        resp_fd=resp_fd,
        statm_fd=statm_fd,
        rss_cap_bytes=rss_bytes + item_memory_bytes,
        recycle_rss_bytes=recycle_rss_bytes(statm_fd, item_memory_bytes),
        poller=poller,
        slot=slot,
    )


def death_status(status: int) -> tuple[Status, str]:
    """The verdict status and reason for a child that died with wait `status`."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return Status.ERROR, f"sandbox child killed by {name}"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    if code == EXIT_MEMORY:
        return Status.MEMORY_LIMIT, "sandbox child ran out of memory (RLIMIT_AS)"
    return Status.ERROR, f"sandbox child exited with status {code}"
