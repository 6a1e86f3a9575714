"""A warning within seconds when a fleet has no live worker: batches would otherwise
wait in the queue silently until the deadline.

A daemon thread pings the workers (Celery's broadcast `ping`) once `first_check_s`
has passed without a result, and again every `recheck_s` while none has arrived; it
prints one line per check that finds nobody. It never stops the run: a worker may be
starting. A live fleet answers within that first second, so it is never pinged: a
ping costs the producer a control app, a broadcast and a second of collecting
answers, some 0.2-0.4 s of CPU on the 2 cores it shares with the fleet (issue 11).
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
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="gradefleet-no-worker-watch", daemon=True
        )

    def __enter__(self) -> NoWorkerWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()

    def progress(self) -> None:
        """A result arrived: somebody is working, stop checking."""
        if not self._done.is_set():  # called per result: set() takes a lock
            self._done.set()

    def _run(self) -> None:
        if self._done.wait(self.first_check_s):
            return
        while not self._done.is_set():
            try:
                names = live_workers(self.broker_url, self.ping_timeout_s)
            except Exception:
                names = ["?"]
            if not names and not self._done.is_set():
                self._echo(
                    f"gradefleet: warning: no live worker answers on "
                    f"{redact_url(self.broker_url)}; batches wait in the queue until "
                    "one starts (gradefleet worker --broker URL)"
                )
            if self._done.wait(self.recheck_s):
                return
