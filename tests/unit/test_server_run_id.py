"""`producer.client.job.ServerRunId`: jobs of one client share the server's run_id, read
with INFO at most once per `max_age_s` (on a real Redis)."""

from __future__ import annotations

import redis

from producer.client.job import ServerRunId


def _info_calls(client: redis.Redis[bytes]) -> int:
    stats = client.info("commandstats").get("cmdstat_info", {})
    return int(stats.get("calls", 0))


def test_run_id_is_read_once_per_max_age_and_fresh_on_demand(redis_client):
    run_ids = ServerRunId(redis_client)
    expected = redis_client.info("server")["run_id"]
    before = _info_calls(redis_client)
    assert run_ids.get(max_age_s=60.0) == expected
    assert run_ids.get(max_age_s=60.0) == expected  # cached: no INFO
    # (+1 for commandstats' own INFO call)
    assert _info_calls(redis_client) - before == 2
    before = _info_calls(redis_client)
    assert run_ids.get() == expected  # a check reads it again
    assert _info_calls(redis_client) - before == 2


def test_run_id_is_none_when_redis_is_down():
    nowhere: redis.Redis[bytes] = redis.Redis(port=1, socket_connect_timeout=0.2)
    assert ServerRunId(nowhere).get() is None
