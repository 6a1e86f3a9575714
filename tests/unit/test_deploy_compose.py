"""deploy/docker-compose.yml is consistent: every service, volume, port, env var, file
and command-line flag it names exists (deploy/test-image.sh runs its worker command
from the built image; no registry here to pull Redis, Prometheus or Grafana)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from workers.__main__ import build_parser
from workers.fleet.settings import WorkerSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def _env_read_by_worker() -> set[str]:
    class Recording(dict[str, str]):
        def get(self, key, default=None):
            read.add(key)
            return super().get(key, default)

    read: set[str] = set()
    WorkerSettings.from_env(Recording())
    return read


def _command_text(service: str) -> str:
    return " ".join(map(str, SERVICES[service]["command"]))


def test_deploy_compose_services():
    assert set(SERVICES) == {
        "broker", "cache", "worker", "code-worker", "service", "prometheus",
        "grafana",
    }  # fmt: skip
    for name, service in SERVICES.items():
        for dep in service.get("depends_on", []):
            assert dep in SERVICES, (name, dep)
    assert SERVICES["worker"]["deploy"]["replicas"] >= 2


def test_deploy_compose_redis_roles():
    broker, cache = _command_text("broker"), _command_text("cache")
    assert "--maxmemory-policy noeviction" in broker
    assert "--appendonly yes" in broker
    assert "broker-data:/data" in SERVICES["broker"]["volumes"]
    assert "--maxmemory-policy allkeys-lru" in cache
    assert "--save  --appendonly no" in cache  # --save "" : no snapshots
    assert "volumes" not in SERVICES["cache"]


def test_deploy_compose_worker_command_and_env():
    command = [str(a) for a in SERVICES["worker"]["command"]]
    assert command[0] == "worker"
    build_parser().parse_args(command[1:])  # exits (SystemExit) on an unknown flag
    env = SERVICES["worker"]["environment"]
    assert set(env) <= _env_read_by_worker()
    urls = [v for k, v in env.items() if k.endswith("_URL")]
    assert len(urls) == 2
    for url in urls:
        host, port = re.fullmatch(r"redis://([\w-]+):(\d+)/\d+", url).groups()  # type: ignore[union-attr]
        assert host in {"broker", "cache"}
        assert port == "6379"
    assert env["GRADEFLEET_BROKER_URL"].startswith("redis://broker:")
    assert env["GRADEFLEET_CACHE_URL"].startswith("redis://cache:")
    # The memory limit holds every sandbox child at its cap, plus the processes
    # (the key file exists only in the container).
    settings = WorkerSettings.from_env(
        {k: v for k, v in env.items() if k != "GRADEFLEET_SIGNING_KEY_FILE"}
    )
    parsed = build_parser().parse_args(command[1:])
    concurrency = parsed.concurrency or settings.concurrency
    limit = SERVICES["worker"]["deploy"]["resources"]["limits"]["memory"]
    assert int(limit.removesuffix("m")) >= concurrency * settings.item_memory_mb + 256
    # Warm shutdown: the longest batch finishes before the stop timeout.
    grace = int(SERVICES["worker"]["stop_grace_period"].removesuffix("s"))
    assert grace >= settings.longest_batch_s + 30


# What deploy/test-image.sh gives its code worker container, and
# deploy/k8s/components/code-workers its pods: the code sandbox's rights, no others.
CODE_CAPABILITIES = ["SYS_ADMIN", "SETUID", "SETGID", "SETPCAP", "KILL", "NET_ADMIN"]


def _worker_settings(service: str) -> WorkerSettings:
    """The settings a compose worker service runs with: its env, then its options
    (the key file exists only in the container)."""
    from workers.__main__ import settings_from_args

    env = SERVICES[service]["environment"]
    command = [str(a) for a in SERVICES[service]["command"]]
    assert command[0] == "worker"
    args = build_parser().parse_args(command[1:])
    environ = {k: v for k, v in env.items() if k != "GRADEFLEET_SIGNING_KEY_FILE"}
    return settings_from_args(args, environ)


def test_deploy_compose_each_kind_has_its_workers_on_one_broker():
    math, code = _worker_settings("worker"), _worker_settings("code-worker")
    # One broker and cache; math workers take the math queues, code workers the
    # code queues (and nothing routes code to the locked-down math workers)
    assert (math.kinds, code.kinds) == (("math",), ("code",))
    assert code.broker_url == math.broker_url
    assert code.cache_url == math.cache_url
    env = SERVICES["code-worker"]["environment"]
    assert set(env) <= _env_read_by_worker()
    # The code worker: root in the container with the sandbox's capabilities only,
    # no new privileges, a read-only root with a /tmp for its metrics files
    service = SERVICES["code-worker"]
    assert str(service["user"]) == "0"
    assert service["cap_drop"] == ["ALL"]
    assert service["cap_add"] == CODE_CAPABILITIES
    assert service["security_opt"] == ["no-new-privileges:true"]
    assert "privileged" not in service
    assert service["read_only"] is True
    assert service["tmpfs"] == ["/tmp"]
    assert code.metrics_dir is not None
    assert code.metrics_dir.startswith("/tmp/")
    # The math worker has none of them
    assert not {"user", "cap_add", "privileged"} & set(SERVICES["worker"])
    # Memory: a code rollout and a math sandbox child per grading process; the
    # longest batch finishes before the stop timeout
    limit = int(service["deploy"]["resources"]["limits"]["memory"].removesuffix("m"))
    assert limit >= code.concurrency * 2 * code.item_memory_mb + 256
    grace = int(service["stop_grace_period"].removesuffix("s"))
    assert grace >= code.longest_batch_s + 30


def test_deploy_compose_metrics_port_matches_prometheus():
    prometheus = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    (job,) = [
        j for j in prometheus["scrape_configs"] if j["job_name"] == "gradefleet-workers"
    ]
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["worker", "code-worker"]
    for service in sd["names"]:
        command = [str(a) for a in SERVICES[service]["command"]]
        assert int(command[command.index("--metrics-port") + 1]) == sd["port"]
    for rule_file in prometheus["rule_files"]:
        assert (DEPLOY / "prometheus" / rule_file).is_file()


def test_deploy_compose_service():
    command = [str(a) for a in SERVICES["service"]["command"]]
    assert command[0] == "serve"
    env = SERVICES["service"]["environment"]
    assert (
        env["GRADEFLEET_BROKER_URL"]
        == SERVICES["worker"]["environment"]["GRADEFLEET_BROKER_URL"]
    )
    # The token is required, never defaulted in the file.
    assert env["GRADEFLEET_SERVE_TOKEN"].startswith("${GRADEFLEET_SERVE_TOKEN:?")
    port = command[command.index("--port") + 1]
    assert env["GRADEFLEET_HEALTHCHECK_URL"] == f"http://127.0.0.1:{port}/readyz"
    assert SERVICES["service"]["ports"] == [f"{port}:{port}"]
    from producer.cli import cli

    serve = cli.commands["serve"]
    flags = {opt for p in serve.params for opt in getattr(p, "opts", [])}
    assert {a for a in command[1:] if a.startswith("--")} <= flags
    envvars = {p.envvar for p in serve.params if isinstance(p.envvar, str)}
    assert {"GRADEFLEET_SERVE_TOKEN", "GRADEFLEET_BROKER_URL"} <= envvars


KEY_SECRET = "gradefleet-signing-key"


def _gradefleet_services() -> list[str]:
    """Every service that runs the gradefleet image (workers, service, producers)."""
    image = SERVICES["worker"]["image"]
    return sorted(n for n, s in SERVICES.items() if s.get("image") == image)


def test_deploy_compose_every_gradefleet_service_holds_the_fleet_key():
    assert {"worker", "code-worker", "service"} <= set(_gradefleet_services())
    for name in _gradefleet_services():
        service = SERVICES[name]
        # The key is a file from the compose secret, named by the variable the
        # worker (and the producer CLI and service) read: never a value in env.
        assert service["secrets"] == [KEY_SECRET], name
        env = service["environment"]
        assert env["GRADEFLEET_SIGNING_KEY_FILE"] == f"/run/secrets/{KEY_SECRET}"
        assert "GRADEFLEET_SIGNING_KEY" not in env, name
    assert "GRADEFLEET_SIGNING_KEY_FILE" in _env_read_by_worker()
    # Required from whoever starts the stack, never a default in the file.
    source = COMPOSE["secrets"][KEY_SECRET]["file"]
    assert re.fullmatch(r"\$\{GRADEFLEET_SIGNING_KEY_FILE:\?[^}]+\}", source), source
    assert set(COMPOSE["secrets"]) == {KEY_SECRET}


def test_deploy_compose_no_key_value_committed():
    # What `secrets.token_hex` makes (the README's recipe), in no file of deploy/;
    # and no service gets a key by value.
    tracked = subprocess.run(
        ["git", "ls-files", "deploy"],
        cwd=DEPLOY.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert tracked
    for path in tracked:
        text = (DEPLOY.parent / path).read_text(errors="replace")
        assert not re.search(r"[0-9a-fA-F]{32,}", text), path
    for name, service in SERVICES.items():
        env = service.get("environment") or {}
        assert not {k for k in env if k.startswith("GRADEFLEET_SIGNING_KEY")} - {
            "GRADEFLEET_SIGNING_KEY_FILE"
        }, name


def test_deploy_compose_image_build():
    for name in ("worker", "code-worker", "service"):
        build = SERVICES[name]["build"]
        context = (DEPLOY / build["context"]).resolve()
        assert (context / build["dockerfile"]).is_file()
        assert (context / "pyproject.toml").is_file()


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_deploy_compose_volumes_exist(name):
    for volume in SERVICES[name].get("volumes", []):
        source, target = volume.split(":")[:2]
        assert target.startswith("/")
        if source.startswith("."):
            assert (DEPLOY / source).exists(), volume
        else:
            assert source in COMPOSE["volumes"], volume


def test_deploy_compose_named_volumes_are_used():
    used = {
        v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", [])
    }  # fmt: skip
    assert set(COMPOSE["volumes"]) <= used


def test_deploy_compose_host_ports_unique():
    host_ports = [
        p.split(":")[0] for s in SERVICES.values() for p in s.get("ports", [])
    ]
    assert len(host_ports) == len(set(host_ports))


def test_deploy_compose_grafana_provisioning():
    mounts = dict(v.split(":")[:2] for v in SERVICES["grafana"]["volumes"])
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    provisioning = DEPLOY / "grafana/provisioning"
    dashboards = yaml.safe_load(
        (provisioning / "dashboards/gradefleet.yml").read_text()
    )
    (provider,) = dashboards["providers"]
    assert provider["options"]["path"] == mounts["./grafana/dashboards"]
    assert list((DEPLOY / "grafana/dashboards").glob("*.json"))
    sources = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())
    (source,) = sources["datasources"]
    port = SERVICES["prometheus"]["ports"][0].split(":")[1]
    assert source["url"] == f"http://prometheus:{port}"


PODMAN_COMPOSE = (sys.executable, "-m", "podman_compose", "--dry-run")


def _podman_compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # --dry-run: podman-compose resolves the file without calling podman.
    return subprocess.run(
        [*PODMAN_COMPOSE, "-f", str(DEPLOY / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_deploy_compose_podman_compose_config(tmp_path):
    required = ("GRADEFLEET_SERVE_TOKEN", "GRADEFLEET_SIGNING_KEY_FILE")
    env = {k: v for k, v in os.environ.items() if k not in required}
    key_file = tmp_path / "fleet.key"
    given = {
        "GRADEFLEET_SERVE_TOKEN": "t0ken",
        "GRADEFLEET_SIGNING_KEY_FILE": str(key_file),
    }
    # Without either the token or the key file, the stack does not start.
    for name in required:
        missing = _podman_compose_config({**env, **given, name: ""})
        assert missing.returncode != 0, name
        assert name in missing.stderr
    proc = _podman_compose_config({**env, **given})
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert set(resolved["services"]) == set(SERVICES)
    assert resolved["services"]["service"]["environment"]["GRADEFLEET_SERVE_TOKEN"] == (
        "t0ken"
    )
    for name in ("worker", "service"):
        build = resolved["services"][name]["build"]
        assert (Path(build["context"]) / build["dockerfile"]).is_file()
    assert "broker-data" in resolved["volumes"]
    # The key file given is what compose mounts where the services look for it.
    assert resolved["secrets"] == {KEY_SECRET: {"file": str(key_file)}}
    for name in _gradefleet_services():
        service = resolved["services"][name]
        assert service["secrets"] == [KEY_SECRET]
        assert service["environment"]["GRADEFLEET_SIGNING_KEY_FILE"] == (
            f"/run/secrets/{KEY_SECRET}"
        )
