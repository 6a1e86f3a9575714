"""A long-lived, killable child process that grades one item at a time.

The parent enforces a wall-clock deadline and a memory cap per item; past either it
kills the child with SIGKILL, answers `timeout`/`memory_limit`, and forks a fresh one.

Why `os.fork` and not multiprocessing: stdlib multiprocessing refuses to start children
from daemonic Celery prefork processes; a plain fork works everywhere, and because the
parent has already imported the verifier, every child starts warm (~ms, no re-import).
Why no SIGALRM: no signal interrupts a big-integer power inside GMP; only SIGKILL of a
separate process bounds it. The parent sends a chunk of items in one frame; the child
prepares each (extraction and parsing: bounded string work) and answers with every
decision key in one frame, the parent picks the items still to decide (not in its
cache, not a duplicate) and the child decides those, marking each in a
`ProgressSlot` as it starts and answering in frames of several (one per 20 ms of
deciding, and one at the end). The parent waits for the answers with `poll`,
sampling the child's RSS, under a deadline per item that runs from the start the
slot shows (a chunk's preparing gets one deadline, and should it fail, the chunk's
items are sent again one by one). On a kill the item in the slot is answered and
the chunk's unanswered items are re-sent to a fresh child.

`item_memory_bytes` is the memory one item may use *above the warm child's baseline*
(the parent's size at fork time): RLIMIT_AS in the child is baseline VM + cap, and the
parent kills the child once its RSS exceeds baseline RSS + cap.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Any, NamedTuple

from workers.errors import SandboxError
from workers.kinds import DEFAULT_KIND, grader_for
from workers.models import (
    EXTRACTION_METHOD_BY_VALUE,
    ExtractionMethod,
    GradeOptions,
    Status,
    Verdict,
)
from workers.sandbox.child import ChildProcess, GradeFn, death_status, spawn_child
from workers.sandbox.childproc import encode_frame, write_all
from workers.sandbox.progress import Step
from workers.sandbox.verdicts import (
    MEMORY_ERROR_REASON,
    culprit_verdict,
    deadline_reason,
    grader_raised_reason,
    memory_cap_reason,
)
from workers.sizing import RECYCLE_AFTER_ITEMS, SANDBOX_FRAME_ITEMS

__all__ = [
    "GradeFn",
    "ItemPrep",
    "ItemResult",
    "Sandbox",
    "Selector",
    "warm_up_verifier",
]

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
    grade = grader_for(DEFAULT_KIND).grade
    for response, gold in _WARM_UP_PAIRS:
        try:
            grade(response, gold)
        except Exception:  # a verifier bug here only costs warmth, logged not hidden
            log.exception("verifier warm-up failed on %r", response)


class _Outcome(Enum):
    REPLY = "reply"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    DIED = "died"


def _verdict_or_none(answer: list[Any]) -> Verdict | None:
    """The verdict of a decided item's answer ([seconds, *verdict row])."""
    try:
        return Verdict.from_row(answer[1:])
    except (TypeError, ValueError):  # malformed: handled by the caller
        return None


class ItemPrep(NamedTuple):
    """What the child found preparing one item: its decision key (None: never
    cached) and the item's own verdict fields. (A tuple: built once a rollout, in
    a third of a frozen dataclass's time.)"""

    decision_key: str | None
    extracted: str | None
    extraction_method: ExtractionMethod
    format_valid: bool


@dataclass(slots=True)
class ItemResult:
    """One item's outcome: `verdict` None when `select` skipped it; `prep` None
    when it failed before it was prepared."""

    prep: ItemPrep | None
    verdict: Verdict | None
    duration_s: float = 0.0


Selector = Callable[[Sequence[int], Sequence[ItemPrep]], Sequence[bool]]


def _deciding(child: ChildProcess, first: int | None) -> Step | None:
    """The item the child's slot shows it deciding, if not one answered before
    `first` (None: not deciding)."""
    if first is None:
        return None
    step = child.slot.current()
    return None if step is None or step.position < first else step


def _seconds(value: Any) -> float:
    """A duration the child reported (0.0 when it sent none)."""
    return float(value) if isinstance(value, int | float) else 0.0


def _decide_all(positions: Sequence[int], preps: Sequence[ItemPrep]) -> list[bool]:
    return [True] * len(positions)


