"""TEST-ONLY grading hooks: magic responses that hang, bloat or abort the sandbox child.

Lives in the test tree, not in the shipped package: a worker loads this file only
when `GRADEFLEET_TEST_HOOKS` names it (the integration fixtures and the benchmarks set
it; production never does). They stand in for hostile inputs the verifier's own
bounds already refuse, so the fleet's hard limits (deadline, memory cap, crash) can be
tested end to end.
"""

from __future__ import annotations

import os
import time

from workers import verifier
from workers.models import GradeOptions, Verdict

__all__ = ["ABORT", "HANG", "OOM", "hooked_grade"]

HANG = "__gradefleet_test_hang__"
OOM = "__gradefleet_test_oom__"
ABORT = "__gradefleet_test_abort__"

_TOUCHED_BYTES = 32 * 1024 * 1024
# Far above any item cap: under RLIMIT_AS this fails at once with MemoryError, like a
# huge big-integer allocation, instead of spending seconds zero-filling pages first.
_BOMB_BYTES = 1 << 40


def _hang() -> None:
    while True:
        time.sleep(3600)


def _bloat() -> None:
    hoard = [bytearray(_TOUCHED_BYTES)]  # zero-filled: real RSS growth first
    while True:
        hoard.append(bytearray(_BOMB_BYTES))


def hooked_grade(
    response: str, gold: str, *, options: GradeOptions | None = None
) -> Verdict:
    """`workers.verifier.grade`, except for responses containing a magic marker."""
    if HANG in response:
        _hang()
    if OOM in response:
        _bloat()
    if ABORT in response:
        os.abort()
    return verifier.grade(response, gold, options=options)
