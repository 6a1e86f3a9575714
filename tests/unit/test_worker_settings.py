"""Worker settings from env and options, and the Celery configuration they produce."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workers.__main__ import (
    build_parser,
    settings_from_args,
    unkeyed_notice,
    worker_argv,
)
from workers.errors import ConfigError
from workers.fleet.app import create_app
from workers.fleet.settings import WorkerSettings
from workers.wire.contract import GRADE_BATCH, QUEUE


def test_worker_settings_defaults_from_empty_env():
    settings = WorkerSettings.from_env({})
    assert settings.broker_url == "redis://127.0.0.1:6379/0"
    assert settings.cache_url == settings.broker_url
    assert settings.backend_url == settings.broker_url
    assert settings.item_timeout_s == 5.0
    assert settings.item_memory_bytes == 1024 * 1024 * 1024
    assert settings.max_attempts == 3
    assert settings.metrics_port == 0
    assert settings.metrics_addr == "127.0.0.1"  # loopback outside the image
    assert settings.test_hooks_path is None


def test_worker_settings_read_every_variable():
    settings = WorkerSettings.from_env(
        {
            "GRADEFLEET_BROKER_URL": "redis://b:1/0",
            "GRADEFLEET_RESULT_BACKEND": "redis://r:1/0",
            "GRADEFLEET_CACHE_URL": "none",
            "GRADEFLEET_CONCURRENCY": "3",
            "GRADEFLEET_ITEM_TIMEOUT_S": "2.5",
            "GRADEFLEET_ITEM_MEMORY_MB": "256",
            "GRADEFLEET_CACHE_TTL_S": "60",
            "GRADEFLEET_METRICS_PORT": "9100",
            "GRADEFLEET_METRICS_DIR": "/tmp/m",
            "GRADEFLEET_METRICS_ADDR": "0.0.0.0",
            "GRADEFLEET_MAX_ATTEMPTS": "5",
            "GRADEFLEET_TEST_HOOKS": "/t/hooks.py",
        }
    )
    assert settings.backend_url == "redis://r:1/0"
    assert settings.cache_url is None
    assert (settings.concurrency, settings.item_timeout_s) == (3, 2.5)
    assert (settings.item_memory_mb, settings.cache_ttl_s) == (256, 60)
    assert (settings.metrics_port, settings.metrics_dir) == (9100, "/tmp/m")
    assert settings.metrics_addr == "0.0.0.0"
    assert settings.max_attempts == 5
    assert settings.test_hooks_path == "/t/hooks.py"


@pytest.mark.parametrize(
    "env",
    [
        {"GRADEFLEET_CONCURRENCY": "two"},
        {"GRADEFLEET_CONCURRENCY": "0"},
        {"GRADEFLEET_ITEM_TIMEOUT_S": "-1"},
        {"GRADEFLEET_METRICS_PORT": "70000"},
    ],
    ids=["not-int", "zero-procs", "negative-timeout", "port-range"],
)
def test_worker_settings_reject_bad_values(env):
    with pytest.raises(ConfigError):
        WorkerSettings.from_env(env)


def test_worker_options_override_env():
    args = build_parser().parse_args(
        ["--broker", "redis://x:1/0", "--concurrency", "4", "--item-timeout-s", "1"]
    )
    settings = settings_from_args(args, {"GRADEFLEET_CONCURRENCY": "2"})
    assert settings.broker_url == "redis://x:1/0"
    assert settings.cache_url == "redis://x:1/0"  # the cache follows the broker
    assert (settings.concurrency, settings.item_timeout_s) == (4, 1.0)
    argv = worker_argv(settings.replace(kinds=("math",)))
    assert "--pool=prefork" in argv
    assert "--concurrency=4" in argv
    # Every lane, interactive (the original queue) first.
    assert f"--queues={QUEUE},{QUEUE}.bulk" in argv
    args = build_parser().parse_args(["--lanes", "interactive", "--kinds", "math"])
    assert "--queues=gradefleet" in worker_argv(settings_from_args(args, {}))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--lanes", "urgent"])


def test_worker_app_is_json_only_late_ack_prefetch_one():
    settings = WorkerSettings(item_timeout_s=5.0, max_batch_size=256)
    app = create_app(settings)
    conf = app.conf
    assert conf.accept_content == ["json"]
    assert conf.result_accept_content == ["json"]
    assert conf.task_serializer == conf.result_serializer == "json"
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert GRADE_BATCH in app.tasks
    # Backstops sit beyond the longest batch; Redis re-delivers only after 2x that.
    visibility_s = conf.broker_transport_options["visibility_timeout"]
    assert settings.longest_batch_s < conf.task_soft_time_limit < conf.task_time_limit
    assert visibility_s >= max(3_600, 2 * settings.longest_batch_s)
    assert conf.task_time_limit < visibility_s


def test_worker_main_process_warms_the_verifier_before_the_pool_forks():
    # In a fresh interpreter: the app alone does not import SymPy; Celery's
    # `worker_init` (sent in the main process before the pool starts) does, and
    # freezes the heap, so every prefork child starts warm on shared pages.
    script = (
        "import gc, sys\n"
        "from celery.signals import worker_init\n"
        "from workers.fleet.app import create_app\n"
        "from workers.fleet.settings import WorkerSettings\n"
        "create_app(WorkerSettings())\n"
        "before = 'sympy' in sys.modules\n"
        "worker_init.send(sender=None)\n"
        "print(before, 'sympy' in sys.modules, gc.get_freeze_count() > 0)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert completed.stdout.split() == ["False", "True", "True"]


def test_worker_settings_password_from_env_goes_into_every_url():
    env = {
        "GRADEFLEET_BROKER_URL": "rediss://b:1/0",
        "GRADEFLEET_RESULT_BACKEND": "redis://r:1/0",
        "GRADEFLEET_REDIS_PASSWORD": "pw",
    }
    settings = WorkerSettings.from_env(env)
    assert settings.broker_url == "rediss://:pw@b:1/0?ssl_cert_reqs=required"
    assert settings.cache_url == settings.broker_url
    assert settings.backend_url == "redis://:pw@r:1/0"
    args = build_parser().parse_args(["--broker", "redis://other:2/0"])
    from_args = settings_from_args(args, env)
    assert from_args.broker_url == "redis://:pw@other:2/0"
    assert from_args.cache_url == from_args.broker_url


def test_worker_settings_rediss_app_builds_without_ssl_cert_reqs():
    # Celery's Redis backend raised ValueError on a rediss:// URL without it
    settings = WorkerSettings.from_env({"GRADEFLEET_BROKER_URL": "rediss://h:1/0"})
    app = create_app(settings)
    assert app.backend.connparams["ssl_cert_reqs"] is not None


KEY = "k" * 40


@pytest.mark.parametrize(
    ("env", "remote"),
    [
        ({}, None),
        ({"GRADEFLEET_BROKER_URL": "redis://[::1]:6379/0"}, None),
        ({"GRADEFLEET_BROKER_URL": "unix:///run/redis.sock"}, None),
        ({"GRADEFLEET_BROKER_URL": "redis://broker:6379/0"}, "redis://broker:6379/0"),
        (
            {"GRADEFLEET_BROKER_URL": "redis://:pw@10.0.0.5/0"},
            "redis://:***@10.0.0.5/0",
        ),
        (
            {"GRADEFLEET_CACHE_URL": "rediss://cache.internal/0"},
            "rediss://cache.internal/0?ssl_cert_reqs=required",
        ),
        (
            {"GRADEFLEET_BROKER_URL": "sentinel://127.0.0.1:26379,s2?master_name=m"},
            "sentinel://127.0.0.1:26379,s2?master_name=m",
        ),
    ],
    ids=["default", "ipv6-loopback", "unix", "name", "ip", "cache", "sentinel"],
)
def test_worker_without_key_warns_when_redis_is_another_machine(env, remote):
    # Decided from the URLs alone: nothing is resolved or connected here.
    notice = unkeyed_notice(WorkerSettings.from_env(env))
    assert notice is not None
    assert "not authenticated" in notice or "WARNING" in notice
    if remote is None:
        assert "WARNING" not in notice
    else:
        assert "WARNING: no fleet signing key" in notice
        assert f"Redis {remote} is not on this machine" in notice
        assert "pw" not in notice
        assert "GRADEFLEET_SIGNING_KEY_FILE" in notice
    # With the key, nothing to say.
    keyed = WorkerSettings.from_env({**env, "GRADEFLEET_SIGNING_KEY": KEY})
    assert unkeyed_notice(keyed) is None


def test_worker_without_key_warns_for_the_broker_given_as_option():
    args = build_parser().parse_args(["--broker", "redis://redis-host:6379/0"])
    notice = unkeyed_notice(settings_from_args(args, {}))
    assert notice is not None
    assert "WARNING" in notice
    assert "redis://redis-host:6379/0" in notice


def test_worker_entry_point_warns_before_connecting(tmp_path):
    # The real entry point (`python -m workers`), an unkeyed worker told to use a
    # broker on another machine: the WARNING is printed first. Its metrics
    # directory is a file, so the start stops right after, in the first step that
    # would open anything (before any Redis client exists).
    not_a_dir = tmp_path / "metrics"
    not_a_dir.write_text("")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GRADEFLEET_", "CELERY_"))
    }
    env["GRADEFLEET_METRICS_DIR"] = str(not_a_dir)
    completed = subprocess.run(
        [sys.executable, "-m", "workers", "--broker", "redis://broker.invalid:6379/0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert completed.returncode != 0
    first = completed.stderr.splitlines()[0]
    assert first.startswith("gradefleet worker: WARNING: no fleet signing key")
    assert "redis://broker.invalid:6379/0" in first
    assert "FileExistsError" in completed.stderr
