"""What `gradefleet status` shows: each queue's depth (a lane's, of one kind) and the
jobs on the job board (`producer.client.board`) read from Redis, live workers and
their task counts over Celery's control bus (a light Celery app; no worker code
imported) with whether each holds the fleet key and which kinds it takes, and, given
worker metrics URLs, rollouts by status, rollouts/s and cache hit rate."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from producer.client.board import JobEntry, read_job_board
from producer.errors import BrokerUnavailableError
from workers.wire.contract import GRADE_BATCH, KEY_STATS_FIELD, KINDS_STATS_FIELD
from workers.wire.lanes import CODE, MATH, QUEUES
from workers.wire.urls import redact_url

__all__ = [
    "FleetStatus",
    "GradingTotals",
    "LaneStatus",
    "WorkerStatus",
    "read_fleet_status",
    "redact_url",
    "totals_from_exposition",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStatus:
    """One live worker node, as it answered `inspect().stats()`."""

    name: str
    concurrency: int | None
    batches_done: int
    uptime_s: float | None
    # Whether it holds the fleet key, and the key's id; None: it did not say (a
    # version from before workers reported it).
    keyed: bool | None = None
    signing_key_id: str | None = None
    # The rollout kinds whose queues it consumes; None: it did not say (a version
    # from before kinds, which consumed math's queues only).
    kinds: tuple[str, ...] | None = None

    @property
    def grades_code(self) -> bool:
        """Whether it takes batches from the code queues."""
        return CODE in (self.kinds or (MATH,))

    def key_text(self, client_key_id: str | None) -> str:
        """`keyed (key 1a2b3c4d)`, `NOT keyed` or `keyed ?`; a key other than the
        client's is flagged: their tasks and results would be refused."""
        if self.keyed is None:
            return "keyed ?"
        if not self.keyed:
            return "NOT keyed"
        text = f"keyed (key {self.signing_key_id})"
        if client_key_id is not None and self.signing_key_id != client_key_id:
            text += f", not this client's key {client_key_id}"
        return text


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneStatus:
    """One queue: its priority lane and rollout kind, and how many batches wait
    there."""

    lane: str
    queue: str
    ready: int
    kind: str = MATH


@dataclass(slots=True, kw_only=True)
class GradingTotals:
    """Counter totals read from worker metrics endpoints (summed over endpoints)."""

    by_status: dict[str, float] = field(default_factory=dict)
    cache_hits: float = 0.0
    cache_misses: float = 0.0
    sandbox_restarts: float = 0.0

    @property
    def graded(self) -> float:
        return sum(self.by_status.values())

    def add(self, other: GradingTotals) -> None:
        for status, count in other.by_status.items():
            self.by_status[status] = self.by_status.get(status, 0.0) + count
        self.cache_hits += other.cache_hits
        self.cache_misses += other.cache_misses
        self.sandbox_restarts += other.sandbox_restarts


