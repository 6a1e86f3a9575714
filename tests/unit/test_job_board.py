"""The job board `gradefleet status` reads, on a private redis-server."""

from __future__ import annotations

from dataclasses import dataclass

from producer.board import TTL_S, JobBoard, read_job_board
from workers.protocol import job_board_key, job_entry_key


@dataclass
class _Job:
    """The fields of a `GradingJob` the board reads."""

    job_id: str
    lane: str
    total: int
    done: int = 0
    in_flight: int = 0


def test_job_board_lists_jobs_until_done(redis_client):
    board = JobBoard(redis_client)
    sweep = _Job("s1", "bulk", total=300_000, in_flight=64)
    step = _Job("r1", "interactive", total=8_192, in_flight=32)
    board.update(sweep)
    board.update(step)
    entries = {e.job_id: e for e in read_job_board(redis_client)}
    assert set(entries) == {"s1", "r1"}
    assert (entries["s1"].lane, entries["s1"].total, entries["s1"].in_flight) == (
        "bulk",
        300_000,
        64,
    )
    assert entries["s1"].submitted_at > 0
    assert 0 < redis_client.ttl(job_entry_key("s1")) <= TTL_S
    # Progress writes are throttled (once a second); completion is written at once
    step.done = 4_096
    board.update(step)
    assert {e.job_id: e.done for e in read_job_board(redis_client)}["r1"] == 0
    step.done = step.total
    board.update(step)
    assert [e.job_id for e in read_job_board(redis_client)] == ["s1"]
    assert not redis_client.exists(job_entry_key("r1"))


def test_job_board_prunes_jobs_whose_producer_stopped_refreshing(redis_client):
    board = JobBoard(redis_client)
    board.update(_Job("gone", "bulk", total=10))
    redis_client.delete(job_entry_key("gone"))  # what its TTL does once unrefreshed
    assert read_job_board(redis_client) == []
    assert redis_client.zcard(job_board_key()) == 0
