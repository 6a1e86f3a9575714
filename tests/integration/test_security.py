"""Security of a node as an operator deploys it, on real processes: the metrics
endpoint (loopback, `/metrics` only, O(1) Redis reads), Celery remote control limited
to what `gradefleet status` needs, passwords kept off argv and out of every message,
and `rediss://` with certificate checks by default."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from producer.cli import cli
from tests.helpers import free_port

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-pa55"


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _listening_addresses(port: int) -> set[str]:
    """Local IPv4 addresses listening on `port` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        hex_addr, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            octets = [str(int(hex_addr[i : i + 2], 16)) for i in (6, 4, 2, 0)]
            found.add(".".join(octets))
    return found


def _write_jsonl(path: Path, n: int) -> Path:
    lines = [
        json.dumps({"response": f"\\boxed{{{i}}}", "gold": str(i)}) for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_security_metrics_endpoint_loopback_metrics_path_only_no_hvals(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a worker with a metrics port and no bind address set, on its own Redis
    url = start_redis_server()
    port = free_port()
    env = {
        "GRADEFLEET_METRICS_PORT": str(port),
        "GRADEFLEET_METRICS_DIR": str(tmp_path / "m"),
    }
    make_workers(url).start(extra_env=env)
    client = redis.Redis.from_url(url)
    # ...and 500 delivered-but-unacked messages in kombu's hash
    client.hset("unacked", mapping={f"tag{i}": "x" * 1000 for i in range(500)})
    client.config_resetstat()
    # When it is scraped 5 times and asked for other paths
    for _ in range(5):
        status, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
    others = [_get(f"http://127.0.0.1:{port}{path}")[0] for path in ("/", "/x", "//")]
    # Then it listens on loopback only, answers /metrics only, and read the unacked
    # count with HLEN (never HVALS)
    assert _listening_addresses(port) == {"127.0.0.1"}
    assert others == [404, 404, 404]
    assert b"gradefleet_broker_unacked 500.0" in body
    stats = client.info("commandstats")
    assert "cmdstat_hvals" not in stats
    assert stats["cmdstat_hlen"]["calls"] == 5


def test_security_metrics_addr_option_binds_all_interfaces(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a worker told to serve metrics to other machines (as the image does)
    url = start_redis_server()
    port = free_port()
    env = {
        "GRADEFLEET_METRICS_PORT": str(port),
        "GRADEFLEET_METRICS_ADDR": "0.0.0.0",
        "GRADEFLEET_METRICS_DIR": str(tmp_path / "m"),
    }
    make_workers(url).start(extra_env=env)
    # Then it listens on every interface
    assert _listening_addresses(port) == {"0.0.0.0"}


def test_security_remote_control_shutdown_is_refused_status_still_works(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a live worker on its own Redis
    url = start_redis_server()
    worker = make_workers(url).start()
    app = Celery("attacker", broker=url, set_as_current=False)
    try:
        # When anyone with broker access broadcasts shutdown (and pool_restart)
        app.control.broadcast("shutdown")
        app.control.broadcast("pool_restart", arguments={"reload": False})
        time.sleep(3)
        # Then the worker still runs, and `gradefleet status` still sees it
        assert worker.proc.poll() is None, worker.log()
        result = CliRunner().invoke(
            cli, ["status", "--broker", url, "--json", "--window-s", "0.2"]
        )
        assert result.exit_code == 0, result.output
        assert [w["name"] for w in json.loads(result.stdout)["workers"]] == [
            worker.hostname
        ]
        # ...and it still grades
        source = _write_jsonl(tmp_path / "in.jsonl", 4)
        out = tmp_path / "out.jsonl"
        graded = CliRunner().invoke(
            cli, ["grade", str(source), "-o", str(out), "--broker", url, "-q"]
        )
        assert graded.exit_code == 0, graded.output
        assert "shutdown" in worker.log()  # the refused command is logged
    finally:
        app.close()


def test_security_password_from_file_and_env_never_printed(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a Redis that requires a password, known to the worker from a file and
    # to the CLI from an environment variable (the URLs carry none)
    url = start_redis_server()
    redis.Redis.from_url(url).config_set("requirepass", PASSWORD)
    secret_file = tmp_path / "redis-password"
    secret_file.write_text(PASSWORD + "\n")
    env = {"GRADEFLEET_REDIS_PASSWORD_FILE": str(secret_file)}
    worker = make_workers(url).start(extra_env=env)
    source = _write_jsonl(tmp_path / "in.jsonl", 6)
    out = tmp_path / "out.jsonl"
    # When a file is graded, and status is read
    runner = CliRunner(env={"GRADEFLEET_REDIS_PASSWORD": PASSWORD})
    graded = runner.invoke(cli, ["grade", str(source), "-o", str(out), "--broker", url])
    status = runner.invoke(cli, ["status", "--broker", url, "--window-s", "0.1"])
    # ...and, without the password, the CLI is refused
    refused = CliRunner().invoke(
        cli, ["grade", str(source), "-o", str(out), "--broker", url]
    )
    # Then it works with the password, and the password is printed nowhere
    assert graded.exit_code == 0, graded.output
    assert [json.loads(x)["correct"] for x in out.read_text().splitlines()] == [
        True
    ] * 6
    assert status.exit_code == 0, status.output
    assert "1 live" in status.output
    assert refused.exit_code == 5, refused.output
    for text in (graded.output, status.output, refused.output, worker.log()):
        assert PASSWORD not in text
    assert PASSWORD not in " ".join(worker.proc.args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        f"redis://user:{PASSWORD}@127.0.0.1:{{port}}/0",
        f"redis://127.0.0.1:{{port}}/0?password={PASSWORD}",
        f"redis://:{PASSWORD}@127.0.0.1:{{port}}/0?socket_timeout=1",
    ],
)
def test_security_password_in_url_is_redacted_in_errors(url: str) -> None:
    # Given a broker URL that carries a password, to a port where nothing listens
    broker = url.format(port=free_port())
    # When grade and status fail to reach it
    runner = CliRunner()
    graded = runner.invoke(cli, ["grade", "-", "-o", "-", "--broker", broker], "")
    status = runner.invoke(cli, ["status", "--broker", broker])
    # Then both exit 5 and print the URL redacted
    assert graded.exit_code == 5, graded.output
    assert status.exit_code == 5, status.output
    for result in (graded, status):
        assert PASSWORD not in result.output
        assert "***" in result.output


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A redis-server speaking TLS only, with a self-signed certificate for
    127.0.0.1; yields (rediss URL without ssl_cert_reqs, CA file)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes"),
            *("-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    args = ["redis-server", "--port", "0", "--tls-port", str(port), "--save", ""]
    args += ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    args += ["--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
    args += ["--dir", str(tmp_path)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    try:
        client = redis.Redis.from_url(url + "&ssl_cert_reqs=required")
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url, cert
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_security_rediss_url_without_cert_reqs_works_end_to_end(
    tls_redis: tuple[str, Path], make_workers: Any, tmp_path: Path
) -> None:
    # Given a TLS-only Redis and a rediss:// URL that does not say ssl_cert_reqs
    url, _ = tls_redis
    # When a worker starts on it and a file is graded through it
    worker = make_workers(url).start()
    source = _write_jsonl(tmp_path / "in.jsonl", 5)
    out = tmp_path / "out.jsonl"
    graded = CliRunner().invoke(
        cli, ["grade", str(source), "-o", str(out), "--broker", url, "-q"]
    )
    # Then the worker runs (it used to crash at start) and every line is graded
    assert worker.proc.poll() is None, worker.log()
    assert graded.exit_code == 0, graded.output
    assert len(out.read_text().splitlines()) == 5


def test_security_rediss_verifies_the_certificate_by_default(
    tls_redis: tuple[str, Path],
) -> None:
    # Given the TLS Redis, reached WITHOUT its CA (so its certificate is unknown)
    url, _ = tls_redis
    no_ca = url.split("?")[0]
    # When the CLI grades through it
    result = CliRunner().invoke(cli, ["grade", "-", "-o", "-", "--broker", no_ca], "")
    # Then the certificate check refuses it (exit 5, broker unreachable)
    assert result.exit_code == 5, result.output
    assert "certificate" in result.output.lower()