def totals_from_exposition(text: str) -> GradingTotals:
    """Parse Prometheus text exposition into the counters `status` shows."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = GradingTotals()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gradefleet_rollouts_graded_total":
                status = sample.labels.get("status", "?")
                totals.by_status[status] = (
                    totals.by_status.get(status, 0.0) + sample.value
                )
            elif sample.name == "gradefleet_cache_requests_total":
                if sample.labels.get("result") == "hit":
                    totals.cache_hits += sample.value
                else:
                    totals.cache_misses += sample.value
            elif sample.name == "gradefleet_sandbox_restarts_total":
                totals.sandbox_restarts += sample.value
    return totals


def _scrape(urls: Sequence[str], timeout_s: float) -> tuple[GradingTotals, list[str]]:
    totals, errors = GradingTotals(), []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                text = response.read().decode("utf-8")
            totals.add(totals_from_exposition(text))
        except (OSError, ValueError) as exc:
            errors.append(f"{redact_url(url)}: {exc}")
    return totals, errors


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetStatus:
    """A snapshot of the fleet; `batches_per_s` is measured over `window_s`."""

    broker: str
    lanes: tuple[LaneStatus, ...]
    unacked: int | None  # delivered, not yet acknowledged: all lanes together
    workers: tuple[WorkerStatus, ...]
    batches_per_s: float | None
    window_s: float
    graded_by_status: dict[str, int] | None = None
    rollouts_per_s: float | None = None
    cache_hit_rate: float | None = None
    sandbox_restarts: int | None = None
    metrics_errors: tuple[str, ...] = ()
    jobs: tuple[JobEntry, ...] = ()
    client_key_id: str | None = None  # the fleet key id of whoever asks, if any

    @property
    def ready(self) -> int:
        """Batches waiting, all lanes together."""
        return sum(lane.ready for lane in self.lanes)

    def to_json(self) -> str:
        data: dict[str, Any] = asdict(self)
        data["ready"] = self.ready
        return json.dumps(data, sort_keys=True)

    def render(self) -> str:
        rate = "n/a" if self.batches_per_s is None else f"{self.batches_per_s:.1f}"
        lines = [f"broker       {self.broker}"]
        for n, lane in enumerate(self.lanes):
            head = "lanes" if n == 0 else ""
            lines.append(
                f"{head:<13}{lane.lane:<12} {lane.queue}: {lane.ready:,} ready"
            )
        unacked = "?" if self.unacked is None else f"{self.unacked:,}"
        lines.append(f"             {unacked} unacked (being graded, all lanes)")
        lines += self._job_lines()
        keyed = sum(1 for w in self.workers if w.keyed)
        live = f"workers      {len(self.workers)} live"
        lines.append(f"{live}, {keyed} keyed" if self.workers else live)
        for w in self.workers:
            procs = "?" if w.concurrency is None else str(w.concurrency)
            kinds = "" if w.kinds is None else f", takes {', '.join(w.kinds)}"
            lines.append(
                f"  {w.name}  {procs} processes, {w.batches_done:,} batches done, "
                + w.key_text(self.client_key_id)
                + kinds
            )
        lines.append(f"throughput   {rate} batches/s (last {self.window_s:g} s)")
        return "\n".join(lines + self._metrics_lines())

    def _job_lines(self) -> list[str]:
        lines = [f"jobs         {len(self.jobs)} running"]
        order = {lane.lane: n for n, lane in enumerate(self.lanes)}
        for job in sorted(self.jobs, key=lambda j: (order.get(j.lane, 99), j.job_id)):
            lines.append(
                f"  {job.lane:<12} {job.job_id[:12]}  {job.done:,}/{job.total:,} "
                f"rollouts ({job.fraction_done:.0%}), {job.in_flight} batches in flight"
            )
        return lines

    def _metrics_lines(self) -> list[str]:
        lines = [f"metrics      unreachable: {error}" for error in self.metrics_errors]
        if self.graded_by_status is None:
            return lines
        total = sum(self.graded_by_status.values())
        shares = ", ".join(
            f"{status} {count / total:.1%}"
            for status, count in sorted(self.graded_by_status.items())
            if count and total
        )
        lines.append(
            f"graded       {total:,} rollouts" + (f": {shares}" if shares else "")
        )
        if self.rollouts_per_s is not None:
            lines.append(f"             {self.rollouts_per_s:,.1f} rollouts/s")
        hits = "n/a" if self.cache_hit_rate is None else f"{self.cache_hit_rate:.1%}"
        lines.append(f"cache        {hits} hits")
        lines.append(f"sandboxes    {self.sandbox_restarts or 0:,} restarts")
        return lines


def _lanes_and_jobs(
    broker_url: str, timeout_s: float
) -> tuple[tuple[LaneStatus, ...], int, tuple[JobEntry, ...]]:
    import redis

    from workers.fleet.metrics import read_queue_depths
    from workers.wire.connections import redis_client

    try:
        client = redis_client(
            broker_url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
    except ValueError as exc:
        raise BrokerUnavailableError(f"invalid broker URL: {exc}") from exc
    try:
        depths = read_queue_depths(client, list(QUEUES.values()))
        jobs = tuple(read_job_board(client))
    except (redis.RedisError, OSError) as exc:
        where = redact_url(broker_url)
        raise BrokerUnavailableError(
            f"cannot reach the broker at {where}: {exc}"
        ) from exc
    finally:
        client.close()
    lanes = tuple(
        LaneStatus(lane=lane, kind=kind, queue=queue, ready=depths.ready[queue])
        for (lane, kind), queue in QUEUES.items()
    )
    return lanes, depths.unacked, jobs


def _worker(name: str, stats: dict[str, Any]) -> WorkerStatus:
    pool = stats.get("pool") or {}
    concurrency = pool.get("max-concurrency")
    uptime = stats.get("uptime")
    key = stats.get(KEY_STATS_FIELD)
    key = key if isinstance(key, dict) else {}
    keyed, key_id = key.get("keyed"), key.get("signing_key_id")
    kinds = stats.get(KINDS_STATS_FIELD)
    return WorkerStatus(
        name=name,
        concurrency=concurrency if isinstance(concurrency, int) else None,
        batches_done=int((stats.get("total") or {}).get(GRADE_BATCH, 0)),
        uptime_s=float(uptime) if isinstance(uptime, int | float) else None,
        keyed=keyed if isinstance(keyed, bool) else None,
        signing_key_id=key_id if isinstance(key_id, str) else None,
        kinds=tuple(map(str, kinds)) if isinstance(kinds, list) else None,
    )


@dataclass(slots=True, kw_only=True)
class _Snapshot:
    stats: dict[str, Any]
    totals: GradingTotals
    errors: list[str]
    at_s: float


def _snapshot(
    app: Any, names: list[str], urls: Sequence[str], timeout_s: float
) -> _Snapshot:
    stats: dict[str, Any] = {}
    if names:
        inspect = app.control.inspect(timeout=timeout_s, limit=len(names))
        stats = dict(inspect.stats() or {})
    totals, errors = _scrape(urls, timeout_s)
    return _Snapshot(stats=stats, totals=totals, errors=errors, at_s=time.monotonic())


def _observe(
    broker_url: str, urls: Sequence[str], *, timeout_s: float, window_s: float
) -> tuple[list[str], _Snapshot, _Snapshot]:
    from workers.wire.connections import control_app

    app = control_app("gradefleet-status", broker_url)
    try:
        names = sorted((app.control.inspect(timeout=timeout_s).ping() or {}).keys())
        first = _snapshot(app, names, urls, timeout_s)
        if names or urls:
            time.sleep(window_s)  # rates are differences of two snapshots
            return names, first, _snapshot(app, names, urls, timeout_s)
        return names, first, first
    finally:
        app.close()


def _rate(before: float, after: float, elapsed_s: float) -> float:
    return max(0.0, after - before) / max(elapsed_s, 1e-9)


def read_fleet_status(
    broker_url: str,
    *,
    timeout_s: float = 1.0,
    window_s: float = 1.0,
    metrics_urls: Sequence[str] = (),
    client_key_id: str | None = None,
) -> FleetStatus:
    """Read queue depth, live workers, and rates over `window_s`.

    Args:
        metrics_urls: worker `/metrics` endpoints; when given, rollouts by status,
            rollouts/s, cache hit rate and sandbox restarts are read from them.
        client_key_id: the id of the fleet key the caller holds, if any: workers
            under another key are flagged.

    Raises:
        BrokerUnavailableError: Redis cannot be reached (checked first, quickly).
    """
    lanes, unacked, jobs = _lanes_and_jobs(broker_url, timeout_s)
    names, first, last = _observe(
        broker_url, metrics_urls, timeout_s=timeout_s, window_s=window_s
    )
    elapsed_s = last.at_s - first.at_s
    workers = tuple(_worker(n, last.stats.get(n) or {}) for n in names)
    done_before = sum(_worker(n, first.stats.get(n) or {}).batches_done for n in names)
    done_after = sum(w.batches_done for w in workers)
    totals = last.totals
    lookups = totals.cache_hits + totals.cache_misses
    scraped = bool(metrics_urls) and not last.errors
    return FleetStatus(
        broker=redact_url(broker_url),
        lanes=lanes,
        unacked=unacked,
        jobs=jobs,
        workers=workers,
        batches_per_s=_rate(done_before, done_after, elapsed_s) if names else None,
        window_s=window_s,
        graded_by_status={k: int(v) for k, v in totals.by_status.items()}
        if scraped
        else None,
        rollouts_per_s=_rate(first.totals.graded, totals.graded, elapsed_s)
        if scraped
        else None,
        cache_hit_rate=totals.cache_hits / lookups if scraped and lookups else None,
        sandbox_restarts=int(totals.sandbox_restarts) if scraped else None,
        metrics_errors=tuple(last.errors),
        client_key_id=client_key_id,
    )
