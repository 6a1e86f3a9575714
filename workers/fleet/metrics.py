"""Every Prometheus metric of the fleet, built on an injected registry, and the
multiprocess plumbing (one HTTP endpoint per node summing all prefork children).

Entry points call `prepare_multiprocess_dir()` first, before any metric exists, then
`start_metrics_server()` in the parent; each process builds `WorkerMetrics()`.
"""

from __future__ import annotations

import bisect
import collections
import os
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
    values,
)
from prometheus_client import multiprocess as _mp
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from workers import __version__
from workers.errors import MetricsSetupError
from workers.fleet.code_metrics import CodeMetrics, CodeTally, code_tally
from workers.models import Status, Verdict
from workers.wire.lanes import INTERACTIVE, LANES, lane_of_queue
from workers.wire.protocol import UNACKED_KEY, priority_queue_keys

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "BATCH_BUCKETS_S",
    "CACHE_RESULTS",
    "INTEGRITY_KINDS",
    "ITEM_BUCKETS_S",
    "QUEUE_WAIT_BUCKETS_S",
    "RESTART_REASONS",
    "SKIP_REASONS",
    "MetricsSetupError",
    "ProducerMetrics",
    "QueueDepthCollector",
    "QueueDepths",
    "RedisQueueClient",
    "WorkerMetrics",
    "exposition",
    "mark_process_dead",
    "metrics_registry",
    "metrics_wsgi_app",
    "observe_all",
    "prepare_multiprocess_dir",
    "read_queue_depths",
    "reap_dead_processes",
    "start_metrics_server",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CACHE_RESULTS = ("hit", "miss")
# "other" bounds the label: an unknown reason from a new sandbox must not mint series.
RESTART_REASONS = ("timeout", "memory", "crash", "recycle", "other")
INTEGRITY_KINDS = ("task", "partial", "cache")
SKIP_REASONS = ("answered", "abandoned", "claimed")

