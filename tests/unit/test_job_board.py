"""The job board `gradefleet status` reads, on a private redis-server."""

from __future__ import annotations

import time
from dataclasses import dataclass

from producer.client.board import TTL_S, JobBoard, read_job_board
from workers.wire.protocol import job_board_key, job_entry_key


@dataclass
class _Job:
    """The fields of a `GradingJob` the board reads."""

    job_id: str
    lane: str
    total: int
    done: int = 0
    in_flight: int = 0

    @property
    def rollouts(self) -> int:  # one rollout a result, as a job of rollouts
        return self.total

    @property
    def rollouts_done(self) -> int:
        return self.done


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


def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_job_board_watch_keeps_entry_alive_until_close(redis_client):
    # Given a watched job on a board with a 1 s TTL and a fast refresh
    board = JobBoard(redis_client, ttl_s=1, refresh_s=0.1)
    job = _Job("w1", "interactive", total=10)
    board.watch(job)
    try:
        # When well past the TTL the thread has refreshed it, progress included
        job.done = 3
        _until(lambda: redis_client.hget(job_entry_key("w1"), "done") == b"3")
        time.sleep(1.5)
        assert redis_client.exists(job_entry_key("w1"))
    finally:
        # Then closing the board takes it off at once
        board.close()
    assert not redis_client.exists(job_entry_key("w1"))
    assert redis_client.zcard(job_board_key()) == 0


def test_job_board_records_a_broker_refusal_and_clears_it(redis_client):
    # Given a watched job
    board = JobBoard(redis_client, ttl_s=5, refresh_s=0.05)
    job = _Job("w2", "bulk", total=10)  # held: the board keeps a weak reference
    board.watch(job)
    limit = redis_client.config_get("maxmemory")["maxmemory"]
    try:
        # When the server reaches maxmemory (noeviction), the refusal is kept
        redis_client.config_set("maxmemory-policy", "noeviction")
        redis_client.config_set("maxmemory", 1)
        _until(lambda: board.refusal is not None)
        assert "maxmemory" in str(board.refusal)
        # and cleared once writes are accepted again
        redis_client.config_set("maxmemory", limit)
        _until(lambda: board.refusal is None)
    finally:
        redis_client.config_set("maxmemory", limit)
        board.close()


def test_job_board_stops_refreshing_a_job_its_caller_dropped(redis_client):
    # Given a watched job that its caller drops unfinished
    board = JobBoard(redis_client, ttl_s=1, refresh_s=0.05)
    board.watch(_Job("dropped", "bulk", total=10))
    try:
        # Then its entry is no longer refreshed and expires with its TTL
        _until(lambda: not redis_client.exists(job_entry_key("dropped")))
    finally:
        board.close()
