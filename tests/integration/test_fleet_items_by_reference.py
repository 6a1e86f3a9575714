"""Batch items travel apart from the task message (`contract.detach_items`).

The producer stores each batch's items in the broker's Redis and publishes a message
that names them; the worker reads them once; the producer deletes them as results
arrive and stores them again with a re-send.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from celery.signals import before_task_publish
from kombu import Queue

from producer.client.fleet import GradingClient, Rollout
from workers.wire.contract import QUEUE
from workers.wire.protocol import batch_items_key

pytestmark = pytest.mark.integration

LONG = "Let us think step by step. " * 40  # ~1 KB of reasoning per rollout


@pytest.fixture
def quiet_db(redis_server: str) -> Iterator[str]:
    """A database of the private server that no worker consumes (flushed around)."""
    url = redis_server.rsplit("/", 1)[0] + "/7"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


def _queued_messages(client: redis.Redis) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(QUEUE, 0, -1)]


def test_items_by_reference_message_is_small_and_items_are_stored(quiet_db):
    # Given a producer on a broker no worker consumes
    rollouts = [Rollout(f"{LONG} \\boxed{{{k}}}", str(k)) for k in range(256)]
    client = GradingClient(quiet_db, batch_size=256, deadline_s=60)
    inspect = redis.Redis.from_url(quiet_db)
    try:
        # When it submits one batch of ~1 KB rollouts
        job = client.submit(rollouts)
        (message,) = _queued_messages(inspect)
        raw_size = len(inspect.lindex(QUEUE, 0))
        key = batch_items_key(f"{job.job_id}.0")
        stored = json.loads(inspect.get(key))
        ttl_s = inspect.ttl(key)
    finally:
        inspect.close()
        client.close()
    # Then the queued message is small and names the stored items
    assert raw_size < 4_096, raw_size
    [wire], _kwargs, _embed = json.loads(message["body"])
    assert "items" not in wire
    assert wire["items_key"] == key
    # And the stored items are the batch, with a TTL well past the visibility timeout
    assert [item["index"] for item in stored] == list(range(256))
    assert stored[5]["response"] == rollouts[5].response
    assert ttl_s > 3_600


def test_items_gone_before_delivery_are_stored_again_by_the_resend(
    quiet_db, make_workers
):
    # Given a job queued on a broker with no worker yet, whose stored items vanish
    client = GradingClient(quiet_db, batch_size=4, deadline_s=60)
    inspect = redis.Redis.from_url(quiet_db)
    try:
        job = client.submit([Rollout(f"\\boxed{{{k}}}", str(k)) for k in range(8)])
        inspect.delete(batch_items_key(f"{job.job_id}.0"))
        # When a worker starts: batch 0 fails ("not in Redis"), batch 1 is graded
        make_workers(quiet_db).start()
        verdicts = job.results()
        leftover = list(inspect.scan_iter(match="gradefleet:v1:items:*"))
    finally:
        inspect.close()
        client.close()
    # Then the producer re-sent batch 0 with its items, and every verdict is right
    assert [v.correct for v in verdicts] == [True] * 8
    assert job.resent_batches >= 1
    # And no stored items outlive the job
    assert leftover == []


def test_client_sizes_batches_to_the_job_by_default(quiet_db):
    # Given a client with no batch size, on a broker no worker consumes
    client = GradingClient(quiet_db, deadline_s=60)
    inspect = redis.Redis.from_url(quiet_db)
    try:
        # When it submits a 10,000-rollout job and then a 100-rollout one
        big = client.submit([Rollout(f"\\boxed{{{k}}}", "1") for k in range(10_000)])
        big_tasks = inspect.llen(QUEUE)
        client.submit([Rollout(f"\\boxed{{{k}}}", "1") for k in range(100)])
        small_tasks = inspect.llen(QUEUE) - big_tasks
        first = json.loads(inspect.get(batch_items_key(f"{big.job_id}.0")))
    finally:
        inspect.close()
        client.close()
    # Then the big job makes 32 tasks of 313 and the small one tasks of 16
    assert big_tasks == 32
    assert len(first) == 313
    assert small_tasks == 7  # 6 x 16 + 4


def test_queue_is_declared_once_and_every_batch_is_queued(start_redis_server):
    # Given a producer on a server of its own, and Celery's publish signal, which
    # names the entities each publish declares
    url = start_redis_server()
    client = GradingClient(url, batch_size=4, deadline_s=60)
    inspect = redis.Redis.from_url(url)
    rollouts = [Rollout(f"\\boxed{{{k}}}", str(k)) for k in range(24)]
    declared: list[list[str]] = []

    def on_publish(declare: list[Queue] | None = None, **_: object) -> None:
        declared.append([queue.name for queue in declare or []])

    before_task_publish.connect(on_publish, weak=False)
    try:
        # When two jobs of 6 batches each are published to one lane
        jobs = [client.submit(rollouts), client.submit(rollouts)]
        queued = _queued_messages(inspect)
        bindings = inspect.smembers(f"_kombu.binding.{QUEUE}")
    finally:
        before_task_publish.disconnect(on_publish)
        inspect.close()
        client.close()
    # Then all 12 are queued (LPUSH: the newest first); the lane's queue was
    # declared (bound in Redis) by the first publish, and by no other
    ids = [m["headers"]["id"] for m in reversed(queued)]
    assert ids == [f"{job.job_id}.{n}" for job in jobs for n in range(6)]
    assert len(bindings) == 1
    assert declared == [[QUEUE]] + [[]] * 11
