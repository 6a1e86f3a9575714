"""Per-route request metrics of `gradefleet serve`, kept as plain numbers.

The service answers thousands of one-item requests a second. prometheus_client's
labelled Counter, Histogram and Gauge take a lock and check their arguments on
every update, several microseconds per request; here the event loop's thread (the
only writer) adds to dicts and lists, and a collector turns them into the same
metric families when /metrics is scraped. The scrape copies each dict and list
with one C call (under the GIL), so it never sees one half-changed.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample

__all__ = ["LATENCY_BUCKETS_S", "RequestStats"]

LATENCY_BUCKETS_S: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    120.0,
    float("inf"),
)
# As prometheus_client writes them ("0.005", "1.0", "+Inf").
_BUCKET_NAMES: Final = tuple(
    "+Inf" if bound == float("inf") else repr(bound) for bound in LATENCY_BUCKETS_S
)


class RequestStats:
    """Requests answered by route and status code, their latency by route, and the
    requests in flight; a prometheus_client collector (register it in a registry).
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self._counts: dict[tuple[str, int], int] = {}
        self._created: dict[tuple[str, int] | str, float] = {}
        # Per route: a count per bucket of LATENCY_BUCKETS_S, then the sum.
        self._latency: dict[str, list[float]] = {}

    def observe(self, route: str, code: int, seconds: float) -> None:
        """Count one answered request."""
        key = (route, code)
        count = self._counts.get(key)
        if count is None:
            self._created[key] = time.time()
            count = 0
        self._counts[key] = count + 1
        row = self._latency.get(route)
        if row is None:
            self._created[route] = time.time()
            row = self._latency[route] = [0.0] * (len(LATENCY_BUCKETS_S) + 1)
        row[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        row[-1] += seconds

    def describe(self) -> list[Metric]:
        return []  # no names to check at registration: none collide with others

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "gradefleet_http_requests",
            "HTTP requests answered, by route and status code.",
            labels=["route", "code"],
        )
        created = dict(self._created)
        for (route, code), count in list(self._counts.items()):
            requests.add_metric(
                [route, str(code)], count, created=created.get((route, code))
            )
        yield requests
        latency = HistogramMetricFamily(
            "gradefleet_http_request_duration_seconds",
            "Time to answer an HTTP request, by route.",
            labels=["route"],
        )
        for route, row in list(self._latency.items()):
            counts = list(row)
            cumulative, buckets = 0.0, []
            for name, in_bucket in zip(_BUCKET_NAMES, counts, strict=False):
                cumulative += in_bucket
                buckets.append((name, cumulative))
            latency.add_metric([route], buckets, counts[-1])
            if route in created:  # as prometheus_client's own Histogram has it
                name = "gradefleet_http_request_duration_seconds_created"
                latency.samples.append(Sample(name, {"route": route}, created[route]))
        yield latency
        yield GaugeMetricFamily(
            "gradefleet_http_requests_in_flight",
            "HTTP requests being answered.",
            value=self.in_flight,
        )
