"""kombu's Redis transport as the worker runs it (workers/fleet/kombu_fixes.py): a
channel
left open by a connection collect that was cut short fails with connection errors
(which Celery handles) rather than an AttributeError (which stops the worker), and
an ack the broker refuses still frees its prefetch slot."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import kombu
import pytest
import redis
from kombu.common import ignore_errors

from workers.fleet.broker import Transport
from workers.fleet.kombu_fixes import (
    closed_channels_fail_as_connection_errors,
    failed_acks_free_their_prefetch_slot,
)


def test_a_dropped_transport_fails_acks_and_closes_as_connection_errors(
    redis_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    closed_channels_fail_as_connection_errors()
    # Given a delivery not yet acked on a channel that a Redis restart left half
    # closed: its pools disconnected (kombu's Channel.close, cut short when restoring
    # the delivery failed) and its transport's client dropped (the Connection.collect
    # that called it) -- the state the worker's log showed in the Redis-restart test
    conn = kombu.Connection(redis_server)
    queue = kombu.Queue(f"gf-test-{uuid.uuid4().hex}")
    with conn.Producer() as producer:
        producer.publish({"n": 1}, routing_key=queue.name, declare=[queue])
    received: list[kombu.Message] = []
    consumer = conn.Consumer(queue, callbacks=[lambda _b, m: received.append(m)])
    consumer.consume()
    conn.drain_events(timeout=5)
    errors = conn.connection_errors
    received[0].channel._disconnect_pools()
    conn._do_close_transport()
    # When the finished task's ack arrives, and Celery closes the connection
    with caplog.at_level(logging.CRITICAL):
        received[0].ack_log_error(logging.getLogger("gf-test"), errors)
    ignore_errors(conn, conn.close)
    # Then both went through as a connection error Celery logs or ignores
    assert "Couldn't ack" in caplog.text
    assert "was closed" in caplog.text


def test_acks_the_broker_refuses_free_their_prefetch_slot(
    start_redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    failed_acks_free_their_prefetch_slot()
    # Given a consumer on the worker's transport with a prefetch of 2 holding two
    # deliveries, on a Redis of its own that then reaches maxmemory (noeviction)
    url = start_redis_server()
    conn = kombu.Connection(url, transport=Transport)
    queue = kombu.Queue(f"gf-test-{uuid.uuid4().hex}")
    with conn.Producer() as producer:
        for n in range(3):
            producer.publish({"n": n}, routing_key=queue.name, declare=[queue])
    received: list[kombu.Message] = []
    consumer = conn.Consumer(queue, callbacks=[lambda _b, m: received.append(m)])
    consumer.qos(prefetch_count=2)
    consumer.consume()
    while len(received) < 2:
        conn.drain_events(timeout=5)
    qos = received[0].channel.qos
    assert not qos.can_consume()
    admin = redis.Redis.from_url(url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    # When both finished tasks' acks are refused
    with caplog.at_level(logging.CRITICAL):
        for message in received:
            message.ack_log_error(logging.getLogger("gf-test"), conn.connection_errors)
    assert caplog.text.count("Couldn't ack") == 2
    # Then the consumer may take work again, and takes the third delivery once
    # the broker has memory
    assert qos.can_consume()
    admin.config_set("maxmemory", 0)
    conn.drain_events(timeout=5)
    assert [m.payload["n"] for m in received] == [0, 1, 2]
    ignore_errors(conn, conn.close)
