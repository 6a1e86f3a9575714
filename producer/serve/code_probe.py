"""Whether this node can run code sandboxes: the code part of `GET /readyz` when the
service grades on this machine (embedded mode; on a fleet, `/readyz` asks which live
workers consume the code queues instead, `producer.client.backends.FleetBackend`).

Code rollouts run in bubblewrap sandboxes (`workers.code.sandbox`), which need root
and `bwrap`; a node without them still grades math, so the answer is reported
beside the backend's readiness rather than failing it. The probe is cheap and
cached (`workers.kinds.code_sandbox_check`: the two preconditions, then one program
of ours, never a model's, run against one stdin test in a fresh sandbox that is
closed at once). A pass is kept for the process's life; a failure is tried again
after `retry_s`.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["CodeProbe", "probe_code_sandbox"]


def probe_code_sandbox() -> tuple[bool, str]:
    """(can run, why): root, bwrap, and one probe program graded in a sandbox."""
    # Imported here: the registry loads the verifier, which the service's own
    # process (a fleet's front) may never need.
    from workers.kinds import code_sandbox_check

    return code_sandbox_check()


class CodeProbe:
    """`probe_code_sandbox`, run in a thread at most once at a time, its answer
    cached (a pass for good, a failure for `retry_s`)."""

    def __init__(self, retry_s: float = 60.0) -> None:
        self.retry_s = retry_s
        self._answer: tuple[bool, str] | None = None
        self._tried_at = 0.0
        self._lock: asyncio.Lock | None = None

    def _fresh(self) -> bool:
        answer = self._answer
        if answer is None:
            return False
        return answer[0] or time.monotonic() - self._tried_at < self.retry_s

    async def check(self) -> tuple[bool, str]:
        if self._fresh():
            assert self._answer is not None
            return self._answer
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if not self._fresh():
                try:
                    answer = await asyncio.to_thread(probe_code_sandbox)
                except Exception as exc:  # a probe bug is a "no", never a 500
                    answer = (False, f"code sandbox probe failed: {exc!r}"[:300])
                self._answer, self._tried_at = answer, time.monotonic()
        assert self._answer is not None
        return self._answer
