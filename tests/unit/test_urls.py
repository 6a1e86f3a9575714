"""workers.wire.urls: one redaction for every URL form, rediss:// defaults, secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.errors import ConfigError
from workers.wire.urls import connect_url, is_loopback_url, read_secret, redact_url


@pytest.mark.parametrize(
    ("url", "printed"),
    [
        # userinfo
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:pw@h/0", "redis://user:***@h/0"),
        ("rediss://u:p%40ss@h:1/0", "rediss://u:***@h:1/0"),
        # query parameters that carry a credential
        ("redis://h/0?password=pw", "redis://h/0?password=***"),
        (
            "redis://h/0?socket_timeout=1&password=pw",
            "redis://h/0?socket_timeout=1&password=***",
        ),
        (
            "sentinel://h:26379?sentinel_password=pw",
            "sentinel://h:26379?sentinel_password=***",
        ),
        ("redis://u:a@h/0?Password=b", "redis://u:***@h/0?Password=***"),
        # nothing to hide
        ("redis://h:6379/0", "redis://h:6379/0"),
        (
            "rediss://h/0?ssl_ca_certs=/etc/ca.pem",
            "rediss://h/0?ssl_ca_certs=/etc/ca.pem",
        ),
        # unparsable: never echoed
        ("redis://[::1:6379/0?password=pw", "<unparsable URL>"),
    ],
)
def test_urls_redact_url_hides_every_password_form(url: str, printed: str) -> None:
    assert redact_url(url) == printed
    assert "pw" not in redact_url(url).replace("password", "")


def test_urls_connect_url_inserts_password_only_when_missing() -> None:
    assert connect_url("redis://h:1/0", password="p@ss") == "redis://:p%40ss@h:1/0"
    assert connect_url("redis://u@h:1/0", password="x") == "redis://u:x@h:1/0"
    assert connect_url("redis://:own@h/0", password="x") == "redis://:own@h/0"
    assert connect_url("redis://h/0", password=None) == "redis://h/0"


def test_urls_connect_url_rediss_verifies_certificates_unless_told() -> None:
    assert connect_url("rediss://h/0") == "rediss://h/0?ssl_cert_reqs=required"
    with_ca = connect_url("rediss://h/0?ssl_ca_certs=/ca.pem")
    assert with_ca == "rediss://h/0?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required"
    told = "rediss://h/0?ssl_cert_reqs=none"
    assert connect_url(told) == told
    assert connect_url("redis://h/0") == "redis://h/0"


def test_urls_read_secret_from_env_or_file(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("from-file\n")
    assert read_secret({"X": "from-env"}, "X") == "from-env"
    assert read_secret({"X_FILE": str(path)}, "X") == "from-file"
    assert read_secret({}, "X") is None
    with pytest.raises(ConfigError, match="not both"):
        read_secret({"X": "a", "X_FILE": str(path)}, "X")
    with pytest.raises(ConfigError, match="cannot read"):
        read_secret({"X_FILE": str(tmp_path / "missing")}, "X")


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("redis://127.0.0.1:6379/0", True),
        ("redis://:pw@127.0.0.2/0", True),
        ("redis://LOCALHOST/0", True),
        ("redis://[::1]:6379/0", True),
        ("redis:///0", True),  # no host: redis-py connects to localhost
        ("unix:///run/redis.sock", True),
        ("sentinel://127.0.0.1:26379,localhost:26380?master_name=m", True),
        ("sentinel://127.0.0.1:26379,s2:26380?master_name=m", False),
        ("rediss://broker:6379/0", False),
        ("redis://10.0.0.1/0", False),
        ("redis://localhost.example.com/0", False),  # a name: never resolved
        ("redis://[::1/0", False),  # does not parse: assume the worst
        ("sentinel://h:26379", False),  # no master_name: does not parse either
    ],
)
def test_urls_loopback_from_the_text_alone(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback
