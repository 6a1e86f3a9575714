"""`gradefleet worker` / `python -m workers`: start one worker node of the fleet."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workers.fleet.settings import WorkerSettings
from workers.wire.urls import connect_url, is_loopback_url, read_secret, redact_url

__all__ = [
    "build_parser",
    "decide_kinds",
    "main",
    "settings_from_args",
    "unkeyed_notice",
    "worker_argv",
]

_OPTION_FIELDS = {
    "broker": "broker_url",
    "concurrency": "concurrency",
    "item_timeout_s": "item_timeout_s",
    "item_memory_mb": "item_memory_mb",
    "metrics_port": "metrics_port",
    "metrics_addr": "metrics_addr",
    "loglevel": "loglevel",
    "hostname": "hostname",
    "lanes": "lanes",
    "kinds": "kinds",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradefleet worker",
        description="Start a grading worker (options override GRADEFLEET_* env).",
    )
    add = parser.add_argument
    add(
        "--broker",
        metavar="URL",
        help="Redis URL [GRADEFLEET_BROKER_URL]; the password goes in "
        "GRADEFLEET_REDIS_PASSWORD(_FILE), not here: argv is visible to `ps`",
    )
    add("--concurrency", type=int, help="prefork processes [GRADEFLEET_CONCURRENCY]")
    add("--item-timeout-s", type=float, help="per-item deadline (default 5)")
    add("--item-memory-mb", type=int, help="per-item memory cap (default 1024)")
    add("--metrics-port", type=int, help="Prometheus port, 0 = off (default 0)")
    add(
        "--metrics-addr",
        metavar="ADDR",
        help="address the metrics endpoint binds (default 127.0.0.1; 0.0.0.0 to "
        "serve other machines) [GRADEFLEET_METRICS_ADDR]",
    )
    add("--loglevel", help="Celery log level (default INFO)")
    add("--hostname", help="Celery node name, e.g. worker1@%%h")
    add(
        "--lanes",
        type=_lanes,
        help="lanes to consume, e.g. interactive (default interactive,bulk: "
        "interactive first) [GRADEFLEET_LANES]",
    )
    add(
        "--kinds",
        type=_kinds,
        help="rollout kinds whose queues to consume: math, code or math,code "
        "(default: both where this machine can run the code sandbox, else math) "
        "[GRADEFLEET_KINDS]",
    )
    return parser


def _lanes(text: str) -> tuple[str, ...]:
    from workers.fleet.settings import parse_lanes

    return _option(parse_lanes, text)


def _kinds(text: str) -> tuple[str, ...]:
    from workers.fleet.settings import parse_kinds

    return _option(parse_kinds, text)


def _option(parse: Callable[[str], tuple[str, ...]], text: str) -> tuple[str, ...]:
    from workers.errors import ConfigError

    try:
        names = parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if not names:
        raise argparse.ArgumentTypeError("name at least one")
    return names


def settings_from_args(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> WorkerSettings:
    """Env first, then any option given on the command line."""
    settings = WorkerSettings.from_env(environ)
    changes = {
        field: getattr(args, option)
        for option, field in _OPTION_FIELDS.items()
        if getattr(args, option) is not None
    }
    if "broker_url" in changes:
        password = read_secret(environ, "GRADEFLEET_REDIS_PASSWORD")
        changes["broker_url"] = connect_url(changes["broker_url"], password=password)
        if "GRADEFLEET_CACHE_URL" not in environ:
            changes["cache_url"] = changes["broker_url"]
    return settings.replace(**changes) if changes else settings


def _setup_metrics(settings: WorkerSettings) -> None:
    if settings.metrics_port == 0 and settings.metrics_dir is None:
        return
    # Import here: prometheus_client must switch to multiprocess mode before any
    # metric exists, which prepare_multiprocess_dir() does.
    from workers.fleet.metrics import prepare_multiprocess_dir, start_metrics_server
    from workers.wire.connections import redis_client
    from workers.wire.lanes import QUEUES

    path = settings.metrics_dir or tempfile.mkdtemp(prefix="gradefleet-metrics-")
    prepare_multiprocess_dir(Path(path))
    if settings.metrics_port:
        client = redis_client(settings.broker_url, socket_timeout=2)
        # Every queue's depth, whichever lanes and kinds this node consumes.
        start_metrics_server(
            settings.metrics_port,
            addr=settings.metrics_addr,
            redis_client=client,
            queues=list(QUEUES.values()),
        )


def decide_kinds(
    settings: WorkerSettings,
    check: Callable[..., tuple[bool, str]] | None = None,
) -> tuple[WorkerSettings, str | None]:
    """The settings with the kinds this node consumes decided, and what it says
    about them at start (None: nothing to say).

    Unset kinds are both where the code sandbox runs here (`check`, by default
    `workers.kinds.code_sandbox_check`), else math only: a node that cannot run it
    leaves code rollouts queued for one that can, rather than answer them `error`.
    Kinds given with code are kept as given, with a WARNING when the sandbox does
    not run (its code rollouts are then `error`, and the sandbox alert fires).
    """
    from workers.wire.lanes import CODE, KINDS, MATH

    if settings.kinds is not None and CODE not in settings.kinds:
        return settings, None
    if check is None:
        from workers.kinds import code_sandbox_check

        check = code_sandbox_check
    runs, why = check(uid_base=settings.code_uid_base)
    if settings.kinds is not None:
        if runs:
            return settings, None
        return settings, (
            f"gradefleet worker: WARNING: --kinds includes code but {why}: every "
            "code rollout this node takes is answered `error`"
        )
    if runs:
        return settings.replace(kinds=KINDS), None
    return settings.replace(kinds=(MATH,)), (
        f"gradefleet worker: grading math only ({why}); code rollouts wait in "
        "their queues for a node that runs the sandbox (--kinds / GRADEFLEET_KINDS "
        "to choose)"
    )


def worker_argv(settings: WorkerSettings) -> list[str]:
    """Arguments for `Celery.worker_main` (kinds decided: `decide_kinds`).

    Raises:
        ValueError: `settings.kinds` is not decided.
    """
    from workers.wire.lanes import queues_for

    if settings.kinds is None:
        raise ValueError("the kinds of this node are not decided (decide_kinds)")
    queues = ",".join(queues_for(settings.lanes, settings.kinds))
    argv = ["worker", "--pool=prefork", f"--concurrency={settings.concurrency}"]
    argv += [f"--loglevel={settings.loglevel}", f"--queues={queues}"]
    # Gossip and mingle only slow start-up; nothing here relies on them.
    argv += ["--without-gossip", "--without-mingle"]
    if settings.hostname:
        argv.append(f"--hostname={settings.hostname}")
    return argv


def unkeyed_notice(settings: WorkerSettings) -> str | None:
    """What a worker without the fleet key says at start (None with one): a
    WARNING when a Redis it uses is on another machine, where anyone who can write
    to it can forge tasks, verdicts and cache entries; a note on loopback. Decided
    from the URLs before anything connects."""
    if settings.keyring is not None:
        return None
    urls = [settings.broker_url, settings.backend_url, settings.cache_url]
    remote = [url for url in urls if url is not None and not is_loopback_url(url)]
    if not remote:
        return (
            "gradefleet worker: no GRADEFLEET_SIGNING_KEY(_FILE): tasks, results, saved"
            " verdicts and cache entries are not authenticated (see deploy/README.md)"
        )
    return (
        f"gradefleet worker: WARNING: no fleet signing key and Redis "
        f"{redact_url(remote[0])} is not on this machine: anyone who can write to it "
        "can forge tasks, verdicts and cache entries. Give every worker and producer "
        "the same key in GRADEFLEET_SIGNING_KEY_FILE (deploy/README.md, The fleet key)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse options, build settings (the worker's only env read), run the worker."""
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args, os.environ)
    settings, kinds_notice = decide_kinds(settings)
    for notice in (unkeyed_notice(settings), kinds_notice):
        if notice is not None:
            print(notice, file=sys.stderr)
    _setup_metrics(settings)
    from celery.signals import worker_init

    from workers.fleet.app import create_app

    app = create_app(settings)
    workers: list[Any] = []

    def remember(sender: Any = None, **_: Any) -> None:
        workers.append(sender)

    # `worker_main` drops the worker's exit code (Celery's `app.start` returns it
    # only from its error path): an "Unrecoverable error" (the broker refusing a
    # write at maxmemory, a READONLY replica, a missing ACL permission) ended the
    # process with status 0, and a supervisor restarting on failure left it dead.
    worker_init.connect(remember, weak=False)
    app.worker_main(worker_argv(settings))
    code = next((w.exitcode for w in workers if w is not None), None)
    if isinstance(code, int) and code != 0:
        print(
            f"gradefleet worker: stopped by an unrecoverable error (see the CRITICAL "
            f"line above; often the broker refusing a command): exit status {code}",
            file=sys.stderr,
        )
        return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
