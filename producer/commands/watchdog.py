"""A warning within seconds when a fleet has no live worker, or when code rollouts
were sent and no live worker takes code: batches would otherwise wait in their queue
silently until the deadline.

A daemon thread pings the workers (Celery's broadcast `ping`) once `first_check_s`
has passed without a result, and again every `recheck_s` while none has arrived; it
prints one line per check that finds nobody. It never stops the run: a worker may be
starting. A live fleet answers within that first second, so it is never pinged: a
ping costs the producer a control app, a broadcast and a second of collecting
answers, some 0.2-0.4 s of CPU on the 2 cores it shares with the fleet (issue 11).

Code rollouts go to queues of their own that only `--kinds code` workers take
(`workers.wire.lanes`), so math results arriving say nothing about them: once told
that code was sent (`expect_code`), the same thread reads the workers' kinds at its
next check, and warns at every check until a live worker takes code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import click

from producer.settings import redact_url

__all__ = ["NoWorkerWatch", "live_workers"]


def live_workers(broker_url: str, timeout_s: float) -> list[str]:
    """Names of the workers that answer a ping on `broker_url` within `timeout_s`."""
    from workers.wire.connections import control_app

    app = control_app("gradefleet-watch", broker_url)
    try:
        return sorted((app.control.inspect(timeout=timeout_s).ping() or {}).keys())
    finally:
        app.close()


class NoWorkerWatch:
    """Warns on stderr while no worker answers and no result has arrived.

    Args:
        broker_url: the fleet's Redis URL.
        ping_timeout_s: how long each ping waits for answers.
        first_check_s: how long to wait for a first result before the first check.
        recheck_s: time between checks while nothing has arrived.
        echo: where the warning goes (stderr by default).
    """

    def __init__(
        self,
        broker_url: str,
        *,
        ping_timeout_s: float = 1.0,
        first_check_s: float = 1.0,
        recheck_s: float = 30.0,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.broker_url = broker_url
        self.ping_timeout_s = ping_timeout_s
        self.first_check_s = first_check_s
        self.recheck_s = recheck_s
        self._echo = echo or (lambda line: click.echo(line, err=True))
        self._closed = threading.Event()
        self._progressed = threading.Event()
        self._code_sent = threading.Event()
        self._code_taken = False
        self._thread = threading.Thread(
            target=self._run, name="gradefleet-no-worker-watch", daemon=True
        )

    def __enter__(self) -> NoWorkerWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._closed.set()

    def progress(self) -> None:
        """A result arrived: somebody is working, stop pinging."""
        if not self._progressed.is_set():  # called per result: set() takes a lock
            self._progressed.set()

    def expect_code(self) -> None:
        """Code rollouts were sent: check that a live worker takes code."""
        if not self._code_sent.is_set():
            self._code_sent.set()

    def _run(self) -> None:
        if self._closed.wait(self.first_check_s):
            return
        while not self._closed.is_set():
            if not self._progressed.is_set():
                self._check_alive()
            if self._code_sent.is_set() and not self._code_taken:
                self._check_code()
            if self._progressed.is_set() and self._code_taken:
                return  # nothing left to watch for
            if self._closed.wait(self.recheck_s):
                return

    def _check_alive(self) -> None:
        try:
            names = live_workers(self.broker_url, self.ping_timeout_s)
        except Exception:
            names = ["?"]
        if not names and not self._progressed.is_set():
            self._echo(
                f"gradefleet: warning: no live worker answers on "
                f"{redact_url(self.broker_url)}; batches wait in the queue until "
                "one starts (gradefleet worker --broker URL)"
            )

    def _check_code(self) -> None:
        from producer.client.status import read_fleet_status

        try:
            fleet = read_fleet_status(
                self.broker_url, timeout_s=self.ping_timeout_s, window_s=0.0
            )
        except Exception:
            return  # the broker's trouble is reported where it is used
        if not fleet.workers:
            return  # `_check_alive` says so
        if any(worker.grades_code for worker in fleet.workers):
            self._code_taken = True
            return
        self._echo(
            f"gradefleet: warning: code rollouts wait in their queues: none of the "
            f"{len(fleet.workers)} live workers on {redact_url(self.broker_url)} "
            "takes code; start one with `gradefleet worker --kinds code` (root and "
            "bubblewrap; `gradefleet status` shows each worker's kinds)"
        )
