"""How the CLI stops on SIGTERM and SIGINT: unwind (so temporary output files are
removed and the pool or fleet client shuts down) and exit 128 + signal number, as a
shell, Slurm or Kubernetes expects.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["TerminatedError", "exit_on_signals"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TerminatedError(BaseException):
    """A stop signal arrived. A BaseException so that `except Exception` blocks (and
    click, which turns KeyboardInterrupt into exit 1) let it through to `main`."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise TerminatedError(signum)


@contextmanager
def exit_on_signals() -> Iterator[None]:
    """Run the block with SIGTERM/SIGINT raising `TerminatedError`; on one, print a
    line and `sys.exit(128 + signum)` once the block has unwound."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = {sig: signal.signal(sig, _raise) for sig in _SIGNALS}
    try:
        yield
    except TerminatedError as exc:
        for sig in _SIGNALS:  # a second signal while exiting must not interrupt it
            signal.signal(sig, signal.SIG_IGN)
        print(f"gradefleet: {exc}", file=sys.stderr)
        sys.exit(128 + exc.signum)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
