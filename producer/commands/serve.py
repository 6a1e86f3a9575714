"""`gradefleet serve`: options, safety checks, then uvicorn (imported only here)."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
from pathlib import Path

import click

from producer.commands.options import cache_dir_option_value, embedded_options
from producer.extras import require
from producer.settings import CACHE_FILE_NAME, redact_url

__all__ = ["is_loopback", "serve"]

TOKEN_ENV = "GRADEFLEET_SERVE_TOKEN"
log = logging.getLogger("gradefleet.serve")


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback
        for info in infos
    )


@click.command()
@click.option(
    "--broker",
    envvar="GRADEFLEET_BROKER_URL",
    show_envvar=True,
    metavar="URL",
    help="Redis URL of a fleet. Unset: grade in an embedded pool on this machine.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    show_envvar=True,
    help="Require `Authorization: Bearer TOKEN` on every route but /healthz and "
    "/readyz (prefer the env var: a flag shows in `ps`).",
)
@click.option(
    "--allow-unauthenticated",
    is_flag=True,
    help="Allow binding a non-loopback address without a token.",
)
@click.option(
    "--deadline-s",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Longest a request waits; its unfinished items come back as `timeout`.",
)
@click.option(
    "--max-body-mb",
    type=click.FloatRange(min=0.001),
    default=64.0,
    show_default=True,
    help="Larger request bodies get 413.",
)
@click.option(
    "--max-backlog",
    type=click.IntRange(min=1),
    default=200_000,
    show_default=True,
    help="Rollouts waiting or being graded above which requests get 503.",
)
@click.option(
    "--coalesce-max-items",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Largest batch sent to the backend.",
)
@click.option(
    "--coalesce-delay-ms",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="How long a lone request waits for others to share its batch.",
)
@click.option(
    "--coalesce-max-in-flight",
    type=click.IntRange(min=1),
    help="Batches graded at once; while all run, new requests wait and leave as "
    "bigger batches [default: 2 on a fleet, where a 256-item batch is 4 tasks: "
    "raise it for more than 8 workers; 1 embedded].",
)
@embedded_options
def serve(
    broker: str | None,
    host: str,
    port: int,
    token: str | None,
    allow_unauthenticated: bool,
    deadline_s: float,
    max_body_mb: float,
    max_backlog: int,
    coalesce_max_items: int,
    coalesce_delay_ms: float,
    coalesce_max_in_flight: int | None,
    processes: int | None,
    item_timeout_s: float,
    item_memory_mb: int,
    cache_dir: Path | None,
    no_cache: bool,
) -> None:
    """Serve grading over HTTP (POST /v1/grade; OpenAPI page at /docs).

    SIGTERM or Ctrl-C stops taking requests, answers those in flight, then exits 0.
    Needs the `serve` extra: pip install 'gradefleet[serve]'.
    """
    # Before anything else: without the extra, exit 2 naming it (uvloop only on a
    # fleet, where it is the loop; see below).
    require("serve", "fastapi", "pydantic", "uvicorn", "httptools")
    if broker:
        require("serve", "uvloop")
    if not token and not allow_unauthenticated and not is_loopback(host):
        raise click.UsageError(
            f"refusing to bind {host} without a token: set {TOKEN_ENV} (or --token),"
            " or pass --allow-unauthenticated"
        )
    # Imported here: `gradefleet --help` and `grade` must not pay for the server.
    import uvicorn

    from producer.adapters.reward import RewardConfig
    from producer.client.grading import CoalescingGrader
    from producer.serve.service import ServiceMetrics, create_app
    from workers.wire.signing import keyring_from_env

    cache_path = None
    directory = cache_dir_option_value(cache_dir, no_cache)
    if broker is None and directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        cache_path = directory / CACHE_FILE_NAME
    grader = CoalescingGrader(
        broker or None,
        max_batch_items=coalesce_max_items,
        max_delay_s=coalesce_delay_ms / 1000,
        max_backlog_items=max_backlog,
        max_in_flight=coalesce_max_in_flight,
        **(
            {"item_timeout_s": item_timeout_s, "keyring": keyring_from_env(os.environ)}
            if broker
            else {
                "processes": processes,
                "item_timeout_s": item_timeout_s,
                "item_memory_mb": item_memory_mb,
                "cache_path": cache_path,
            }
        ),
    )
    metrics = ServiceMetrics()
    collectors: tuple[object, ...] = ()
    if broker:
        from workers.fleet.metrics import QueueDepthCollector
        from workers.wire.connections import redis_client
        from workers.wire.lanes import QUEUES

        queue_redis = redis_client(broker, socket_timeout=1.0)
        # Every lane's and kind's queue, as a worker node exports them.
        queues = list(QUEUES.values())
        collectors = (QueueDepthCollector(queue_redis, queues),)
    app = create_app(
        grader,
        token=token or None,
        reward=RewardConfig.from_env(),
        metrics=metrics,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
        default_deadline_s=deadline_s,
        extra_collectors=collectors,
        freeze_gc=True,
    )
    where = redact_url(broker) if broker else "embedded pool"
    click.echo(
        f"gradefleet serve: http://{host}:{port} grading on {where}"
        f"{' (token required)' if token else ''}",
        err=True,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        # No access log: a line per request costs more than answering a cached
        # one (per-route counts and latencies are in /metrics); nor does any log
        # line carry headers (the token).
        access_log=False,
        # Named, not "auto": a missing C parser or loop fails here, loudly, instead
        # of halving the requests per second (the serve extra has both). Embedded,
        # asyncio's loop: the pool's sandbox children forked under uvloop exit at
        # once (every item came back `error`, "sandbox child exited with status 0").
        loop="uvloop" if broker else "asyncio",
        http="httptools",
        timeout_graceful_shutdown=None,
        lifespan="on",
    )
    # uvicorn drains on SIGTERM, restores the previous handler and raises the signal
    # again; with this handler that last step exits 0 (a drained stop is a success).
    signal.signal(signal.SIGTERM, _exit_ok)
    uvicorn.Server(config).run()


def _exit_ok(_signum: int, _frame: object) -> None:
    raise SystemExit(0)
