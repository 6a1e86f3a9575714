"""The per-process grading runtime (Redis, sandbox, batch grader, metrics) and the
observer that counts a task's items once they are stored.

Built lazily, once per process (`get_runtime`): each prefork child builds its own
after the fork (`workers.fleet.app` wires the Celery signals).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import redis

from workers.cache.redis_store import RedisResultCache
from workers.cache.results import CacheBackend
from workers.embedded.batch import BatchGrader
from workers.embedded.pool import LocalPool
from workers.errors import ConfigError
from workers.fleet.line_batch import GradedSummary, grade_fleet_unit
from workers.fleet.metrics import WorkerMetrics
from workers.fleet.settings import WorkerSettings
from workers.models import Status, Verdict
from workers.sandbox.process import GradeFn, Sandbox
from workers.wire.connections import RedisClients

__all__ = [
    "TaskObserver",
    "WorkerRuntime",
    "build_runtime",
    "configure",
    "forget_runtime",
    "get_runtime",
]

_SOCKET_TIMEOUT_S = 10


class TaskObserver:
    """Forwards per-item events to the metrics, graded items once they are stored.

    A graded item is counted when the task `commit()`s it (its verdict saved or in the
    stored result), so a batch re-graded after its worker died counts each item once:
    the lost delivery's uncommitted items are `discard()`ed, never counted.
    """

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self._uncommitted: list[tuple[Verdict, float]] = []
        self._uncommitted_summaries: list[GradedSummary] = []

    def item_graded(self, verdict: Verdict, duration_s: float) -> None:
        self._uncommitted.append((verdict, duration_s))

    def items_summed(self, summary: GradedSummary) -> None:
        """Items graded in a unit of lines' grading process (`line_batch`)."""
        self._uncommitted_summaries.append(summary)

    def commit(self) -> None:
        """Count the items graded since the last commit."""
        self.metrics.items_graded(self._uncommitted)
        self._uncommitted.clear()
        for summary in self._uncommitted_summaries:
            statuses = {Status(v): n for v, n in summary["statuses"].items()}
            self.metrics.items_counted(
                statuses,
                summary["format_invalid"],
                summary["durations_s"],
                summary.get("code"),  # absent from a worker of an older version
            )
            for role, seconds in summary.get("sandbox_starts", ()):
                self.metrics.sandbox_started(str(role), float(seconds))
        self._uncommitted_summaries.clear()

    def discard(self) -> None:
        """Forget items graded but never stored (their batch failed)."""
        self._uncommitted.clear()
        self._uncommitted_summaries.clear()

    def cache_lookup(self, *, hits: int, misses: int) -> None:
        self.metrics.cache_lookup(hits=hits, misses=misses)

    def sandbox_restarted(self, reason: str) -> None:
        self.metrics.sandbox_restarted(reason)

    def cache_rejected(self, count: int) -> None:
        self.metrics.integrity_rejected("cache", count)


@dataclass(slots=True, kw_only=True)
class WorkerRuntime:
    """What one worker process grades with: settings, Redis, sandbox, metrics."""

    settings: WorkerSettings
    clients: RedisClients
    results_redis: redis.Redis[bytes]  # Celery's result keys (often `redis` itself)
    # The broker's Redis: items, attempts, partial results. Declared last: the
    # field's name shadows the module in the annotations below it.
    redis: redis.Redis[bytes]
    metrics: WorkerMetrics
    observer: TaskObserver
    sandbox: Sandbox
    grader: BatchGrader
    # A unit of input lines (`workers.fleet.line_batch`) is graded without the answer
    # cache, as the embedded pool grades its units: a hit still needs the response
    # prepared and saves only deciding it, and the lookups and stores cost more
    # than that (issue 11, measured on a fleet: 77 -> 65 us of fleet CPU a rollout
    # with the cache's best case, 95% hits). Batches of items keep it. This one
    # grades a unit read in the task's process (`line_batch.LineUnit.batch`).
    line_grader: BatchGrader
    # Grades a unit of lines whole (`line_batch.grade_fleet_unit`): one process,
    # forked on first use, replaced when an item overruns its limits.
    line_pool: LocalPool

    def reset_sandbox(self) -> None:
        """Kill the child (it may be mid-item) and start over with a fresh grader."""
        self.sandbox.close()
        self.sandbox = _sandbox(self.settings, self.observer)
        self.grader = _grader(self.settings, self.sandbox, self.observer, self.clients)
        self.line_grader = _line_grader(self.sandbox, self.observer)

    def close(self) -> None:
        self.sandbox.close()
        self.line_pool.close()
        self.clients.close()


