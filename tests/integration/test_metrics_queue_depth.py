"""gradefleet_queue_depth read from a real redis-server holding real kombu messages
(ready, priority and delivered-but-unacked)."""

from __future__ import annotations

import pytest
from kombu import Connection
from prometheus_client import CollectorRegistry

from workers.fleet.metrics import QueueDepthCollector, QueueDepths, read_queue_depths

pytestmark = pytest.mark.integration

QUEUE = "gradefleet-metrics-test"


def test_metrics_queue_depth_ready_priority_and_unacked(redis_server, redis_client):
    # Given 6 messages (one with high priority) of which 2 were fetched, not acked
    with Connection(redis_server) as conn:
        queue = conn.SimpleQueue(QUEUE)
        for n in range(5):
            queue.put({"n": n}, serializer="json")
        queue.put({"n": "urgent"}, serializer="json", priority=9)
        fetched = [queue.get(timeout=5) for _ in range(2)]
        # Then ready counts the plain and the priority lists, unacked the fetched two
        # (kombu keeps priority-9 messages in a separate "<queue>\x06\x169" list)
        assert redis_client.llen(QUEUE) == 3
        assert redis_client.llen(f"{QUEUE}\x06\x169") == 1
        depths = read_queue_depths(redis_client, [QUEUE, "absent"])
        assert depths == QueueDepths(ready={QUEUE: 4, "absent": 0}, unacked=2)
        registry = CollectorRegistry()
        registry.register(QueueDepthCollector(redis_client, [QUEUE]))
        sample = registry.get_sample_value
        lane = {"lane": ""}  # a queue of no lane
        ready = {"queue": QUEUE, **lane, "state": "ready"}
        assert sample("gradefleet_queue_depth", ready) == 4
        assert sample("gradefleet_broker_unacked") == 2
        assert sample("gradefleet_queue_depth_up") == 1.0
        # When both are acked, unacked drops to 0
        for message in fetched:
            message.ack()
        assert read_queue_depths(redis_client, [QUEUE]).unacked == 0
        queue.close()
