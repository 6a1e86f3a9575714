"""`workers.fleet.broker`'s transports on a private redis-server: a channel builds one
Redis client per pool, and messages still go through."""

from __future__ import annotations

import pytest
from kombu import Connection

from workers.wire.connections import transport_for


@pytest.mark.parametrize("publish_only", [False, True])
def test_channel_reuses_one_client_per_pool(redis_server, redis_client, publish_only):
    transport = transport_for(redis_server, publish_only=publish_only)
    assert transport is not None
    with Connection(redis_server, transport=transport) as connection:
        channel = connection.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        assert first.connection_pool is channel.pool
        # A pool kombu drops (a lost connection) gets a client of its own
        channel._disconnect_pools()
        fresh = channel._create_client()
        assert fresh is not first
        assert fresh.connection_pool is channel.pool
        # Publishing, delivering and acknowledging go through the kept client
        queue = connection.SimpleQueue("gf-transport-test")
        for n in range(3):
            queue.put({"n": n})
        got = []
        for _ in range(3):
            message = queue.get(timeout=5)
            got.append(message.payload["n"])
            message.ack()
        assert got == [0, 1, 2]
        assert channel._create_client() is fresh
        queue.close()


def test_transport_names_by_scheme():
    assert transport_for("redis://h:1/0") == "workers.fleet.broker:Transport"
    assert transport_for("rediss://h:1/0", publish_only=True) == (
        "workers.fleet.broker:PublishTransport"
    )
    assert transport_for("sentinel://h:1,h:2/mymaster/0") == (
        "workers.fleet.broker:SentinelTransport"
    )
    assert transport_for("amqp://h") is None
