"""kombu's Redis channel, left open by a connection collect that was cut short, fails
with connection errors (which Celery handles) rather than an AttributeError (which
stops the worker): see workers/kombu_fixes.py."""

from __future__ import annotations

import logging
import uuid

import kombu
import pytest
from kombu.common import ignore_errors

from workers.kombu_fixes import closed_channels_fail_as_connection_errors


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