# Per item: a cache hit or a Fraction compare is ~5-50 µs, a SymPy pair ~1-5 ms, and
# the sandbox deadline a few seconds (up to 30 s if configured): buckets resolve all 3.
ITEM_BUCKETS_S = (
    *(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025),
    *(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
# Per batch: a cached 100-item batch takes ~1 ms, a cold SymPy-heavy 1,000-item batch
# seconds, and a batch full of hostile items up to size x deadline: 1 ms ... 300 s.
BATCH_BUCKETS_S = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    *(5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0),
)
# Enqueue to start: near zero when workers are idle, minutes when the fleet is behind.
QUEUE_WAIT_BUCKETS_S = (
    *(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    *(30.0, 60.0, 120.0, 300.0, 600.0, 1800.0),
)
BATCH_SIZE_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _sympy_version() -> str:
    # importlib.metadata, not `import sympy`: the parent process must stay light.
    try:
        return metadata.version("sympy")
    except metadata.PackageNotFoundError:
        return "unknown"


def observe_all(histogram: Histogram, values: Iterable[float]) -> None:
    """`histogram.observe` of each value, its sum and each bucket moved once.

    Each move is a locked write (to the multiprocess files with a metrics port:
    3 us an observation, against 1 us in process), and a worker process observes
    every rollout's grading time. prometheus_client has no bulk observe, so this
    reads the bounds and moves the values `Histogram.observe` moves, by their
    private names (`_upper_bounds`, `_buckets`, `_sum`: a test compares the
    exposition with `observe`'s); where they are missing it observes one value
    at a time.
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value in values:
            histogram.observe(value)
        return
    counts = [0] * len(bounds)
    summed = 0.0
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1  # the first bound >= it
        summed += value
    if not any(counts):
        return
    total.inc(summed)
    for bucket, count in zip(buckets, counts, strict=True):
        if count:
            bucket.inc(count)


class WorkerMetrics:
    """The worker's metrics; implements `workers.embedded.batch.BatchObserver` and
    the code sandbox's `SandboxObserver` (kinds and code: `code_metrics`).

    Args:
        registry: where the metrics are registered. ``None`` gives a private registry:
            right for multiprocess mode, where values live in the mmap files and the
            endpoint reads them back with a `MultiProcessCollector`. In single-process
            mode pass the registry you serve (or a test's private one).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._build_verdict_metrics(self.registry)
        self._build_batch_metrics(self.registry)
        self._build_process_metrics(self.registry)
        self.code = CodeMetrics(self.registry)

    def _build_verdict_metrics(self, reg: CollectorRegistry) -> None:
        graded = Counter(
            "gradefleet_rollouts_graded",
            "Rollouts graded, by verdict status.",
            ["status"],
            registry=reg,
        )
        self._graded = {s: graded.labels(status=s.value) for s in Status}
        self._format_invalid = Counter(
            "gradefleet_format_invalid",
            "Graded rollouts without a well-formed final-answer marker.",
            registry=reg,
        )
        self._grade_duration = Histogram(
            "gradefleet_grade_duration_seconds",
            "Wall time to grade one rollout (cache hits included).",
            buckets=ITEM_BUCKETS_S,
            registry=reg,
        )

    def _build_process_metrics(self, reg: CollectorRegistry) -> None:
        cache = Counter(
            "gradefleet_cache_requests",
            "Result-cache lookups, by result.",
            ["result"],
            registry=reg,
        )
        self._cache = {r: cache.labels(result=r) for r in CACHE_RESULTS}
        restarts = Counter(
            "gradefleet_sandbox_restarts",
            "Sandbox child restarts, by reason.",
            ["reason"],
            registry=reg,
        )
        self._restarts = {r: restarts.labels(reason=r) for r in RESTART_REASONS}
        rejected = Counter(
            "gradefleet_integrity_rejected",
            "Tasks, saved verdicts and cache entries whose MAC did not verify "
            "(dropped or graded again), by kind.",
            ["kind"],
            registry=reg,
        )
        self._rejected = {k: rejected.labels(kind=k) for k in INTEGRITY_KINDS}
        self._busy = Gauge(
            "gradefleet_workers_busy",
            "Worker processes grading a batch right now.",
            registry=reg,
            multiprocess_mode="livesum",
        )
        # A new process is idle; also clears a stale value if a dead child's pid (and
        # so its not-yet-reaped gauge file) is reused.
        self._busy.set(0)
        build = Gauge(
            "gradefleet_build_info",
            "Build of the worker: gradefleet and SymPy versions (value is 1).",
            ["version", "sympy"],
            registry=reg,
            multiprocess_mode="max",
        )
        build.labels(version=__version__, sympy=_sympy_version()).set(1)

    def _build_batch_metrics(self, reg: CollectorRegistry) -> None:
        self._batch_duration = Histogram(
            "gradefleet_batch_duration_seconds",
            "Wall time to grade one batch, from task start to result.",
            buckets=BATCH_BUCKETS_S,
            registry=reg,
        )
        self._batch_size = Histogram(
            "gradefleet_batch_rollouts",
            "Rollouts per graded batch.",
            buckets=BATCH_SIZE_BUCKETS,
            registry=reg,
        )
        queue_wait = Histogram(
            "gradefleet_queue_wait_seconds",
            "Time a batch waited in the queue (enqueued_at to task start), by lane.",
            ["lane"],
            buckets=QUEUE_WAIT_BUCKETS_S,
            registry=reg,
        )
        self._queue_wait: dict[str, Histogram] = {
            lane: queue_wait.labels(lane=lane) for lane in LANES
        }
        skipped = Counter(
            "gradefleet_batches_skipped",
            "Deliveries acknowledged without grading, by reason: answered (a copy "
            "of a batch whose result is stored), abandoned (its job has no live "
            "producer), claimed (another delivery of it is being graded).",
            ["reason"],
            registry=reg,
        )
        self._skipped = {r: skipped.labels(reason=r) for r in SKIP_REASONS}
        lane_rollouts = Counter(
            "gradefleet_lane_rollouts",
            "Rollouts of finished batches, by the lane they were queued in.",
            ["lane"],
            registry=reg,
        )
        self._lane_rollouts: dict[str, Counter] = {
            lane: lane_rollouts.labels(lane=lane) for lane in LANES
        }

    def item_graded(self, verdict: Verdict, duration_s: float) -> None:
        """Count one graded rollout by status; record its grading time."""
        self._graded[Status(verdict.status)].inc()
        if not verdict.format_valid:
            self._format_invalid.inc()
        self._grade_duration.observe(max(duration_s, 0.0))
        self.code.count(code_tally([verdict]))

    def items_graded(self, graded: Sequence[tuple[Verdict, float]]) -> None:
        """`item_graded` of each (verdict, seconds), a counter moved once per
        status: each move is a locked write to the multiprocess files, about 1 us
        an item of a prefork child's CPU (issue 11)."""
        self.items_counted(
            collections.Counter(verdict.status for verdict, _s in graded),
            sum(not verdict.format_valid for verdict, _s in graded),
            [duration_s for _verdict, duration_s in graded],
            code_tally(verdict for verdict, _s in graded),
        )

    def items_counted(
        self,
        statuses: Mapping[Status, int],
        format_invalid: int,
        durations_s: Iterable[float],
        code: CodeTally | None = None,
    ) -> None:
        """`items_graded` from its counts (a unit of lines graded whole reports
        these, not its verdicts; `code`: their `code_metrics.code_tally`)."""
        for status, count in statuses.items():
            self._graded[status].inc(count)
        if format_invalid:
            self._format_invalid.inc(format_invalid)
        observe_all(self._grade_duration, (max(s, 0.0) for s in durations_s))
        if code:
            self.code.count(code)

    def cache_lookup(self, *, hits: int, misses: int) -> None:
        """Count one batch's cache lookups."""
        if hits:
            self._cache["hit"].inc(hits)
        if misses:
            self._cache["miss"].inc(misses)

    def sandbox_restarted(self, reason: str) -> None:
        """Count a sandbox restart; unknown reasons are counted as "other"."""
        key = reason if reason in self._restarts else "other"
        self._restarts[key].inc()

    def sandbox_started(self, role: str, seconds: float) -> None:
        """A code sandbox zygote started (`workers.code.sandbox.SandboxObserver`)."""
        self.code.sandbox_started(role, seconds)

    def integrity_rejected(self, kind: str, count: int = 1) -> None:
        """Count messages or entries refused because their MAC did not verify."""
        if count:
            self._rejected[kind].inc(count)

    def batch_done(
        self, *, size: int, duration_s: float, lane: str = INTERACTIVE
    ) -> None:
        """Record one finished batch (of `lane`; an unknown lane counts as
        interactive, where work from before lanes existed went)."""
        self._batch_duration.observe(max(duration_s, 0.0))
        self._batch_size.observe(size)
        self._lane_rollouts.get(lane, self._lane_rollouts[INTERACTIVE]).inc(size)

    def batch_skipped(self, reason: str) -> None:
        """Count a delivery acknowledged without grading (`SKIP_REASONS`)."""
        self._skipped[reason].inc()

    def queue_wait(self, seconds: float, *, lane: str = INTERACTIVE) -> None:
        """Record how long a batch of `lane` waited in the queue (clock skew clamps
        to 0)."""
        wait = self._queue_wait.get(lane, self._queue_wait[INTERACTIVE])
        wait.observe(max(seconds, 0.0))

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Mark this process busy for the duration of the block."""
        self._busy.inc()
        try:
            yield
        finally:
            self._busy.dec()


class ProducerMetrics:
    """Producer-side counters (the client process; single-process mode)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.rollouts_submitted = Counter(
            "gradefleet_producer_rollouts_submitted",
            "Rollouts submitted for grading.",
            registry=self.registry,
        )
        self.results_received = Counter(
            "gradefleet_producer_results_received",
            "Verdicts received back by the producer.",
            registry=self.registry,
        )
        self.batches_resent = Counter(
            "gradefleet_producer_batches_resent",
            "Batches re-sent because their result did not arrive in time.",
            registry=self.registry,
        )


class RedisQueueClient(Protocol):
    """The part of `redis.Redis` the queue-depth reader uses."""

    def pipeline(self, transaction: bool = ...) -> Any: ...


@dataclass(frozen=True, slots=True)
class QueueDepths:
    """What the broker holds: ready batches per queue, and unacked ones in all."""

    ready: dict[str, int]
    unacked: int


def read_queue_depths(client: RedisQueueClient, queues: Sequence[str]) -> QueueDepths:
    """Ready messages per queue and unacked messages, read with O(1) commands only.

    ready = LLEN of the queue list plus its priority lists; unacked = HLEN of kombu's
    "unacked" hash, one hash for every queue of the broker. Its entries are never read
    (a scrape used to HVALS them to split them by queue: every scrape then pulled every
    delivered message out of Redis). Raises redis errors (the collector turns them
    into `..._up 0`).
    """
    pipe = client.pipeline(transaction=False)
    lists = [priority_queue_keys(queue) for queue in queues]
    for names in lists:
        for name in names:
            pipe.llen(name)
    pipe.hlen(UNACKED_KEY)
    replies = [int(r) for r in pipe.execute()]
    width = len(lists[0]) if lists else 0
    ready = {q: sum(replies[i * width : (i + 1) * width]) for i, q in enumerate(queues)}
    return QueueDepths(ready=ready, unacked=replies[-1])


class QueueDepthCollector(Collector):
    """`gradefleet_queue_depth{queue,state}` read from Redis at scrape time.

    A Redis outage never fails the scrape: the depth is omitted and
    `gradefleet_queue_depth_up` is 0. Give the client a short `socket_timeout`.
    """

    def __init__(self, redis_client: RedisQueueClient, queues: Sequence[str]) -> None:
        self._client = redis_client
        self._queues = tuple(queues)

    def describe(self) -> Iterable[Metric]:
        # Declared so registration does not trigger a Redis round trip.
        return [self._depth_family(), self._unacked_family(), self._up_family()]

    def collect(self) -> Iterable[Metric]:
        depth = self._depth_family()
        unacked = self._unacked_family()
        up = self._up_family()
        try:
            depths = read_queue_depths(self._client, self._queues)
        except (RedisError, OSError, ValueError):
            # Broker down or odd replies: "unknown" (up 0), never a failed scrape.
            up.add_metric([], 0.0)
            return [up]
        for queue, n in sorted(depths.ready.items()):
            depth.add_metric([queue, lane_of_queue(queue) or "", "ready"], float(n))
        unacked.add_metric([], float(depths.unacked))
        up.add_metric([], 1.0)
        return [depth, unacked, up]

    @staticmethod
    def _depth_family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "gradefleet_queue_depth",
            "Batches waiting in a broker queue (state: ready); `lane` is the "
            "queue's priority lane.",
            labels=["queue", "lane", "state"],
        )

    @staticmethod
    def _unacked_family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "gradefleet_broker_unacked",
            "Batches delivered to a worker and not yet acknowledged (all queues).",
        )

    @staticmethod
    def _up_family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "gradefleet_queue_depth_up",
            "1 if the last queue-depth read from Redis succeeded, else 0.",
        )


