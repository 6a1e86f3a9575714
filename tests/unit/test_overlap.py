"""Reading ahead and writing behind in threads (producer.overlap)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from producer.overlap import BehindWriter, read_ahead


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