def _prep_or_none(reply: Any) -> ItemPrep | None:
    """A prepared item's answer: [decision key, extracted, method, format valid]."""
    if not (isinstance(reply, list) and len(reply) == 4):
        return None
    key, extracted, method, valid = reply
    if not (key is None or isinstance(key, str)):
        return None
    if not (extracted is None or isinstance(extracted, str)):
        return None
    member = EXTRACTION_METHOD_BY_VALUE.get(method) if isinstance(method, str) else None
    if member is None:
        return None
    return ItemPrep(key, extracted, member, valid is True)


@dataclass(slots=True)
class _ChunkRun:
    """One chunk on its way through the child, and where its answers go."""

    pairs: Sequence[tuple[str, str]]
    options: GradeOptions
    chunk: list[int]
    results: list[ItemResult | None]
    chosen: set[int]

    def fail(
        self,
        position: int,
        status: Status,
        reason: str,
        seconds: float,
        *,
        prepared: bool,
    ) -> None:
        """Answer an item that failed (see `culprit_verdict`)."""
        verdict = culprit_verdict(
            status, reason, self.pairs[position], self.options, prepared=prepared
        )
        self.results[position] = ItemResult(None, verdict, seconds)

    def unanswered(self) -> list[int]:
        return [position for position in self.chunk if self.results[position] is None]


