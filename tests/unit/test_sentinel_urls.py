"""`sentinel://` URLs: parsed by workers.wire.urls, turned into kombu's form by
workers.wire.connections, and redacted like every other URL."""

from __future__ import annotations

import pytest
import redis.asyncio.sentinel
import redis.sentinel

from workers.errors import ConfigError
from workers.wire.connections import (
    async_redis_client,
    celery_endpoint,
    control_app,
    redis_client,
)
from workers.wire.urls import connect_url, parse_sentinel_url, redact_url

URL = "sentinel://:p%40w@h1:26380,[::1]:26381,h3/2?master_name=mymaster"


def test_sentinel_urls_parse_hosts_db_and_credentials() -> None:
    parsed = parse_sentinel_url(URL + "&sentinel_password=spw")
    assert parsed.sentinels == (("h1", 26380), ("::1", 26381), ("h3", 26379))
    assert parsed.master_name == "mymaster"
    assert parsed.db == 2
    assert parsed.password == "p@w"
    assert parsed.username is None
    assert parsed.sentinel_password == "spw"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://h1:26379/0", "master_name"),
        ("sentinel:///0?master_name=m", "no sentinel host"),
        ("sentinel://h1:port/0?master_name=m", "bad sentinel port"),
        ("sentinel://h1/x?master_name=m", "database must be a number"),
        ("sentinel://h1/0?master_name=m&socket_timeout=1", "unknown parameter"),
        ("redis://h1/0?master_name=m", "not a sentinel:// URL"),
    ],
)
def test_sentinel_urls_refuse_malformed(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_sentinel_url(url)


def test_sentinel_urls_malformed_error_hides_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        parse_sentinel_url("sentinel://:secret@h1:26379/0")
    assert "secret" not in str(info.value)


def test_sentinel_urls_redact_every_password() -> None:
    printed = redact_url(URL + "&sentinel_password=spw")
    assert "p%40w" not in printed
    assert "spw" not in printed
    assert printed.startswith("sentinel://:***@h1:26380,[::1]:26381,h3/2?")


def test_sentinel_urls_connect_url_inserts_password_from_env() -> None:
    url = connect_url("sentinel://h1:1,h2:2/0?master_name=m", password="pw")
    assert parse_sentinel_url(url).password == "pw"


def test_sentinel_urls_celery_form_one_url_per_sentinel() -> None:
    endpoint = celery_endpoint(URL + "&sentinel_password=spw")
    assert endpoint.url == (
        "sentinel://:p%40w@h1:26380/2;sentinel://:p%40w@[::1]:26381/2;"
        "sentinel://:p%40w@h3:26379/2"
    )
    assert endpoint.transport_options == {
        "master_name": "mymaster",
        "sentinel_kwargs": {"password": "spw"},
    }


def test_sentinel_urls_celery_form_leaves_redis_urls_alone() -> None:
    endpoint = celery_endpoint("redis://:pw@h:6379/0")
    assert endpoint.url == "redis://:pw@h:6379/0"
    assert endpoint.transport_options == {}


def test_sentinel_urls_client_asks_the_sentinels_for_the_master() -> None:
    # Building the client connects nowhere; its pool resolves the master per
    # connection (after a failover: the promoted replica).
    client = redis_client(URL, socket_timeout=1.0)
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert pool.connection_kwargs["db"] == 2
    assert pool.connection_kwargs["password"] == "p@w"
    sentinels = pool.sentinel_manager.sentinels
    hosts = [s.connection_pool.connection_kwargs["host"] for s in sentinels]
    assert hosts == ["h1", "::1", "h3"]
    client.close()


def test_sentinel_urls_async_client_asks_the_sentinels_too() -> None:
    client = async_redis_client(URL)
    pool = client.connection_pool
    assert isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert pool.connection_kwargs["db"] == 2


def test_sentinel_urls_worker_app_gets_master_name_for_broker_and_results() -> None:
    from workers.fleet.app import create_app
    from workers.fleet.settings import WorkerSettings

    settings = WorkerSettings.from_env({"GRADEFLEET_BROKER_URL": URL})
    app = create_app(settings)
    assert app.conf.broker_url.startswith("sentinel://:p%40w@h1:26380/2;")
    assert app.conf.broker_transport_options["master_name"] == "mymaster"
    # kept beside it: the worker's own options
    assert app.conf.broker_transport_options["visibility_timeout"] >= 3_600
    assert app.conf.result_backend == app.conf.broker_url
    assert app.conf.result_backend_transport_options == {"master_name": "mymaster"}


def test_sentinel_urls_control_app_for_status_and_watch() -> None:
    app = control_app("gradefleet-status", URL)
    try:
        assert app.conf.broker_url.count("sentinel://") == 3
        assert app.conf.broker_transport_options == {"master_name": "mymaster"}
    finally:
        app.close()
