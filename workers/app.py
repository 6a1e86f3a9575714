"""The Celery app factory and the per-process grading runtime (built lazily per child).

`create_app(settings)` configures JSON-only, late-ack, prefetch-1 Celery on Redis;
each prefork child builds its own `WorkerRuntime` (sandbox, cache, metrics) at start.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_init, worker_process_init, worker_process_shutdown

from workers.batch import BatchGrader
from workers.cache import RedisResultCache
from workers.contract import QUEUE
from workers.lanes import LaneCycle
from workers.metrics import WorkerMetrics
from workers.models import Verdict
from workers.sandbox import GradeFn, Sandbox, warm_up_verifier
from workers.settings import WorkerSettings

__all__ = [
    "TaskObserver",
    "WorkerRuntime",
    "build_runtime",
    "create_app",
    "get_runtime",
]

# The soft backstop fires well past "every item of the largest batch hits its
# deadline" (x1.25 + 10 s); the hard limit 30 s later, if the soft one was ignored.
_SOFT_LIMIT_FACTOR = 1.25
_SOFT_LIMIT_MARGIN_S = 10.0
_HARD_LIMIT_MARGIN_S = 30.0


class TaskObserver:
    """Forwards per-item events to the metrics, graded items once they are stored.

    A graded item is counted when the task `commit()`s it (its verdict saved or in the
    stored result), so a batch re-graded after its worker died counts each item once:
    the lost delivery's uncommitted items are `discard()`ed, never counted.
    `batch_done` is dropped: the task grades in chunks and records one batch itself.
    """

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self._uncommitted: list[tuple[Verdict, float]] = []

    def item_graded(self, verdict: Verdict, duration_s: float) -> None:
        self._uncommitted.append((verdict, duration_s))

    def commit(self) -> None:
        """Count the items graded since the last commit."""
        for verdict, duration_s in self._uncommitted:
            self.metrics.item_graded(verdict, duration_s)
        self._uncommitted.clear()

    def discard(self) -> None:
        """Forget items graded but never stored (their batch failed)."""
        self._uncommitted.clear()

    def cache_lookup(self, *, hits: int, misses: int) -> None:
        self.metrics.cache_lookup(hits=hits, misses=misses)

    def sandbox_restarted(self, reason: str) -> None:
        self.metrics.sandbox_restarted(reason)

    def batch_done(self, *, size: int, duration_s: float) -> None:
        pass


@dataclass(slots=True, kw_only=True)
class WorkerRuntime:
    """What one worker process grades with: settings, Redis, sandbox, metrics."""

    settings: WorkerSettings
    results_redis: redis.Redis[bytes]  # Celery's result keys (often `redis` itself)
    redis: redis.Redis[bytes]
    metrics: WorkerMetrics
    observer: TaskObserver
    sandbox: Sandbox
    grader: BatchGrader

    def reset_sandbox(self) -> None:
        """Kill the child (it may be mid-item) and start over with a fresh grader."""
        self.sandbox.close()
        self.sandbox = _sandbox(self.settings, self.observer)
        self.grader = _grader(self.settings, self.sandbox, self.observer, self.redis)

    def close(self) -> None:
        self.sandbox.close()
        self.redis.close()
        if self.results_redis is not self.redis:
            self.results_redis.close()


_settings: WorkerSettings | None = None
_runtime: WorkerRuntime | None = None


def _grade_fn(settings: WorkerSettings) -> GradeFn | None:
    if not settings.test_hooks:
        return None
    from workers import testhooks  # test-only; imported only when enabled

    return testhooks.hooked_grade


def _sandbox(settings: WorkerSettings, observer: TaskObserver) -> Sandbox:
    return Sandbox(
        item_timeout_s=settings.item_timeout_s,
        item_memory_bytes=settings.item_memory_bytes,
        recycle_after_items=settings.recycle_after_items,
        on_restart=observer.sandbox_restarted,
        grade_fn=_grade_fn(settings),
    )


def _grader(
    settings: WorkerSettings,
    sandbox: Sandbox,
    observer: TaskObserver,
    client: redis.Redis[bytes],
) -> BatchGrader:
    cache = None
    if settings.cache_url is not None:
        cache_client = (
            client
            if settings.cache_url == settings.broker_url
            else redis.Redis.from_url(settings.cache_url, socket_timeout=10)
        )
        cache = RedisResultCache(cache_client, ttl_s=settings.cache_ttl_s)
    return BatchGrader(sandbox=sandbox, cache=cache, observer=observer)


def build_runtime(settings: WorkerSettings) -> WorkerRuntime:
    """Build a process's runtime (the sandbox child itself starts on first use)."""
    client: redis.Redis[bytes] = redis.Redis.from_url(
        settings.broker_url, socket_timeout=10
    )
    results: redis.Redis[bytes] = (
        client
        if settings.backend_url == settings.broker_url
        else redis.Redis.from_url(settings.backend_url, socket_timeout=10)
    )
    metrics = WorkerMetrics()
    observer = TaskObserver(metrics)
    sandbox = _sandbox(settings, observer)
    return WorkerRuntime(
        settings=settings,
        redis=client,
        results_redis=results,
        metrics=metrics,
        observer=observer,
        sandbox=sandbox,
        grader=_grader(settings, sandbox, observer, client),
    )


