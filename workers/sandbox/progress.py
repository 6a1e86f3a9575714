"""Which item a process is on and since when, in memory shared across fork.

A grading process marks here the start of each step of each item (the embedded
pool's worker: preparing and deciding) or of each decision (the fleet's sandbox
child, whose chunk is prepared under one deadline); its parent reads the slot while
it waits and kills the process once one step has run past the item deadline.
Writing the slot costs a fraction of a microsecond; a message per item over a pipe
cost several (issue 11), and no signal could stop a step anyway (none interrupts a
big-integer power inside GMP; SIGKILL of the process always works).
"""

from __future__ import annotations

import mmap
import struct
import time
from typing import NamedTuple

__all__ = ["CODE", "DECIDE", "PREPARE", "ProgressSlot", "Step"]

# batch id, position in the batch, step (PREPARE/DECIDE), step start
# (time.monotonic_ns; 0: idle)
_SLOT = struct.Struct("qqqq")
# CODE: grading a code item (its deadline is the code grader's wall budget).
PREPARE, DECIDE, CODE = 0, 1, 2


class Step(NamedTuple):
    """What a `ProgressSlot` says a worker is doing."""

    batch: int
    position: int  # in the batch
    step: int  # PREPARE, DECIDE or CODE
    seconds: float  # since the step began


class ProgressSlot:
    """Which item a worker is on and since when, in memory shared across fork.

    Created by the parent before it forks the worker (an anonymous shared mapping
    survives fork; no fd, so the worker's fd hygiene keeps it). One writer (the
    worker), one reader (the parent); the reader takes two equal reads in a row, so
    a write it raced with is never read half-done.
    """

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, _SLOT.size)

    def begin(self, batch: int, position: int, step: int) -> None:
        """The worker starts `step` of item `position` of `batch`."""
        _SLOT.pack_into(self._map, 0, batch, position, step, time.monotonic_ns())

    def idle(self) -> None:
        """The worker is between batches."""
        _SLOT.pack_into(self._map, 0, -1, -1, -1, 0)

    def current(self) -> Step | None:
        """The step the worker is on, or None when it is idle."""
        while True:
            first = _SLOT.unpack_from(self._map, 0)
            if _SLOT.unpack_from(self._map, 0) == first:
                break
        batch, position, step, started_ns = first
        if started_ns == 0:
            return None
        return Step(batch, position, step, (time.monotonic_ns() - started_ns) / 1e9)
