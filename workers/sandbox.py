"""A long-lived, killable child process that grades one item at a time.

The parent enforces a wall-clock deadline and a memory cap per item; past either it
kills the child with SIGKILL, answers `timeout`/`memory_limit`, and forks a fresh one.

Why `os.fork` and not multiprocessing: stdlib multiprocessing refuses to start children
from daemonic Celery prefork processes; a plain fork works everywhere, and because the
parent has already imported the verifier, every child starts warm (~ms, no re-import).
Why no SIGALRM: no signal interrupts a big-integer power inside GMP; only SIGKILL of a
separate process bounds it. The parent sends a chunk of items in one frame; the child
answers one frame per item, and the parent waits for each with `poll` under that item's
own deadline (which starts when the previous answer arrived), sampling the child's RSS
meanwhile. On a kill the rest of the chunk is re-sent to a fresh child.

`item_memory_bytes` is the memory one item may use *above the warm child's baseline*
(the parent's size at fork time): RLIMIT_AS in the child is baseline VM + cap, and the
parent kills the child once its RSS exceeds baseline RSS + cap.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from enum import Enum
from types import TracebackType
from typing import Any

from workers import verifier
from workers.childproc import encode_frame, write_all
from workers.errors import SandboxError
from workers.models import GradeOptions, Status, Verdict
from workers.sandbox_child import ChildProcess, GradeFn, death_status, spawn_child
from workers.sizing import SANDBOX_FRAME_ITEMS
from workers.verdicts import failure_verdict

__all__ = ["GradeFn", "Sandbox", "warm_up_verifier"]

log = logging.getLogger(__name__)

_READ_CHUNK_BYTES = 1 << 16


# Answers that reach every lazily imported path of the verifier (SymPy included).
_WARM_UP_PAIRS = (
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{\\frac{\\sqrt{8}}{2}}", "\\sqrt{2}"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{(1, 2]}", "(1,2]"),
    ("\\boxed{x \\ge 2}", "2 \\le x"),
)
_warmed_up = False


def warm_up_verifier() -> None:
    """Grade a few answers in this process so forked children start fully warm.

    The verifier imports SymPy lazily; without this, every fresh child (after each
    recycle or kill) would pay that import, 0.3 s or more, inside an item's deadline.
    """
    global _warmed_up
    if _warmed_up:
        return
    _warmed_up = True
    for response, gold in _WARM_UP_PAIRS:
        try:
            verifier.grade(response, gold)
        except Exception:  # a verifier bug here only costs warmth, logged not hidden
            log.exception("verifier warm-up failed on %r", response)


class _Outcome(Enum):
    REPLY = "reply"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    DIED = "died"


def _verdict_or_none(reply: Any) -> Verdict | None:
    if not (isinstance(reply, dict) and isinstance(reply.get("v"), dict)):
        return None
    try:
        return Verdict.from_dict(reply["v"])
    except (KeyError, TypeError, ValueError):  # malformed: handled by the caller
        return None


class Sandbox:
    """One killable child process grading one item at a time under hard limits.

    Args:
        item_timeout_s: wall-clock deadline per item.
        item_memory_bytes: memory an item may use above the child's warm baseline.
        recycle_after_items: replace the child after this many graded items.
        on_restart: called with "timeout", "memory", "crash" or "recycle" whenever
            a child is replaced.
        grade_fn: the function run in the child (default `workers.verifier.grade`).
        address_space_bytes: RLIMIT_AS headroom above the baseline (default
            `item_memory_bytes`).
        rss_poll_interval_s: how often the parent samples the child's RSS while waiting.
        warm_up: before the first fork, grade a few answers in this process so that
            every child starts with the verifier's lazy imports (SymPy) done.

    Not thread-safe: one caller at a time (one Sandbox per worker process).
    """

    def __init__(
        self,
        *,
        item_timeout_s: float,
        item_memory_bytes: int,
        recycle_after_items: int = 500,
        on_restart: Callable[[str], None] | None = None,
        grade_fn: GradeFn | None = None,
        address_space_bytes: int | None = None,
        rss_poll_interval_s: float = 0.01,
        warm_up: bool = True,
    ) -> None:
        if item_timeout_s <= 0 or item_memory_bytes <= 0 or recycle_after_items < 1:
            raise ValueError(
                "item_timeout_s, item_memory_bytes, recycle_after_items > 0"
            )
        self._timeout_s = item_timeout_s
        self._memory_bytes = item_memory_bytes
        self._as_headroom = address_space_bytes or item_memory_bytes
        self._recycle_after = recycle_after_items
        self._on_restart = on_restart
        self._grade_fn: GradeFn = grade_fn or verifier.grade
        self._poll_ms = rss_poll_interval_s * 1000.0
        self._warm_up = warm_up
        self._last_options: tuple[GradeOptions | None, dict[str, Any]] = (None, {})
        self._child: ChildProcess | None = None

    @property
    def child_pid(self) -> int | None:
        """The running child's pid (None before the first item and after close)."""
        return None if self._child is None else self._child.pid

    def grade(self, response: str, gold: str, options: GradeOptions) -> Verdict:
        """Grade one item in the child; never raises for anything the item does."""
        return self.grade_many_timed([(response, gold)], options)[0][0]

    def grade_many(
        self, pairs: Sequence[tuple[str, str]], options: GradeOptions
    ) -> list[Verdict]:
        """Grade (response, gold) pairs in order, each under its own deadline."""
        return [verdict for verdict, _s in self.grade_many_timed(pairs, options)]

    def grade_many_timed(
        self, pairs: Sequence[tuple[str, str]], options: GradeOptions
    ) -> list[tuple[Verdict, float]]:
        """Like `grade_many`, with each item's grading time in seconds."""
        results: list[tuple[Verdict, float]] = []
        wire_options = self._wire_options(options)
        solo_until = 0  # after a failed send, items go one by one to find the culprit
        while len(results) < len(pairs):
            start = len(results)
            size = 1 if start < solo_until else SANDBOX_FRAME_ITEMS
            chunk = pairs[start : start + min(size, self._recycle_budget())]
            failure = self._send(encode_frame({"o": wire_options, "items": chunk}))
            if failure is not None and len(chunk) > 1:
                solo_until = start + len(chunk)
            elif failure is not None:
                status, reason = failure
                response, gold = chunk[0]
                verdict = failure_verdict(status, reason, response, gold, options)
                results.append((verdict, 0.0))
            elif not self._stream_or_close(chunk, options, results):
                solo_until = start + len(chunk)
        return results

    def close(self) -> None:
        """Kill and reap the child (idempotent)."""
        if self._child is not None:
            self._child.kill_and_reap()
            self._child = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals ---

    def _wire_options(self, options: GradeOptions) -> dict[str, Any]:
        # asdict() is costly next to a lookup; callers pass the same options object
        # item after item.
        if options is not self._last_options[0]:
            self._last_options = (options, options.to_dict())
        return self._last_options[1]

    def _recycle_budget(self) -> int:
        """Items the current child may still grade before it is recycled."""
        done = 0 if self._child is None else self._child.items_done
        return self._recycle_after - done

    def _replace_child(self, reason: str) -> None:
        if self._child is not None:
            self._child.kill_and_reap()
            self._child = None
        if self._on_restart is not None:
            self._on_restart(reason)

    def _live_child(self) -> ChildProcess:
        """The child, replaced first if it died between items (killed from outside)."""
        if self._child is not None and self._child.exited():
            self._child = None
            if self._on_restart is not None:
                self._on_restart("crash")
        if self._child is None:
            if self._warm_up:
                warm_up_verifier()
            self._child = spawn_child(
                self._grade_fn, self._memory_bytes, self._as_headroom
            )
        return self._child

    def _send(self, frame: bytes) -> tuple[Status, str] | None:
        """Send a chunk to a live child; (status, reason) if that failed."""
        try:
            child = self._live_child()
        except (SandboxError, OSError) as exc:
            return Status.ERROR, f"cannot start the sandbox child: {exc}"
        try:
            write_all(child.req_fd, frame)
        except BrokenPipeError:  # it died receiving this chunk (too big for RLIMIT_AS?)
            status, reason, restart = self._failed(child, _Outcome.DIED)
            self._replace_child(restart)
            return status, reason
        return None

    def _stream_or_close(
        self,
        chunk: Sequence[tuple[str, str]],
        options: GradeOptions,
        results: list[tuple[Verdict, float]],
    ) -> bool:
        assert self._child is not None
        try:
            return self._stream(self._child, chunk, options, results)
        except BaseException:
            # Interrupted (a Celery soft time limit, Ctrl-C): the child may still owe
            # answers for this chunk, which the next call would misread.
            self.close()
            raise

    def _stream(
        self,
        child: ChildProcess,
        chunk: Sequence[tuple[str, str]],
        options: GradeOptions,
        results: list[tuple[Verdict, float]],
    ) -> bool:
        """Collect the chunk's answers until it ends or the child has to go.

        Returns False if the child died before confirming it received a multi-item
        chunk (too big for its memory cap?): no item is blamed, the caller retries
        them one by one.
        """
        if len(chunk) > 1 and not self._received(child):
            return False
        previous = time.perf_counter()
        for response, gold in chunk:
            outcome, reply = self._await_reply(child)
            now = time.perf_counter()
            duration_s, previous = now - previous, now
            if outcome is _Outcome.REPLY:
                verdict, child_kept = self._from_reply(
                    child, reply, response, gold, options
                )
            else:
                status, reason, restart = self._failed(child, outcome)
                self._replace_child(restart)
                verdict = failure_verdict(status, reason, response, gold, options)
                child_kept = False
            results.append((verdict, duration_s))
            if not child_kept:
                break
        return True

    def _received(self, child: ChildProcess) -> bool:
        outcome, reply = self._await_reply(child)
        if outcome is _Outcome.REPLY and isinstance(reply, dict) and "ack" in reply:
            return True
        if outcome is _Outcome.REPLY:
            self._replace_child("crash")
        else:
            _status, _reason, restart = self._failed(child, outcome)
            self._replace_child(restart)
        return False

    def _await_reply(self, child: ChildProcess) -> tuple[_Outcome, Any]:
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                reply = child.buffer.pop()
            except ValueError:  # undecodable: reported as a malformed reply
                return _Outcome.REPLY, "malformed"
            if reply is not None:
                return _Outcome.REPLY, reply
            remaining_ms = (deadline - time.monotonic()) * 1000.0
            if remaining_ms <= 0:
                return _Outcome.TIMEOUT, None
            if child.poller.poll(min(remaining_ms, self._poll_ms)):
                data = os.read(child.resp_fd, _READ_CHUNK_BYTES)
                if not data:
                    return _Outcome.DIED, None
                child.buffer.feed(data)
            elif child.rss_bytes() > child.rss_cap_bytes:
                return _Outcome.MEMORY, None

    def _failed(
        self, child: ChildProcess, outcome: _Outcome
    ) -> tuple[Status, str, str]:
        """Status, reason and restart reason for an item whose child must go."""
        if outcome is _Outcome.TIMEOUT:
            reason = f"exceeded the {self._timeout_s:g} s item deadline"
            return Status.TIMEOUT, reason, "timeout"
        if outcome is _Outcome.MEMORY:
            reason = f"exceeded the {self._memory_bytes / 2**20:g} MiB item memory cap"
            return Status.MEMORY_LIMIT, reason, "memory"
        status, reason = death_status(child.reap())
        self._child = None
        return status, reason, "memory" if status is Status.MEMORY_LIMIT else "crash"

    def _from_reply(
        self,
        child: ChildProcess,
        reply: Any,
        response: str,
        gold: str,
        options: GradeOptions,
    ) -> tuple[Verdict, bool]:
        """The item's verdict, and whether the child stays for the next item."""
        child.items_done += 1
        verdict = _verdict_or_none(reply)
        if verdict is None and isinstance(reply, dict) and "exc" in reply:
            reason = f"grader raised {reply['exc']}"
            verdict = failure_verdict(Status.ERROR, reason, response, gold, options)
        if verdict is None:
            memory = isinstance(reply, dict) and reply.get("mem") is True
            self._replace_child("memory" if memory else "crash")
            status = Status.MEMORY_LIMIT if memory else Status.ERROR
            reason = (
                "grader raised MemoryError (RLIMIT_AS)"
                if memory
                else "malformed sandbox reply"
            )
            return failure_verdict(status, reason, response, gold, options), False
        if child.items_done >= self._recycle_after:
            self._replace_child("recycle")
            return verdict, False
        return verdict, True
