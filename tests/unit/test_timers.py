"""The purge of cancelled time-limit timers (`workers.fleet.timers`) on kombu's own
Timer."""

from __future__ import annotations

from kombu.asynchronous.timer import Timer

from workers.fleet.timers import purge_cancelled


def test_timers_purge_drops_cancelled_entries_and_keeps_the_rest_in_order():
    # Given a timer heap with 1,000 far-off entries, 990 of them cancelled
    timer = Timer()
    fired: list[int] = []
    entries = [timer.call_after(3600 + n, fired.append, (n,)) for n in range(1_000)]
    for n, entry in enumerate(entries):
        if n % 100:
            entry.cancel()
    heap = timer._queue
    # When it is purged
    dropped = purge_cancelled(timer)
    # Then only the live entries are left, in the same list, still a heap by due time
    assert dropped == 990
    assert timer._queue is heap
    assert [item.entry.args[0] for item in timer.queue] == list(range(0, 1_000, 100))
    assert purge_cancelled(timer) == 0