def _grade_fn(settings: WorkerSettings) -> GradeFn | None:
    if settings.test_hooks_path is None:
        return None
    # Test-only: the file lives in the test tree and is loaded only when named.
    spec = importlib.util.spec_from_file_location(
        "gradefleet_test_hooks", settings.test_hooks_path
    )
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load test hooks from {settings.test_hooks_path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hooked: GradeFn = module.hooked_grade
    return hooked


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
    clients: RedisClients,
) -> BatchGrader:
    cache = None
    if settings.cache_url is not None:
        cache_client = clients.get(settings.cache_url)
        cache = RedisResultCache(
            cache_client,
            ttl_s=settings.cache_ttl_s,
            keyring=settings.keyring,
            on_rejected=observer.cache_rejected,
        )
    # A task's chunks hold their new entries; `tasks.BatchRun` writes them once.
    return BatchGrader(
        sandbox=sandbox, cache=cache, observer=observer, hold_stores=True
    )


def _line_grader(sandbox: Sandbox, observer: TaskObserver) -> BatchGrader:
    return BatchGrader(sandbox=sandbox, cache=None, observer=observer)


def _code_cache(settings: WorkerSettings) -> Callable[[], CacheBackend] | None:
    """What the line pool's worker builds its code items' cache with: the fleet's
    Redis cache, on a client of its own (made after the fork)."""
    url = settings.cache_url
    if url is None:
        return None

    def build() -> CacheBackend:
        client = RedisClients(socket_timeout=_SOCKET_TIMEOUT_S).get(url)
        return RedisResultCache(
            client, ttl_s=settings.cache_ttl_s, keyring=settings.keyring
        )

    return build


def _line_pool(settings: WorkerSettings, observer: TaskObserver) -> LocalPool:
    return LocalPool(
        processes=1,
        item_timeout_s=settings.item_timeout_s,
        item_memory_bytes=settings.item_memory_bytes,
        recycle_after_items=settings.recycle_after_items,
        cache_path=None,
        grade_fn=_grade_fn(settings),
        unit_fn=grade_fleet_unit,
        collect_graded=True,
        on_restart=observer.sandbox_restarted,
        code_cache=_code_cache(settings),
    )


def build_runtime(settings: WorkerSettings) -> WorkerRuntime:
    """Build a process's runtime (the sandbox child itself starts on first use)."""
    clients = RedisClients(socket_timeout=_SOCKET_TIMEOUT_S)
    metrics = WorkerMetrics()
    # This process's code sandbox tells the metrics of its starts (lazily imported:
    # the sandbox starts on a batch's first code item).
    from workers.code.grade import configure_default_sandbox

    configure_default_sandbox(observer=metrics)
    observer = TaskObserver(metrics)
    sandbox = _sandbox(settings, observer)
    return WorkerRuntime(
        settings=settings,
        clients=clients,
        redis=clients.get(settings.broker_url),
        results_redis=clients.get(settings.backend_url),
        metrics=metrics,
        observer=observer,
        sandbox=sandbox,
        grader=_grader(settings, sandbox, observer, clients),
        line_grader=_line_grader(sandbox, observer),
        line_pool=_line_pool(settings, observer),
    )


_settings: WorkerSettings | None = None
_runtime: WorkerRuntime | None = None


def configure(settings: WorkerSettings) -> None:
    """Set the settings this process's runtime is built from (by `create_app`)."""
    global _settings
    _settings = settings


def get_runtime() -> WorkerRuntime:
    """This process's runtime, built on first use (prefork children build their own)."""
    global _runtime
    if _runtime is None:
        if _settings is None:
            raise RuntimeError("create_app(settings) was not called in this process")
        _runtime = build_runtime(_settings)
    return _runtime


def forget_runtime(*, close: bool) -> None:
    """Drop this process's runtime: closed (shutdown), or not (a forked child must
    not touch the parent's sockets and sandbox pipes)."""
    global _runtime
    if close and _runtime is not None:
        _runtime.close()
    _runtime = None
