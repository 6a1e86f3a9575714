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

__all__ = ["TerminatedError", "exit_on_signals", "raise_if_stopped"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TerminatedError(BaseException):
    """A stop signal arrived. A BaseException so that `except Exception` blocks (and
    click, which turns KeyboardInterrupt into exit 1) let it through to `main`."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


# The signal that arrived, kept besides raising: Python swallows an exception raised
# while it runs an at-fork callback, a finalizer or a weakref callback ("Exception
# ignored in ..."), so a signal that lands there must still stop the run at the next
# `raise_if_stopped` (seen: SIGINT inside logging's after-fork lock release).
_pending: int | None = None


def _raise(signum: int, _frame: FrameType | None) -> None:
    global _pending
    _pending = signum
    raise TerminatedError(signum)


def _drop_swallowed_stop(
    previous: object,
) -> object:
    """An unraisable hook that stays quiet about a swallowed `TerminatedError` (it is
    kept in `_pending` and raised again, so the "Exception ignored" traceback Python
    would print is noise on a clean stop) and hands anything else to `previous`."""

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, TerminatedError):
            return
        previous(unraisable)  # type: ignore[operator]

    return hook


def raise_if_stopped() -> None:
    """Raise `TerminatedError` if a stop signal arrived (and was swallowed)."""
    if _pending is not None:
        raise TerminatedError(_pending)


@contextmanager
def exit_on_signals() -> Iterator[None]:
    """Run the block with SIGTERM/SIGINT raising `TerminatedError`; on one, print a
    line and `sys.exit(128 + signum)` once the block has unwound."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = {sig: signal.signal(sig, _raise) for sig in _SIGNALS}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _drop_swallowed_stop(previous_hook)  # type: ignore[assignment]
    try:
        yield
        raise_if_stopped()
    except TerminatedError as exc:
        for sig in _SIGNALS:  # a second signal while exiting must not interrupt it
            signal.signal(sig, signal.SIG_IGN)
        print(f"gradefleet: {exc}", file=sys.stderr)
        sys.exit(128 + exc.signum)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.unraisablehook = previous_hook