def prepare_multiprocess_dir(path: Path) -> None:
    """Create `path`, delete stale *.db files, and switch prometheus_client to it.

    Call it in the worker entry point before any metric is created (values are kept
    in per-process mmap files from then on). The directory must belong to one node.
    """
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
    os.environ[MULTIPROC_ENV] = str(path)
    # prometheus_client picks its value class when it is first imported; this module
    # imports it, so re-pick now that the variable is set (metrics made later use it).
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def _multiproc_path(path: Path | None) -> Path:
    if path is not None:
        return path
    env = os.environ.get(MULTIPROC_ENV)
    if not env or not Path(env).is_dir():
        raise MetricsSetupError(
            f"{MULTIPROC_ENV} is unset or not a directory; "
            "call prepare_multiprocess_dir() first"
        )
    return Path(env)


def mark_process_dead(pid: int, path: Path | None = None) -> None:
    """Drop a dead process's live gauges (its counters stay counted)."""
    _mp.mark_process_dead(pid, str(_multiproc_path(path)))  # type: ignore[no-untyped-call]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_dead_processes(path: Path | None = None) -> list[int]:
    """`mark_process_dead` every pid with live-gauge files that no longer runs.

    Covers children killed with SIGKILL, which never run their own shutdown hooks.
    """
    folder = _multiproc_path(path)
    dead: set[int] = set()
    for db in folder.glob("gauge_live*_*.db"):
        pid_text = db.stem.rpartition("_")[2]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            dead.add(int(pid_text))
    for pid in sorted(dead):
        mark_process_dead(pid, folder)
    return sorted(dead)


