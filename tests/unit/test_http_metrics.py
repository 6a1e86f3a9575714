"""`producer.serve.http_metrics.RequestStats` exports what prometheus_client's own
labelled Counter, Histogram and Gauge export for the same requests (the service used
them before; dashboards and tests read these names, labels and buckets)."""

from __future__ import annotations

import re

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from producer.serve.http_metrics import LATENCY_BUCKETS_S, RequestStats

REQUESTS = [
    ("/v1/grade", 200, 0.003),
    ("/v1/grade", 200, 0.005),  # on a bucket bound: counted in it (le)
    ("/v1/grade", 200, 0.2),
    ("/metrics", 200, 0.001),
    ("other", 404, 1.0),
    ("/v1/grade", 499, 130.0),  # past the last finite bound
]


def _reference(in_flight: int) -> CollectorRegistry:
    registry = CollectorRegistry()
    requests = Counter(
        "gradefleet_http_requests",
        "HTTP requests answered, by route and status code.",
        ["route", "code"],
        registry=registry,
    )
    latency = Histogram(
        "gradefleet_http_request_duration_seconds",
        "Time to answer an HTTP request, by route.",
        ["route"],
        buckets=LATENCY_BUCKETS_S[:-1],
        registry=registry,
    )
    gauge = Gauge(
        "gradefleet_http_requests_in_flight",
        "HTTP requests being answered.",
        registry=registry,
    )
    for route, code, seconds in REQUESTS:
        requests.labels(route, str(code)).inc()
        latency.labels(route).observe(seconds)
    gauge.set(in_flight)
    return registry


def _text(registry: CollectorRegistry) -> list[str]:
    """The exposition, sorted, with `_created` timestamps blanked."""
    text = generate_latest(registry).decode()
    return sorted(
        re.sub(r"(_created\{.*\}) .*", r"\1 T", line) for line in text.splitlines()
    )


def test_request_stats_export_what_prometheus_client_exports() -> None:
    stats = RequestStats()
    for route, code, seconds in REQUESTS:
        stats.observe(route, code, seconds)
    stats.in_flight = 2
    registry = CollectorRegistry()
    registry.register(stats)
    assert _text(registry) == _text(_reference(in_flight=2))


def test_request_stats_before_any_request() -> None:
    registry = CollectorRegistry()
    registry.register(RequestStats())
    text = generate_latest(registry).decode()
    assert "gradefleet_http_requests_in_flight 0.0" in text
    assert "gradefleet_http_requests_total{" not in text
