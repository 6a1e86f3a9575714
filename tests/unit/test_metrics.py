"""WorkerMetrics / ProducerMetrics / QueueDepthCollector through private registries."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
import redis
from prometheus_client import CollectorRegistry

import workers
from tests.helpers import free_port
from workers.fleet.metrics import (
    RESTART_REASONS,
    ProducerMetrics,
    QueueDepthCollector,
    QueueDepths,
    WorkerMetrics,
    exposition,
    read_queue_depths,
)
from workers.models import ExtractionMethod, Status, Verdict


def _verdict(status: Status, *, format_valid: bool = True) -> Verdict:
    return Verdict(
        correct=status is Status.CORRECT,
        status=status,
        format_valid=format_valid,
        extracted="1",
        extraction_method=ExtractionMethod.BOXED,
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> WorkerMetrics:
    return WorkerMetrics(registry)


def _graded(registry: CollectorRegistry, status: str) -> float | None:
    return registry.get_sample_value(
        "gradefleet_rollouts_graded_total", {"status": status}
    )


def test_metrics_every_bounded_label_starts_at_zero(registry, metrics):
    # Given a fresh WorkerMetrics, every status / cache result / reason exists at 0.
    for status in Status:
        assert _graded(registry, status.value) == 0.0
    for result in ("hit", "miss"):
        value = registry.get_sample_value(
            "gradefleet_cache_requests_total", {"result": result}
        )
        assert value == 0.0
    for reason in RESTART_REASONS:
        value = registry.get_sample_value(
            "gradefleet_sandbox_restarts_total", {"reason": reason}
        )
        assert value == 0.0
    assert registry.get_sample_value("gradefleet_format_invalid_total") == 0.0
    assert registry.get_sample_value("gradefleet_workers_busy") == 0.0


@pytest.mark.parametrize("at_once", [False, True], ids=["each", "at-once"])
def test_metrics_counts_per_status(registry, metrics, at_once):
    # Given a known mix of verdicts, three of them without a valid format, counted
    # one by one or all at once (as a batch commits them)
    mix = {Status.CORRECT: 5, Status.WRONG: 3, Status.TIMEOUT: 2, Status.ERROR: 1}
    graded = [
        (_verdict(status, format_valid=i != 0), 0.002)
        for status, n in mix.items()
        for i in range(n)
    ]
    if at_once:
        metrics.items_graded(graded)
    else:
        for verdict, seconds in graded:
            metrics.item_graded(verdict, seconds)
    # Then each status counts exactly its verdicts; the others stay 0
    for status in Status:
        assert _graded(registry, status.value) == float(mix.get(status, 0))
    assert registry.get_sample_value("gradefleet_format_invalid_total") == 4.0
    assert registry.get_sample_value("gradefleet_grade_duration_seconds_count") == 11
    assert registry.get_sample_value(
        "gradefleet_grade_duration_seconds_sum"
    ) == pytest.approx(0.022)
    le_1ms = registry.get_sample_value(
        "gradefleet_grade_duration_seconds_bucket", {"le": "0.001"}
    )
    le_2_5ms = registry.get_sample_value(
        "gradefleet_grade_duration_seconds_bucket", {"le": "0.0025"}
    )
    assert (le_1ms, le_2_5ms) == (0.0, 11.0)


def test_metrics_cache_sandbox_batch_queue(registry, metrics):
    metrics.cache_lookup(hits=7, misses=3)
    metrics.cache_lookup(hits=0, misses=2)
    metrics.sandbox_restarted("timeout")
    metrics.sandbox_restarted("memory")
    metrics.sandbox_restarted("memory")
    metrics.batch_done(size=64, duration_s=0.4)
    metrics.batch_done(size=512, duration_s=0.4, lane="bulk")
    metrics.queue_wait(1.5)
    metrics.queue_wait(-3.0)  # producer clock ahead: clamped, not negative
    metrics.queue_wait(30.0, lane="bulk")

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("gradefleet_cache_requests_total", result="hit") == 7.0
    assert value("gradefleet_cache_requests_total", result="miss") == 5.0
    assert value("gradefleet_sandbox_restarts_total", reason="timeout") == 1.0
    assert value("gradefleet_sandbox_restarts_total", reason="memory") == 2.0
    assert value("gradefleet_sandbox_restarts_total", reason="crash") == 0.0
    assert value("gradefleet_batch_duration_seconds_count") == 2.0
    assert value("gradefleet_batch_duration_seconds_bucket", le="0.5") == 2.0
    assert value("gradefleet_batch_duration_seconds_bucket", le="0.25") == 0.0
    assert value("gradefleet_batch_rollouts_sum") == 576.0
    assert value("gradefleet_lane_rollouts_total", lane="interactive") == 64.0
    assert value("gradefleet_lane_rollouts_total", lane="bulk") == 512.0
    assert value("gradefleet_queue_wait_seconds_count", lane="interactive") == 2.0
    assert value("gradefleet_queue_wait_seconds_sum", lane="interactive") == 1.5
    assert value("gradefleet_queue_wait_seconds_sum", lane="bulk") == 30.0


def test_metrics_unknown_restart_reason_is_bounded(registry, metrics):
    for i in range(50):
        metrics.sandbox_restarted(f"weird-{i}")
    reasons = {
        s.labels["reason"]
        for family in registry.collect()
        if family.name == "gradefleet_sandbox_restarts"
        for s in family.samples
    }
    assert reasons == set(RESTART_REASONS)
    assert (
        registry.get_sample_value(
            "gradefleet_sandbox_restarts_total", {"reason": "other"}
        )
        == 50.0
    )


def test_metrics_busy_gauge_returns_to_zero_on_error(registry, metrics):
    with metrics.busy():
        assert registry.get_sample_value("gradefleet_workers_busy") == 1.0
        with metrics.busy():
            assert registry.get_sample_value("gradefleet_workers_busy") == 2.0
    with pytest.raises(RuntimeError), metrics.busy():
        raise RuntimeError("boom")
    assert registry.get_sample_value("gradefleet_workers_busy") == 0.0


def test_metrics_build_info(registry, metrics):
    labels = {"version": workers.__version__, "sympy": metadata.version("sympy")}
    assert registry.get_sample_value("gradefleet_build_info", labels) == 1.0


def test_metrics_producer_counters(registry):
    producer = ProducerMetrics(registry)
    producer.rollouts_submitted.inc(100)
    producer.results_received.inc(98)
    producer.batches_resent.inc()
    names = ("submitted", "results_received", "batches_resent")
    got = [
        registry.get_sample_value(
            "gradefleet_producer_rollouts_submitted_total"
            if n == "submitted"
            else f"gradefleet_producer_{n}_total"
        )
        for n in names
    ]
    assert got == [100.0, 98.0, 1.0]


def test_metrics_default_registry_is_private():
    # Two instances in one process must not collide (a private registry each).
    first, second = WorkerMetrics(), WorkerMetrics()
    assert first.registry is not second.registry


def test_metrics_queue_depth_redis_down_does_not_fail_scrape(registry):
    # Given a client pointed at a port where nothing listens
    client = redis.Redis(
        port=free_port(), socket_timeout=0.5, socket_connect_timeout=0.5
    )
    registry.register(QueueDepthCollector(client, ["gradefleet"]))
    # When scraped, Then the scrape succeeds and says the depth is unknown
    text = exposition(registry).decode()
    assert "gradefleet_queue_depth_up 0.0" in text
    assert "gradefleet_queue_depth{" not in text
    client.close()


class _FakePipeline:
    """A stand-in for Redis replies (the reader's parsing, not our code, is faked)."""

    def __init__(self, data: dict[str, object]) -> None:
        self._data = data
        self._replies: list[object] = []

    def llen(self, key: str) -> None:
        self._replies.append(len(self._data.get(key, [])))  # type: ignore[arg-type]

    def hlen(self, key: str) -> None:
        self._replies.append(len(self._data.get(key, {})))  # type: ignore[arg-type]

    def hvals(self, key: str) -> None:
        raise AssertionError("a scrape must not read the unacked hash's entries")

    def execute(self) -> list[object]:
        replies, self._replies = self._replies, []
        return replies


class _FakeRedis:
    def __init__(self, data: dict[str, object]) -> None:
        self._data = data

    def pipeline(self, transaction: bool = True) -> _FakePipeline:
        return _FakePipeline(self._data)


def test_metrics_queue_depth_counts_priority_lists_and_unacked():
    unacked = {
        "tag1": json.dumps([{"body": "x"}, "gradefleet", "gradefleet"]),
        "tag2": json.dumps([{"body": "x"}, "other", "other"]),
        "tag3": "not json",
    }
    data: dict[str, object] = {
        "gradefleet": [1, 2, 3],
        "gradefleet\x06\x169": [4],
        "other": [],
        "unacked": unacked,
    }
    depths = read_queue_depths(_FakeRedis(data), ["gradefleet", "other"])
    # unacked: HLEN of the one hash (all queues), its entries never read
    assert depths == QueueDepths(ready={"gradefleet": 4, "other": 0}, unacked=3)


def test_observe_all_exposes_what_observing_one_at_a_time_does() -> None:
    # Given two histograms alike, and values on, between and past their bounds
    from prometheus_client import Histogram

    from workers.fleet.metrics import ITEM_BUCKETS_S, observe_all

    values = [0.0, *ITEM_BUCKETS_S, 0.0007, 0.3, 12.5, 1e9, 0.05, 0.05]
    one, bulk = CollectorRegistry(), CollectorRegistry()
    by_one = Histogram("h_seconds", "h", buckets=ITEM_BUCKETS_S, registry=one)
    by_bulk = Histogram("h_seconds", "h", buckets=ITEM_BUCKETS_S, registry=bulk)
    # When one observes each value and the other all of them at once
    for value in values:
        by_one.observe(value)
    observe_all(by_bulk, values)
    observe_all(by_bulk, [])  # nothing observed: nothing moves

    # Then both expose the same buckets, count and sum
    def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
        return [
            (s.name, s.labels, s.value)
            for metric in registry.collect()
            for s in metric.samples
            if not s.name.endswith("_created")
        ]

    assert samples(bulk) == samples(one)
    assert ("h_seconds_count", {}, float(len(values))) in samples(bulk)
