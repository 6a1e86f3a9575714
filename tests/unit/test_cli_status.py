"""`gradefleet status` pieces that need no server: metrics parsing, rendering, URLs."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from producer.client.board import JobEntry
from producer.client.status import (
    FleetStatus,
    LaneStatus,
    WorkerStatus,
    redact_url,
    totals_from_exposition,
)
from workers.fleet.metrics import WorkerMetrics, exposition
from workers.models import ExtractionMethod, Status, Verdict


def _verdict(status: Status) -> Verdict:
    return Verdict(
        correct=status is Status.CORRECT,
        status=status,
        format_valid=True,
        extracted="1",
        extraction_method=ExtractionMethod.BOXED,
    )


def test_cli_status_reads_counters_from_worker_exposition() -> None:
    # Given a worker's real metrics after 3 correct, 1 timeout, 4 hits / 1 miss
    metrics = WorkerMetrics(CollectorRegistry())
    for status in (Status.CORRECT, Status.CORRECT, Status.CORRECT, Status.TIMEOUT):
        metrics.item_graded(_verdict(status), 0.01)
    metrics.cache_lookup(hits=4, misses=1)
    metrics.sandbox_restarted("timeout")
    # When its exposition is parsed
    totals = totals_from_exposition(exposition(metrics.registry).decode())
    # Then the totals match
    assert totals.by_status["correct"] == 3
    assert totals.by_status["timeout"] == 1
    assert totals.graded == 4
    assert (totals.cache_hits, totals.cache_misses) == (4, 1)
    assert totals.sandbox_restarts == 1


def test_cli_status_render_and_json() -> None:
    fleet = FleetStatus(
        broker="redis://h:6379/0",
        lanes=(
            LaneStatus(lane="interactive", queue="gradefleet", ready=3),
            LaneStatus(
                lane="interactive", kind="code", queue="gradefleet.code", ready=5
            ),
            LaneStatus(lane="bulk", queue="gradefleet.bulk", ready=40),
        ),
        unacked=2,
        jobs=(
            JobEntry(
                job_id="b" * 32,
                lane="bulk",
                total=300_000,
                done=30_000,
                in_flight=64,
                submitted_at=1.0,
            ),
            JobEntry(
                job_id="a" * 32,
                lane="interactive",
                total=8_192,
                done=2_048,
                in_flight=24,
                submitted_at=2.0,
            ),
        ),
        workers=(
            WorkerStatus(name="w1@h", concurrency=2, batches_done=40, uptime_s=9.0),
            WorkerStatus(
                name="c1@h",
                concurrency=4,
                batches_done=2,
                uptime_s=9.0,
                kinds=("code",),
            ),
        ),
        batches_per_s=2.5,
        window_s=1.0,
        graded_by_status={"correct": 3, "timeout": 1, "wrong": 0},
        rollouts_per_s=120.0,
        cache_hit_rate=0.8,
        sandbox_restarts=1,
    )
    text = fleet.render()
    assert "lanes        interactive  gradefleet: 3 ready" in text
    assert "             interactive  gradefleet.code: 5 ready" in text
    assert "             bulk         gradefleet.bulk: 40 ready" in text
    assert "             2 unacked (being graded, all lanes)" in text
    assert "jobs         2 running" in text
    # By lane, interactive first, with their progress
    interactive = text.index("  interactive  aaaaaaaaaaaa  2,048/8,192 rollouts (25%)")
    bulk = text.index("  bulk         bbbbbbbbbbbb  30,000/300,000 rollouts (10%)")
    assert interactive < bulk
    assert "64 batches in flight" in text
    assert "workers      2 live" in text
    assert "w1@h  2 processes, 40 batches done, keyed ?\n" in text  # kinds unsaid
    assert "c1@h  4 processes, 2 batches done, keyed ?, takes code\n" in text
    assert "throughput   2.5 batches/s" in text
    assert "graded       4 rollouts: correct 75.0%, timeout 25.0%" in text
    assert "120.0 rollouts/s" in text
    assert "cache        80.0% hits" in text
    data = json.loads(fleet.to_json())
    assert data["workers"][0]["name"] == "w1@h"
    assert data["ready"] == 48
    assert data["lanes"][2] == {
        "lane": "bulk",
        "kind": "math",
        "queue": "gradefleet.bulk",
        "ready": 40,
    }
    assert [w["kinds"] for w in data["workers"]] == [None, ["code"]]
    assert data["unacked"] == 2
    assert [job["lane"] for job in data["jobs"]] == ["bulk", "interactive"]


def test_cli_status_render_without_workers_or_metrics() -> None:
    fleet = FleetStatus(
        broker="redis://h:6379/0",
        lanes=(LaneStatus(lane="interactive", queue="gradefleet", ready=0),),
        unacked=None,
        workers=(),
        batches_per_s=None,
        window_s=1.0,
        metrics_errors=("http://h:9808/metrics: refused",),
    )
    text = fleet.render()
    assert "gradefleet: 0 ready" in text
    assert "? unacked" in text
    assert "workers      0 live" in text
    assert "throughput   n/a" in text
    assert "metrics      unreachable: http://h:9808/metrics: refused" in text


def test_cli_status_redacts_passwords() -> None:
    assert redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("redis://user:pw@h/0") == "redis://user:***@h/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


def test_cli_status_render_says_which_workers_hold_the_fleet_key() -> None:
    workers = (
        WorkerStatus(
            name="a@h",
            concurrency=2,
            batches_done=1,
            uptime_s=1.0,
            keyed=True,
            signing_key_id="1a2b3c4d",
        ),
        WorkerStatus(
            name="b@h",
            concurrency=2,
            batches_done=1,
            uptime_s=1.0,
            keyed=True,
            signing_key_id="99999999",
        ),
        WorkerStatus(
            name="c@h", concurrency=2, batches_done=1, uptime_s=1.0, keyed=False
        ),
        WorkerStatus(name="d@h", concurrency=2, batches_done=1, uptime_s=1.0),
    )
    fleet = FleetStatus(
        broker="redis://h:6379/0",
        lanes=(LaneStatus(lane="interactive", queue="gradefleet", ready=0),),
        unacked=0,
        workers=workers,
        batches_per_s=0.0,
        window_s=1.0,
        client_key_id="1a2b3c4d",
    )
    text = fleet.render()
    assert "workers      4 live, 2 keyed" in text
    assert "a@h  2 processes, 1 batches done, keyed (key 1a2b3c4d)\n" in text
    assert "b@h  2 processes, 1 batches done, keyed (key 99999999), not this " in text
    assert "c@h  2 processes, 1 batches done, NOT keyed" in text
    assert "d@h  2 processes, 1 batches done, keyed ?" in text  # an older worker
    data = json.loads(fleet.to_json())
    assert [(w["keyed"], w["signing_key_id"]) for w in data["workers"]] == [
        (True, "1a2b3c4d"),
        (True, "99999999"),
        (False, None),
        (None, None),
    ]
    assert data["client_key_id"] == "1a2b3c4d"
