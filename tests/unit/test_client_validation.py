"""Producer client pieces that need no server: input checks, errors, helpers."""

from __future__ import annotations

import time

import pytest

from producer.client.fleet import GradingClient, Rollout
from producer.client.job import format_ranges
from producer.client.rollouts import validate_rollouts
from producer.errors import BrokerUnavailableError, InvalidRolloutError
from producer.settings import redact_url
from tests.helpers import free_port


def test_client_validate_accepts_rollouts_and_mappings():
    triples = validate_rollouts(
        [Rollout("r0", "g0"), {"response": "r1", "gold": "g1", "id": 9}]
    )
    assert triples == [(0, "r0", "g0"), (1, "r1", "g1")]


@pytest.mark.parametrize(
    "bad",
    [{"response": "r"}, {"response": None, "gold": "g"}, ("r", "g"), 5],
    ids=["no-gold", "none-response", "tuple", "int"],
)
def test_client_validate_names_the_bad_index(bad):
    with pytest.raises(InvalidRolloutError, match="rollout 1"):
        validate_rollouts([Rollout("r", "g"), bad])


def test_client_validate_rejects_oversized_text():
    with pytest.raises(InvalidRolloutError, match="rollout 0"):
        validate_rollouts([Rollout("x" * 1_000_001, "1")])


def test_client_unreachable_broker_fails_fast_and_clearly():
    # Given a port nobody listens on
    port = free_port()
    started = time.monotonic()
    # When a client is created, Then it fails at once with the URL (no password)
    with pytest.raises(BrokerUnavailableError, match=f"127.0.0.1:{port}") as info:
        GradingClient(f"redis://:secret@127.0.0.1:{port}/0")
    assert "secret" not in str(info.value)
    assert time.monotonic() - started < 5
    assert BrokerUnavailableError.exit_code == 5


def test_client_redact_url_hides_password():
    assert redact_url("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"


def test_client_format_ranges_compacts_indexes():
    assert format_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert format_ranges([]) == ""
    assert format_ranges(list(range(0, 100, 2)), limit=2).endswith("(+48 ranges)")


def test_client_celery_app_has_no_result_backend_and_finds_none(monkeypatch):
    # Given Celery's scan of installed packages' entry points made to fail (it took
    # 0.12 s on a fleet CLI's first publish)
    import celery.utils.imports
    from celery.backends.base import DisabledBackend

    from producer.client.fleet import _producer_app

    def no_scan(**_kw: object) -> object:
        raise AssertionError("scanned entry points for a result backend")

    # (recent Celery keeps the scan's result: forgotten around this test)
    forget = getattr(
        celery.utils.imports.load_extension_class_names, "cache_clear", lambda: None
    )
    monkeypatch.setattr(celery.utils.imports, "entry_points", no_scan)
    forget()
    # Then the producer's app still has its (disabled) backend, found without it
    app = _producer_app("redis://127.0.0.1:1/0")
    try:
        assert type(app.backend) is DisabledBackend
    finally:
        app.close()
        forget()