def get_runtime() -> WorkerRuntime:
    """This process's runtime, built on first use (prefork children build their own)."""
    global _runtime
    if _runtime is None:
        if _settings is None:
            raise RuntimeError("create_app(settings) was not called in this process")
        _runtime = build_runtime(_settings)
    return _runtime


def _on_worker_init(**_: Any) -> None:
    # In the main process, before the pool forks: every prefork child then starts
    # with the verifier (SymPy) already imported and warm, in pages it shares with
    # its siblings, instead of importing it again on its own (~0.5 s and ~40 MB
    # each); frozen first, so no collection in a child touches (and copies) them.
    warm_up_verifier()
    gc.collect()
    gc.freeze()


def _on_process_init(**_: Any) -> None:
    # A forked child must not reuse the parent's runtime (sockets, sandbox pipes).
    global _runtime
    _runtime = None
    get_runtime()
    warm_up_verifier()  # already done before the fork (a no-op then); else now
    # Move everything alive now (SymPy's and Celery's objects) out of the collector's
    # sight, as `childproc.fork_child` does for sandboxes and local workers: a full
    # collection otherwise walks them all, ~0.1 s each, about once per 20 batches.
    gc.collect()
    gc.freeze()


def _on_process_shutdown(**_: Any) -> None:
    global _runtime
    if _runtime is not None:
        _runtime.close()
        _runtime = None


def _time_limits_s(settings: WorkerSettings) -> tuple[float, float]:
    soft_s = settings.longest_batch_s * _SOFT_LIMIT_FACTOR + _SOFT_LIMIT_MARGIN_S
    return soft_s, soft_s + _HARD_LIMIT_MARGIN_S


def create_app(settings: WorkerSettings) -> Celery:
    """A Celery app for the fleet: JSON only, late acks, prefetch 1, named task."""
    global _settings
    _settings = settings
    soft_s, hard_s = _time_limits_s(settings)
    LaneCycle.bulk_every = settings.bulk_every
    app = Celery("gradefleet", broker=settings.broker_url, backend=settings.backend_url)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # STARTED and SUCCESS are written by the task itself, pipelined with its
        # bookkeeping (workers.tasks.ResultSlot); Celery still stores failures.
        task_track_started=False,
        task_store_errors_even_if_ignored=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            # One BRPOP over every lane's lists, interactive first, bulk now and
            # then (`workers.lanes.LaneCycle`); kombu imports the class by name.
            "queue_order_strategy": f"{LaneCycle.__module__}:{LaneCycle.__name__}",
        },
        broker_connection_retry_on_startup=True,
        result_expires=max(3_600, settings.visibility_timeout_s),
        task_soft_time_limit=soft_s,
        task_time_limit=hard_s,
        worker_send_task_events=False,
    )
    worker_init.connect(_on_worker_init, weak=False, dispatch_uid="gf-worker-init")
    worker_process_init.connect(_on_process_init, weak=False, dispatch_uid="gf-init")
    worker_process_shutdown.connect(
        _on_process_shutdown, weak=False, dispatch_uid="gf-shutdown"
    )
    import workers.tasks  # noqa: F401  (registers gradefleet.grade_batch on this app)

    return app
