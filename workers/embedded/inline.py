"""Grading in this very process, watched from outside: the embedded pool's worker.

The fleet's `Sandbox` puts a child process between each item and the process that
owns the batch, because a Celery prefork child must survive an item that hangs or
bloats. In the embedded pool the worker process itself can be that killable process:
its parent (the CLI) owns the batches, re-sends what a lost worker held, and can
enforce the same limits from outside. That saves a process hop per item: every
rollout used to cross two pipes each way and be encoded four times (issue 11).

How the limits hold without the extra process:
- deadline: before each step of an item (prepare, then decide) the worker writes
  (batch, position, step, start time) into a `ProgressSlot`, a few bytes of memory
  shared with the parent; the parent reads it while it waits for answers and
  SIGKILLs the worker once one step has run past the item deadline. A signal handler
  could not do this: no signal interrupts a big-integer power inside GMP; SIGKILL
  always works.
- memory: the worker runs under RLIMIT_AS (its size when it starts + the cap), so a
  big allocation fails at once with MemoryError: the worker then exits with
  `EXIT_MEMORY` and the item in its slot is answered `memory_limit`; the parent also
  samples the worker's RSS and kills it past its baseline + the cap.
- crash: an item that kills the worker (abort, segfault) is found in the slot too.
The parent answers the item in the slot (with its extraction if it failed deciding;
without, if preparing it failed: preparing it again could fail the same way) and
sends the rest of the batch again.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence

from workers import verifier
from workers.kinds import DEFAULT_KIND, grader_for
from workers.models import GradeOptions, Status
from workers.sandbox.child import EXIT_MEMORY, decide_item
from workers.sandbox.process import GradeFn, ItemPrep, ItemResult, Selector
from workers.sandbox.progress import CODE, DECIDE, PREPARE, ProgressSlot
from workers.sandbox.verdicts import grader_raised_reason, unprepared_failure_verdict

__all__ = ["InlineGrader"]


class InlineGrader:
    """`Sandbox.grade_selected` in this process, each step marked in `slot`.

    A verifier bug (an exception) is the item's `error` verdict, as in the sandbox
    child; a MemoryError ends the process with `EXIT_MEMORY` (its heap is suspect
    after one), leaving the item in the slot for the parent to answer.
    """

    def __init__(self, slot: ProgressSlot, grade_fn: GradeFn | None = None) -> None:
        self._slot = slot
        # None: decide with the verifier what was prepared (grade() is exactly that).
        self._grade_fn = (
            None if grade_fn is grader_for(DEFAULT_KIND).grade else grade_fn
        )
        self.batch = -1  # the batch being graded, for the slot
        # What the slot calls position p of the pairs graded (None: p itself); a
        # unit of lines numbers its items across all its grading calls.
        self.positions: Sequence[int] | None = None

    def begin_code(self, position: int) -> None:
        """Item `position` is being graded as code (the parent allows it the code
        grader's wall budget, `CODE` step)."""
        where = self.positions
        self._slot.begin(self.batch, where[position] if where else position, CODE)

    @contextlib.contextmanager
    def narrowed(self, positions: Sequence[int]) -> Iterator[None]:
        """Within: `grade_selected` gets only the items at `positions` of the batch
        (the others are code items), and marks the slot with their own positions."""
        saved = self.positions
        self.positions = [saved[p] for p in positions] if saved else list(positions)
        try:
            yield
        finally:
            self.positions = saved

    def grade_selected(
        self, pairs: Sequence[tuple[str, str]], options: GradeOptions, select: Selector
    ) -> list[ItemResult]:
        """Prepare every pair, then decide those `select` picks (see `Sandbox`)."""
        begin, batch, clock = self._slot.begin, self.batch, time.perf_counter
        where = self.positions or range(len(pairs))
        results: list[ItemResult | None] = [None] * len(pairs)
        prepared: list[tuple[int, verifier.Prepared, float]] = []
        for position, (response, gold) in enumerate(pairs):
            begin(batch, where[position], PREPARE)
            started = clock()
            try:
                prep = verifier.prepare(response, gold, options=options)
            except MemoryError:
                os._exit(EXIT_MEMORY)
            except Exception as exc:  # a grader bug: this item's verdict, not a crash
                reason = grader_raised_reason(type(exc).__name__)
                verdict = unprepared_failure_verdict(Status.ERROR, reason)
                results[position] = ItemResult(None, verdict, clock() - started)
                continue
            prepared.append((position, prep, clock() - started))
        preps = [
            ItemPrep(p.decision_key, p.extracted, p.extraction_method, p.format_valid)
            for _position, p, _s in prepared
        ]
        picks = select([position for position, _p, _s in prepared], preps)
        for (position, prep, prepare_s), own, pick in zip(
            prepared, preps, picks, strict=True
        ):
            if not pick:
                results[position] = ItemResult(own, None, prepare_s)
                continue
            begin(batch, where[position], DECIDE)
            started = clock()
            try:
                verdict = decide_item(self._grade_fn, prep, pairs[position], options)
            except MemoryError:
                os._exit(EXIT_MEMORY)
            except Exception as exc:
                reason = grader_raised_reason(type(exc).__name__)
                verdict = verifier.verdict_from(
                    prep, status=Status.ERROR, reason=reason
                )
                results[position] = ItemResult(own, verdict, clock() - started)
                continue
            results[position] = ItemResult(own, verdict, prepare_s + clock() - started)
        done = [result for result in results if result is not None]
        assert len(done) == len(pairs)
        return done