class _MultiProcessView(Collector):
    """A `MultiProcessCollector` that first forgets the live gauges of dead pids."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._inner = _mp.MultiProcessCollector(None, path=str(path))  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Metric]:
        reap_dead_processes(self._path)
        return self._inner.collect()  # type: ignore[no-untyped-call,no-any-return]


def metrics_registry(
    *,
    path: Path | None = None,
    redis_client: RedisQueueClient | None = None,
    queues: Sequence[str] = (),
) -> CollectorRegistry:
    """The registry a node serves: every process's files summed, plus queue depth."""
    registry = CollectorRegistry()
    registry.register(_MultiProcessView(_multiproc_path(path)))
    if redis_client is not None:
        registry.register(QueueDepthCollector(redis_client, queues))
    return registry


METRICS_PATH = "/metrics"


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (a scrape every 15 s would fill the worker's log)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def metrics_wsgi_app(registry: CollectorRegistry) -> WSGIApplication:
    """prometheus_client's WSGI app on `/metrics` only (404 on any other path, so a
    port scan or a stray client costs no collection and no Redis round trip)."""
    serve = make_wsgi_app(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found; metrics are at /metrics\n"]
        body: Iterable[bytes] = serve(environ, start_response)
        return body

    return app


class _Server(ThreadingWSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def start_metrics_server(
    port: int,
    *,
    addr: str,
    redis_client: RedisQueueClient | None = None,
    queues: Sequence[str] = (),
) -> WSGIServer:
    """Serve `metrics_registry()` at `http://addr:port/metrics` from a daemon thread
    of this process (loopback unless the caller binds wider); returns the server.

    Call it once per node, in the parent process, after `prepare_multiprocess_dir()`.
    """
    registry = metrics_registry(redis_client=redis_client, queues=queues)
    server_class = _Server6 if ":" in addr else _Server  # ":": an IPv6 literal
    app = metrics_wsgi_app(registry)
    server: WSGIServer = make_server(
        addr, port, app, server_class, handler_class=_QuietHandler
    )
    thread = threading.Thread(
        target=server.serve_forever, name="gradefleet-metrics", daemon=True
    )
    thread.start()
    return server


def exposition(registry: CollectorRegistry) -> bytes:
    """The text exposition of `registry` (what a scrape returns)."""
    return generate_latest(registry)
