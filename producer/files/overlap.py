"""Reading ahead and writing behind in threads, so the CLI's JSON work overlaps grading.

The CLI reads a chunk of rows, grades it, writes it. Done in turn, the grading
processes wait while the CLI parses and encodes JSON, and the CLI waits while they
grade; here the next chunk is read and the previous one written while the current one
is graded (the grading call waits on pipes or sockets, so the threads get the GIL).
Order is kept: one reader, one writer, each with a queue of one chunk.

For a fleet, chunks are also graded two at a time (`work_ahead`): each chunk is one
job, and a job's last batches keep only a worker or two busy, so grading the chunks
in turn left most of the fleet idle at every chunk boundary (issue 11: one job for
the whole file ran ~20% faster than five chunks in turn on 2 workers, and the loss
grows with the fleet).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

__all__ = ["BehindWriter", "read_ahead", "work_ahead"]

T = TypeVar("T")
R = TypeVar("R")

_END = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def read_ahead(source: Iterable[T]) -> Iterator[T]:
    """Iterate `source` in a thread, one item ahead of the consumer.

    An exception raised by `source` is raised here, where its item would have come.
    The thread is a daemon: a consumer that stops early leaves it blocked, not the
    process.
    """
    handoff: queue.Queue[object] = queue.Queue(maxsize=1)

    def produce() -> None:
        try:
            for item in source:
                handoff.put(item)
        except BaseException as exc:  # handed to the consumer, raised there
            handoff.put(_Failed(exc))
            return
        handoff.put(_END)

    threading.Thread(target=produce, name="gradefleet-read", daemon=True).start()
    while True:
        item = handoff.get()
        if item is _END:
            return
        if isinstance(item, _Failed):
            raise item.exc
        yield item  # type: ignore[misc]  # anything else is one of source's items


class _Running(Generic[R]):
    """`work(item)` in a daemon thread of its own, its result or exception kept."""

    def __init__(self, work: Callable[[T], R], item: T) -> None:
        self._done = threading.Event()
        self._result: R | None = None
        self._failure: BaseException | None = None

        def run() -> None:
            try:
                self._result = work(item)
            except BaseException as exc:  # raised in the caller's thread
                self._failure = exc
            finally:
                self._done.set()

        threading.Thread(target=run, name="gradefleet-work", daemon=True).start()

    def result(self) -> R:
        self._done.wait()
        if self._failure is not None:
            raise self._failure
        return self._result  # type: ignore[return-value]  # set once done, no failure


def work_ahead(
    items: Iterable[T], work: Callable[[T], R], *, depth: int = 2
) -> Iterator[tuple[T, R]]:
    """Yield `(item, work(item))` in order, `work` running on up to `depth` items at
    once, each in a daemon thread (left to the process's exit if the consumer stops
    early). An exception raised by `work` is raised here, where its result would
    have come; the next item is taken from `items` only as a result is yielded."""
    running: deque[tuple[T, _Running[R]]] = deque()
    for item in items:
        running.append((item, _Running(work, item)))
        if len(running) >= depth:
            done, work_done = running.popleft()
            yield done, work_done.result()
    while running:
        done, work_done = running.popleft()
        yield done, work_done.result()


class BehindWriter(Generic[T]):
    """Runs `write(item)` for each `put` item in a thread, in order.

    `put` waits while one item is still queued; leaving the block waits for every
    item to be written and raises the writer's exception, if any (also on `put`).
    Leaving it on an exception drops what is queued and does not wait.
    """

    def __init__(self, write: Callable[[T], None]) -> None:
        self._write = write
        self._queue: queue.Queue[object] = queue.Queue(maxsize=1)
        self._failure: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name="gradefleet-write", daemon=True
        )

    def put(self, item: T) -> None:
        self._raise_failure()
        self._queue.put(item)

    def __enter__(self) -> BehindWriter[T]:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            return  # the daemon thread is left to the process's exit
        self._queue.put(_END)
        self._thread.join()
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        while (item := self._queue.get()) is not _END:
            if self._failure is None:  # after a failure, drain without writing
                try:
                    self._write(item)  # type: ignore[arg-type]
                except BaseException as exc:  # raised in the caller's thread
                    self._failure = exc
