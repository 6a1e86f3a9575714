"""The Celery app factory and its process signals.

`create_app(settings)` configures JSON-only, late-ack, prefetch-1 Celery on Redis;
each prefork child builds its own `workers.fleet.runtime.WorkerRuntime` at start.
"""

from __future__ import annotations

import gc
from typing import Any

from celery import Celery, bootsteps
from celery.signals import worker_init, worker_process_init, worker_process_shutdown
from celery.worker import control

import workers.fleet.tasks  # noqa: F401  (registers gradefleet.grade_batch, a shared task)
from workers.code.item import set_code_limits
from workers.fleet.kombu_fixes import (
    closed_channels_fail_as_connection_errors,
    failed_acks_free_their_prefetch_slot,
)
from workers.fleet.runtime import configure, forget_runtime, get_runtime
from workers.fleet.settings import WorkerSettings
from workers.fleet.timers import TimerPurge
from workers.sandbox.process import warm_up_verifier
from workers.wire.connections import celery_endpoint, transport_for
from workers.wire.contract import KEY_STATS_FIELD, KINDS_STATS_FIELD, QUEUE
from workers.wire.lanes import LaneCycle

__all__ = ["create_app"]

# The soft backstop fires well past "every item of the largest batch hits its
# deadline" (x1.25 + 10 s); the hard limit 30 s later, if the soft one was ignored.
_SOFT_LIMIT_FACTOR = 1.25
_SOFT_LIMIT_MARGIN_S = 10.0
_HARD_LIMIT_MARGIN_S = 30.0


# Celery's remote control answers anyone who can write to the broker: `shutdown`,
# `pool_restart`, `revoke`, `rate_limit`, ... are one broadcast away. A worker keeps
# only the read-only commands `gradefleet status` sends (`producer.client.status`).
REMOTE_CONTROL_COMMANDS = frozenset({"ping", "stats"})


def _limit_remote_control() -> None:
    # Panel.data is Celery's global registry of commands, read by the worker's
    # mailbox (celery.worker.pidbox) when the consumer starts; trimmed here, in the
    # worker's own process, before that.
    for name in list(control.Panel.data):
        if name not in REMOTE_CONTROL_COMMANDS:
            del control.Panel.data[name]


def _node_stats_step(settings: WorkerSettings) -> type[bootsteps.StartStopStep]:
    """A worker bootstep whose `info` adds to the node's `stats` reply whether it
    holds the fleet key, and the key's id (`workers.wire.contract.KEY_STATS_FIELD`),
    and the kinds it consumes (`KINDS_STATS_FIELD`; left out while undecided)."""
    key_id = None if settings.keyring is None else settings.keyring.signing_id
    info: dict[str, Any] = {
        KEY_STATS_FIELD: {"keyed": key_id is not None, "signing_key_id": key_id}
    }
    if settings.kinds is not None:
        info[KINDS_STATS_FIELD] = list(settings.kinds)

    # A StartStopStep (that starts nothing): only those join `worker.steps`, whose
    # `info` Celery merges into `stats` (Blueprint.info). Celery's stubs type the
    # base method as returning None.
    class NodeInfo(bootsteps.StartStopStep):
        def info(self, worker: Any) -> dict[str, Any]:  # type: ignore[override]
            return info

    return NodeInfo


def _on_worker_init(**_: Any) -> None:
    # In the main process, before the pool forks: every prefork child then starts
    # with the verifier (SymPy) already imported and warm, in pages it shares with
    # its siblings, instead of importing it again on its own (time and memory
    # per child); frozen first, so no collection in a child touches (and copies) them.
    warm_up_verifier()
    gc.collect()
    gc.freeze()


def _on_process_init(**_: Any) -> None:
    # A forked child must not reuse the parent's runtime (sockets, sandbox pipes).
    forget_runtime(close=False)
    get_runtime()
    warm_up_verifier()  # already done before the fork (a no-op then); else now
    # Move everything alive now (SymPy's and Celery's objects) out of the collector's
    # sight, as `childproc.fork_child` does for sandboxes and local workers: a full
    # collection otherwise walks them all, every few dozen batches.
    gc.collect()
    gc.freeze()


def _on_process_shutdown(**_: Any) -> None:
    forget_runtime(close=True)


def _time_limits_s(settings: WorkerSettings) -> tuple[float, float]:
    soft_s = settings.longest_batch_s * _SOFT_LIMIT_FACTOR + _SOFT_LIMIT_MARGIN_S
    return soft_s, soft_s + _HARD_LIMIT_MARGIN_S


def create_app(settings: WorkerSettings) -> Celery:
    """A Celery app for the fleet: JSON only, late acks, prefetch 1, named task."""
    configure(settings)
    if settings.code_limits is not None:  # before the prefork children: inherited
        set_code_limits(settings.code_limits)
    if settings.code_uid_base is not None:
        from workers.code.grade import configure_default_sandbox  # the sandbox: lazily

        configure_default_sandbox(uid_base=settings.code_uid_base)
    _limit_remote_control()
    closed_channels_fail_as_connection_errors()
    failed_acks_free_their_prefetch_slot()
    soft_s, hard_s = _time_limits_s(settings)
    LaneCycle.bulk_every = settings.bulk_every
    broker = celery_endpoint(settings.broker_url)
    backend = celery_endpoint(settings.backend_url)
    app = Celery("gradefleet", broker=broker.url, backend=backend.url)
    app.conf.update(
        # A broker refusing writes (maxmemory, read-only replica) is waited out
        # like a lost connection (`workers.fleet.broker`), not a crash.
        broker_transport=transport_for(settings.broker_url),
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # STARTED and SUCCESS are written by the task itself, pipelined with its
        # bookkeeping (workers.fleet.bookkeeping.ResultSlot); Celery still stores
        # failures.
        task_track_started=False,
        task_store_errors_even_if_ignored=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        broker_transport_options={
            **broker.transport_options,  # a Sentinel URL's master_name
            "visibility_timeout": settings.visibility_timeout_s,
            # One BRPOP over every lane's lists, interactive first, bulk now and
            # then (`workers.wire.lanes.LaneCycle`); kombu imports the class by name.
            "queue_order_strategy": f"{LaneCycle.__module__}:{LaneCycle.__name__}",
        },
        result_backend_transport_options=backend.transport_options,
        broker_connection_retry_on_startup=True,
        result_expires=max(3_600, settings.visibility_timeout_s),
        task_soft_time_limit=soft_s,
        task_time_limit=hard_s,
        worker_send_task_events=False,
    )
    # Cancelled time-limit timers would stay in the heap until due
    # (workers.fleet.timers).
    app.steps["worker"].add(TimerPurge)
    app.steps["worker"].add(_node_stats_step(settings))
    worker_init.connect(_on_worker_init, weak=False, dispatch_uid="gf-worker-init")
    worker_process_init.connect(_on_process_init, weak=False, dispatch_uid="gf-init")
    worker_process_shutdown.connect(
        _on_process_shutdown, weak=False, dispatch_uid="gf-shutdown"
    )
    return app
