"""Keeps the worker's event-loop timer heap to the timers still pending.

Celery's prefork pool arms a soft and a hard time limit per task as entries of
kombu's timer heap, and cancels them when the task ends; a cancelled entry only
flags itself and stays in the heap until its due time (the hard limit: minutes to an
hour). A busy worker so held one dead entry per task of the last hour, ~550 bytes
each: its main process grew without bound under a steady load. A bootstep of the
worker's main process drops the cancelled entries every `PURGE_EVERY_S`.
"""

from __future__ import annotations

import heapq
from typing import Any

from celery import bootsteps

__all__ = ["PURGE_EVERY_S", "TimerPurge", "purge_cancelled"]

# Entries are cheap to scan (a list of tuples); a minute bounds the heap to the
# tasks of one minute plus the live limits.
PURGE_EVERY_S = 60.0


def purge_cancelled(timer: Any) -> int:
    """Drop cancelled entries from a kombu `Timer`'s heap, in place (the timer's
    own iterator holds the list); returns how many were dropped."""
    queue = timer._queue
    live = [item for item in queue if not item.entry.canceled]
    dropped = len(queue) - len(live)
    if dropped:
        heapq.heapify(live)
        queue[:] = live
    return dropped


class TimerPurge(bootsteps.StartStopStep):
    """Purges the event loop's cancelled timers every `PURGE_EVERY_S`."""

    requires = ("celery.worker.components:Hub",)

    def start(self, worker: Any) -> None:
        hub = getattr(worker, "hub", None)
        if hub is not None:  # no event loop (solo pool): no per-task timers
            hub.timer.call_repeatedly(PURGE_EVERY_S, purge_cancelled, (hub.timer,))