class Sandbox:
    """One killable child process grading one item at a time under hard limits.

    Args:
        item_timeout_s: wall-clock deadline per item.
        item_memory_bytes: memory an item may use above the child's warm baseline.
        recycle_after_items: replace the child after this many graded items, or
            sooner once its RSS has grown `RECYCLE_GROWN_SHARE` of the cap.
        on_restart: called with "timeout", "memory", "crash" or "recycle" whenever
            a child is replaced.
        grade_fn: run in the child instead of the verifier's decision (tests inject
            hostile ones); the verifier still prepares every item.
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
        recycle_after_items: int = RECYCLE_AFTER_ITEMS,
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
        # None: the child decides with the verifier what it prepared.
        self._grade_fn = (
            None if grade_fn is grader_for(DEFAULT_KIND).grade else grade_fn
        )
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
        results = self.grade_selected(pairs, options, _decide_all)
        timed: list[tuple[Verdict, float]] = []
        for result in results:
            assert result.verdict is not None  # every item was selected
            timed.append((result.verdict, result.duration_s))
        return timed

    def grade_selected(
        self, pairs: Sequence[tuple[str, str]], options: GradeOptions, select: Selector
    ) -> list[ItemResult]:
        """Prepare every pair in the child, then decide those `select` picks.

        `select(positions, preps)` is called once per chunk with the items the child
        has prepared (positions in `pairs`) and returns, per item, whether to decide
        it; an item it skips comes back with its `prep` and no verdict (the caller
        has one from its cache or from a duplicate). An item that failed (deadline,
        memory cap, crash) comes back with a failure verdict, its `prep` None when
        it failed before being prepared. Each step of an item has the item deadline.
        """
        results: list[ItemResult | None] = [None] * len(pairs)
        chosen: set[int] = set()  # selected once: decided even if re-sent
        pending = deque(range(len(pairs)))
        solo = 0  # after a failed send, items go one by one to find the culprit
        while pending:
            if self._recycle_budget() < 1:  # never an empty chunk
                self._replace_child("recycle")
            size = 1 if solo else SANDBOX_FRAME_ITEMS
            take = min(size, self._recycle_budget(), len(pending))
            chunk = [pending.popleft() for _ in range(take)]
            solo = max(0, solo - len(chunk))
            run = _ChunkRun(pairs, options, chunk, results, chosen)
            retry, go_solo = self._run_or_close(run, select)
            pending.extendleft(reversed(retry))
            if go_solo:
                solo = len(retry)
        done = [result for result in results if result is not None]
        assert len(done) == len(pairs)
        return done

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
        """Send a frame to a live child; (status, reason) if that failed."""
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

    def _run_or_close(self, run: _ChunkRun, select: Selector) -> tuple[list[int], bool]:
        try:
            return self._run_chunk(run, select)
        except BaseException:
            # Interrupted (a Celery soft time limit, Ctrl-C): the child may still owe
            # answers for this chunk, which the next call would misread.
            self.close()
            raise

    def _run_chunk(self, run: _ChunkRun, select: Selector) -> tuple[list[int], bool]:
        """Prepare, select, decide one chunk. Returns the positions to send again
        (their child was lost before answering for them) and whether to send them
        one by one (the child died before confirming it received the chunk)."""
        items = [run.pairs[position] for position in run.chunk]
        wire_options = self._wire_options(run.options)
        failure = self._send(encode_frame({"o": wire_options, "items": items}))
        if failure is not None:
            if len(run.chunk) > 1:
                return run.chunk, True
            run.fail(run.chunk[0], *failure, 0.0, prepared=False)
            return [], False
        child = self._child
        assert child is not None
        prepared = self._prepare_step(child, run)
        if prepared is None:  # the child is gone: the unanswered items go again,
            # one by one if the chunk failed as a whole
            return run.unanswered(), len(run.unanswered()) == len(run.chunk) > 1
        wanted = self._select(run, prepared, select)
        indexes = [index for index, _position, _prep, _s in wanted]
        try:  # to this child: a fresh one would not hold the prepared items
            write_all(child.req_fd, encode_frame({"d": indexes}))
        except BrokenPipeError:  # it died between the steps: the items go again
            self._replace_child("crash")
            return run.unanswered(), False
        if not self._decide_step(child, run, wanted):
            return run.unanswered(), False
        if (
            child.items_done >= self._recycle_after
            or child.rss_bytes() > child.recycle_rss_bytes
        ):
            self._replace_child("recycle")
        return [], False

    def _prepare_step(
        self, child: ChildProcess, run: _ChunkRun
    ) -> list[tuple[int, int, ItemPrep, float]] | None:
        """(index in chunk, position, prep, seconds) per prepared item; None if the
        child had to go (a lone item that failed has its failure verdict).

        Preparing is bounded string work (no SymPy), so the child answers for the
        whole chunk in one frame, under one item deadline: one wake-up here per
        chunk, not per item. Should a chunk's preparing fail anyway, no item can be
        blamed; the caller sends its items again one by one, each then with a
        deadline of its own.
        """
        started = time.perf_counter()
        outcome, reply = self._await_reply(child, self._timeout_s)
        duration_s = time.perf_counter() - started
        entries = reply.get("p") if isinstance(reply, dict) else None
        if outcome is not _Outcome.REPLY or not isinstance(entries, list):
            if outcome is _Outcome.REPLY:
                status, reason, restart = (
                    Status.ERROR,
                    "malformed sandbox reply",
                    "crash",
                )
            else:
                status, reason, restart = self._failed(child, outcome)
            self._replace_child(restart)
            if len(run.chunk) == 1:
                run.fail(run.chunk[0], status, reason, duration_s, prepared=False)
            return None
        each_s = duration_s / len(run.chunk)
        prepared: list[tuple[int, int, ItemPrep, float]] = []
        for index, position in enumerate(run.chunk):
            entry = entries[index] if index < len(entries) else None
            child.items_done += 1
            prep = _prep_or_none(entry)
            if prep is not None:
                prepared.append((index, position, prep, each_s))
                continue
            if isinstance(entry, dict) and "exc" in entry:  # the child stays
                reason = grader_raised_reason(entry["exc"])
                run.fail(position, Status.ERROR, reason, each_s, prepared=False)
                continue
            self._lost_on_reply(run, position, entry, each_s, prepared=False)
            return None
        return prepared

    def _select(
        self,
        run: _ChunkRun,
        prepared: list[tuple[int, int, ItemPrep, float]],
        select: Selector,
    ) -> list[tuple[int, int, ItemPrep, float]]:
        """The prepared items to decide: those chosen before (sent again after a
        lost child), and those `select` picks now; the others are answered."""
        fresh = [entry for entry in prepared if entry[1] not in run.chosen]
        picks = select([e[1] for e in fresh], [e[2] for e in fresh])
        picked = {e[1] for e, pick in zip(fresh, picks, strict=True) if pick}
        run.chosen.update(picked)
        wanted = []
        for entry in prepared:
            _index, position, prep, duration_s = entry
            if position in run.chosen:
                wanted.append(entry)
            else:
                run.results[position] = ItemResult(prep, None, duration_s)
        return wanted

    def _decide_step(
        self,
        child: ChildProcess,
        run: _ChunkRun,
        wanted: list[tuple[int, int, ItemPrep, float]],
    ) -> bool:
        """Collect the verdicts of `wanted`; False if the child had to go first.

        The child answers in frames of several items (`_decide_chunk`) and marks
        each item in its `ProgressSlot` as it starts: each gets a full deadline of
        its own from that moment (preparing is bounded string work, and a fresh
        child's first items, page faults over the warm heap, must not eat into the
        time an innocent item gets), and an item that outruns it, bloats or kills
        the child is the one in the slot. The items it decided since its last
        frame are lost with it and sent again.
        """
        got = 0
        while got < len(wanted):
            outcome, reply = self._await_reply(child, self._timeout_s, first=got)
            if outcome is not _Outcome.REPLY:
                step = _deciding(child, got)
                k = got if step is None else min(step.position, len(wanted) - 1)
                seconds = self._timeout_s if step is None else step.seconds
                status, reason, restart = self._failed(child, outcome)
                self._replace_child(restart)
                _index, position, _prep, prepare_s = wanted[k]
                run.fail(position, status, reason, prepare_s + seconds, prepared=True)
                return False
            answers = reply.get("v") if isinstance(reply, dict) else None
            if (
                not isinstance(answers, list)
                or not 0 < len(answers) <= len(wanted) - got
            ):
                self._lost_on_reply(run, wanted[got][1], reply, 0.0, prepared=True)
                return False
            for answer in answers:
                _index, position, prep, prepare_s = wanted[got]
                got += 1
                verdict = None
                if isinstance(answer, list) and answer:
                    verdict = _verdict_or_none(answer)
                if verdict is not None:
                    duration_s = prepare_s + _seconds(answer[0])
                    run.results[position] = ItemResult(prep, verdict, duration_s)
                elif isinstance(answer, dict) and "exc" in answer:  # the child stays
                    reason = grader_raised_reason(answer["exc"])
                    duration_s = prepare_s + _seconds(answer.get("s"))
                    run.fail(position, Status.ERROR, reason, duration_s, prepared=True)
                else:
                    self._lost_on_reply(run, position, answer, prepare_s, prepared=True)
                    return False
        return True

    def _lost_on_reply(
        self,
        run: _ChunkRun,
        position: int,
        reply: Any,
        duration_s: float,
        *,
        prepared: bool,
    ) -> None:
        """A MemoryError (RLIMIT_AS) or a malformed reply: the child goes."""
        memory = isinstance(reply, dict) and reply.get("mem") is True
        self._replace_child("memory" if memory else "crash")
        if memory:
            reason, status = MEMORY_ERROR_REASON, Status.MEMORY_LIMIT
        else:
            reason, status = "malformed sandbox reply", Status.ERROR
        run.fail(position, status, reason, duration_s, prepared=prepared)

    def _await_reply(
        self, child: ChildProcess, timeout_s: float, *, first: int | None = None
    ) -> tuple[_Outcome, Any]:
        """The child's next reply, or why none came in time: within `timeout_s`
        of now or, deciding (`first`: the first item not answered yet), of the
        start of the item the child's slot shows (of now while it shows none, or
        one it has answered)."""
        waited_from = time.monotonic()
        while True:
            try:
                reply = child.buffer.pop()
            except ValueError:  # undecodable: reported as a malformed reply
                return _Outcome.REPLY, "malformed"
            if reply is not None:
                return _Outcome.REPLY, reply
            step = _deciding(child, first)
            elapsed_s = time.monotonic() - waited_from if step is None else step.seconds
            remaining_ms = (timeout_s - elapsed_s) * 1000.0
            if remaining_ms <= 0:
                return _Outcome.TIMEOUT, None
            wait_ms = min(remaining_ms, self._poll_ms)
            if child.poller.poll(wait_ms):
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
            return Status.TIMEOUT, deadline_reason(self._timeout_s), "timeout"
        if outcome is _Outcome.MEMORY:
            reason = memory_cap_reason(self._memory_bytes)
            return Status.MEMORY_LIMIT, reason, "memory"
        status, reason = death_status(child.reap())
        self._child = None
        return status, reason, "memory" if status is Status.MEMORY_LIMIT else "crash"
