"""Reading ahead and writing behind in threads (producer.files.overlap)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from producer.files.overlap import BehindWriter, read_ahead, work_ahead


def test_read_ahead_yields_everything_in_order_from_another_thread() -> None:
    threads: set[str] = set()

    def source() -> Iterator[int]:
        for k in range(500):
            threads.add(threading.current_thread().name)
            yield k

    assert list(read_ahead(source())) == list(range(500))
    assert threads == {"gradefleet-read"}


def test_read_ahead_raises_the_source_error_where_its_item_would_come() -> None:
    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise OSError("disk gone")

    got: list[int] = []

    def consume() -> None:
        for item in read_ahead(source()):
            got.append(item)

    with pytest.raises(OSError, match="disk gone"):
        consume()
    assert got == [1, 2]


def test_behind_writer_writes_in_order_and_waits_at_exit() -> None:
    written: list[int] = []
    with BehindWriter(written.append) as writer:
        for k in range(1_000):
            writer.put(k)
    assert written == list(range(1_000))


def test_behind_writer_raises_a_write_error_in_the_caller() -> None:
    def write(item: int) -> None:
        if item == 3:
            raise OSError("no space left")

    def write_all() -> None:
        with BehindWriter(write) as writer:
            for k in range(100):
                writer.put(k)

    with pytest.raises(OSError, match="no space left"):
        write_all()


def test_work_ahead_keeps_order_with_two_items_worked_on_at_once() -> None:
    # Items finish out of order (each later one is quicker); the results still
    # come in input order, and the work overlaps: two at once, never three.
    lock = threading.Lock()
    running, most = 0, 0
    overlapped = threading.Event()

    def work(k: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            if running == 2:
                overlapped.set()
        overlapped.wait(timeout=5)  # each waits until two have run at once
        with lock:
            running -= 1
        return k * k

    assert list(work_ahead(range(20), work)) == [(k, k * k) for k in range(20)]
    assert most == 2


def test_work_ahead_raises_a_work_error_where_its_result_would_come() -> None:
    def work(k: int) -> int:
        if k == 3:
            raise KeyError("bad chunk")
        return k

    got: list[int] = []

    def consume() -> None:
        for _item, result in work_ahead(range(10), work):
            got.append(result)

    with pytest.raises(KeyError, match="bad chunk"):
        consume()
    assert got == [0, 1, 2]


def test_work_ahead_takes_items_only_as_results_are_used() -> None:
    # Two items ahead of the consumer at the most: a huge file is not read whole.
    taken: list[int] = []

    def items() -> Iterator[int]:
        for k in range(100):
            taken.append(k)
            yield k

    results = work_ahead(items(), lambda k: k)
    assert next(results) == (0, 0)
    assert taken == [0, 1]
    assert next(results) == (1, 1)
    assert taken == [0, 1, 2]
