"""A batch's claim (`workers.fleet.claim`) on a private redis-server: the one-round-trip
path (result backend = broker) and the two-call path (another client) alike."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from workers.fleet import claim as claims
from workers.wire.protocol import claim_key, task_meta, task_meta_key

Paths = Callable[[redis.Redis], redis.Redis]
# The result backend is the broker's own client (one pipeline), or another client
# of the same server (the lock's acquire, then a read).
BACKENDS = {
    "same client": lambda broker: broker,
    "other client": lambda broker: redis.Redis(connection_pool=broker.connection_pool),
}


@pytest.fixture(params=list(BACKENDS))
def results_of(request: pytest.FixtureRequest) -> Paths:
    return BACKENDS[request.param]


def test_free_claim_is_taken_renewed_and_released(redis_client, results_of):
    results = results_of(redis_client)
    claim, skip = claims.claim_batch(redis_client, results, "b1", "t1")
    assert skip is None
    assert claim is not None
    held = redis_client.get(claim_key("b1"))
    assert held is not None
    assert held == claim.local.token
    assert 0 < redis_client.pttl(claim_key("b1")) <= claims.CLAIM_TTL_S * 1000
    redis_client.pexpire(claim_key("b1"), 500)
    claims.renew(claim)  # only its holder's token may reset the TTL
    assert redis_client.pttl(claim_key("b1")) > 500
    claims.release(claim)
    assert redis_client.exists(claim_key("b1")) == 0


def test_copy_of_an_answered_batch_takes_no_claim(redis_client, results_of):
    results = results_of(redis_client)
    redis_client.set(task_meta_key("t1"), task_meta("SUCCESS", "[]", "t1"))
    claim, skip = claims.claim_batch(redis_client, results, "b1", "t1")
    assert claim is None
    assert skip is not None
    assert skip[0] == "answered"
    assert redis_client.exists(claim_key("b1")) == 0  # taken, then dropped


def test_started_state_is_not_taken_for_a_result(redis_client, results_of):
    results = results_of(redis_client)
    redis_client.set(task_meta_key("t1"), task_meta("STARTED", "{}", "t1"))
    claim, skip = claims.claim_batch(redis_client, results, "b1", "t1")
    assert skip is None
    assert claim is not None


def test_held_claim_waits_then_skips_or_takes_over(
    redis_client, results_of, monkeypatch
):
    results = results_of(redis_client)
    monkeypatch.setattr(claims, "CLAIM_TTL_S", 0.4)
    monkeypatch.setattr(claims, "_POLL_S", 0.05)
    # Held by a live delivery (its heartbeat keeps it): this copy is not graded
    redis_client.set(claim_key("b1"), b"other", px=60_000)
    started = time.monotonic()
    claim, skip = claims.claim_batch(redis_client, results, "b1", "t1")
    assert claim is None
    assert skip is not None
    assert skip[0] == "claimed"
    assert time.monotonic() - started >= 0.4
    assert redis_client.get(claim_key("b1")) == b"other"
    # Held by a delivery that died (the claim lapses): this copy takes it
    redis_client.set(claim_key("b2"), b"other", px=150)
    claim, skip = claims.claim_batch(redis_client, results, "b2", "t2")
    assert skip is None
    assert claim is not None
    assert redis_client.get(claim_key("b2")) == claim.local.token
