"""The worker's metrics of kinds and of the code sandbox (issue 40, section 5), read
through a private registry after real code gradings in the real sandbox (root and
bwrap, as CI has them): the code items' grader of the engine reports to
`WorkerMetrics`, the sandbox tells it of its starts."""

from __future__ import annotations

import json
import os

import pytest
from prometheus_client import CollectorRegistry

from workers.code import grade as code_grade
from workers.code.grade import CodeLimits, configure_default_sandbox
from workers.code.item import encode_code_gold, set_code_limits
from workers.embedded.code_items import CodeItemGrader
from workers.fleet.code_metrics import (
    CODE_FAILURES,
    KINDS,
    SANDBOX_ERRORS,
    code_tally,
    sandbox_error_reason,
)
from workers.fleet.line_batch import graded_summary
from workers.fleet.metrics import WorkerMetrics, exposition
from workers.fleet.runtime import TaskObserver
from workers.models import GradeOptions, Status

ROW = {
    "input_output": {
        "inputs": ["2 3\n", "10 1\n", "0 0\n"],
        "outputs": ["5\n", "11\n", "0\n"],
    }
}
GOLD = encode_code_gold(ROW)
RESPONSES = {
    "honest": "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
    "wrong": "```python\nprint(5)\n```",  # passes test 0 only
    "sleep": "```python\nimport time\ntime.sleep(30)\n```",
    "memory": "```python\nx = bytearray(1 << 34)\n```",
    "output": "```python\nimport sys\nsys.stdout.write('x' * (1 << 22))\n```",
    "exit_early": "```python\nimport os\nos._exit(0)\n```",
}
LIMITS = CodeLimits(
    time_limit_s=0.5, wall_s=5.0, memory_bytes=256 << 20, output_bytes=64 << 10
)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry, monkeypatch):
    # Given the worker's metrics wired as `build_runtime` wires them (this process's
    # default sandbox tells them of its starts), and small code limits.
    worker_metrics = WorkerMetrics(registry)
    monkeypatch.setattr(code_grade, "_DEFAULT_OPTIONS", {})
    monkeypatch.setattr(code_grade, "_DEFAULT", None)
    configure_default_sandbox(observer=worker_metrics)
    set_code_limits(LIMITS)
    yield worker_metrics
    set_code_limits(CodeLimits())
    if code_grade._DEFAULT is not None:
        code_grade._DEFAULT.close()


def _value(registry, name, **labels) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


def test_metrics_code_labels_start_at_zero(registry):
    # Given a fresh WorkerMetrics, every bounded label of the code metrics is 0.
    WorkerMetrics(registry)
    for kind in KINDS:
        assert _value(registry, "gradefleet_kind_rollouts_graded_total", kind=kind) == 0
    for failure in CODE_FAILURES:
        name = "gradefleet_code_failures_total"
        assert _value(registry, name, failure=failure) == 0
    for reason in SANDBOX_ERRORS:
        name = "gradefleet_code_sandbox_errors_total"
        assert _value(registry, name, reason=reason) == 0
    for role in ("model", "harness"):
        assert _value(registry, "gradefleet_code_sandbox_starts_total", role=role) == 0


def test_metrics_code_counts_real_gradings(registry, metrics):
    # When the engine's code items' grader grades real rollouts (one of each
    # outcome) and the task commits them,
    grader = CodeItemGrader(cache=None, observer=metrics)
    items = [(i, response, GOLD) for i, response in enumerate(RESPONSES.values())]
    verdicts = grader.grade(items, GradeOptions())
    by_name = dict(zip(RESPONSES, verdicts, strict=True))
    assert by_name["honest"].status is Status.CORRECT
    assert by_name["wrong"].failure["kind"] == "wrong_answer"
    assert by_name["sleep"].failure["kind"] == "timeout"
    assert by_name["memory"].failure["kind"] == "memory"
    assert by_name["output"].failure["kind"] == "output_limit"
    assert by_name["exit_early"].failure["kind"] == "wrong_answer"  # no output
    # then every rollout is counted by kind and status, its tests by result, and
    # each failure by its first failing test's kind,
    graded = "gradefleet_kind_rollouts_graded_total"
    assert _value(registry, graded, kind="code") == len(RESPONSES)
    assert _value(registry, graded, kind="math") == 0
    statuses = "gradefleet_rollouts_graded_total"
    assert _value(registry, statuses, status="correct") == 1
    assert _value(registry, statuses, status="wrong") == len(RESPONSES) - 1
    passed = sum(v.tests_passed for v in verdicts)
    total = sum(v.tests_total for v in verdicts)
    tests = "gradefleet_code_tests_total"
    assert _value(registry, tests, result="passed") == passed == 3 + 1
    assert _value(registry, tests, result="failed") == total - passed
    failures = "gradefleet_code_failures_total"
    assert _value(registry, failures, failure="wrong_answer") == 2
    for kind in ("timeout", "memory", "output_limit"):
        assert _value(registry, failures, failure=kind) == 1, kind
    assert _value(registry, failures, failure="runtime_error") == 0
    errors = "gradefleet_code_sandbox_errors_total"
    assert sum(_value(registry, errors, reason=r) for r in SANDBOX_ERRORS) == 0
    # and the sandbox's zygotes were started once each, their latency observed.
    for role in ("model", "harness"):
        starts = _value(registry, "gradefleet_code_sandbox_starts_total", role=role)
        assert starts == 1, role
        histogram = "gradefleet_code_sandbox_start_duration_seconds"
        assert _value(registry, f"{histogram}_count", role=role) == 1
        assert 0 < _value(registry, f"{histogram}_sum", role=role) < 20


def test_metrics_code_sandbox_unavailable_counted_by_reason(
    registry, metrics, monkeypatch
):
    # Given a node without bubblewrap on its PATH,
    monkeypatch.setenv("PATH", "/nonexistent")
    grader = CodeItemGrader(cache=None, observer=metrics)
    # when code rollouts are graded, each is `error` with the reason,
    verdicts = grader.grade(
        [(0, RESPONSES["honest"], GOLD), (1, RESPONSES["wrong"], GOLD)],
        GradeOptions(),
    )
    assert [v.status for v in verdicts] == [Status.ERROR, Status.ERROR]
    assert "bwrap" in verdicts[0].reason
    # and counted under its bounded reason; nothing started, no test counted.
    errors = "gradefleet_code_sandbox_errors_total"
    assert _value(registry, errors, reason="no_bwrap") == 2
    assert _value(registry, "gradefleet_code_sandbox_starts_total", role="model") == 0
    assert _value(registry, "gradefleet_code_tests_total", result="failed") == 0


def test_metrics_code_line_summary_counts_as_verdicts_do(registry, metrics):
    # Given real verdicts of a unit of lines, counted from its JSON summary (how a
    # fleet task counts a unit graded in its grading process),
    grader = CodeItemGrader(cache=None, observer=WorkerMetrics(CollectorRegistry()))
    items = [(0, RESPONSES["honest"], GOLD), (1, RESPONSES["sleep"], GOLD)]
    verdicts = grader.grade(items, GradeOptions())
    summary = graded_summary([(v, 0.1) for v in verdicts])
    other = CollectorRegistry()
    WorkerMetrics(other).items_graded([(v, 0.1) for v in verdicts])
    metrics.items_counted(
        {Status(s): n for s, n in summary["statuses"].items()},
        summary["format_invalid"],
        summary["durations_s"],
        summary["code"],
    )
    # the code counters read as if the verdicts themselves were counted.
    for name, labels in [
        ("gradefleet_kind_rollouts_graded_total", {"kind": "code"}),
        ("gradefleet_code_tests_total", {"result": "passed"}),
        ("gradefleet_code_tests_total", {"result": "failed"}),
        ("gradefleet_code_failures_total", {"failure": "timeout"}),
    ]:
        assert registry.get_sample_value(name, labels) == other.get_sample_value(
            name, labels
        ), (name, labels)
    assert _value(registry, "gradefleet_code_failures_total", failure="timeout") == 1


def test_metrics_code_labels_stay_bounded(registry):
    # Unknown failure kinds and error reasons never mint a series.
    metrics = WorkerMetrics(registry)
    metrics.code.count({"failure:brand_new": 3, "error:made_up": 1, "kind:x": 1})
    metrics.sandbox_started("stranger", 0.05)
    text = exposition(registry).decode()
    assert "brand_new" not in text
    assert "made_up" not in text
    assert 'role="stranger"' not in text
    assert sandbox_error_reason("sandbox error: the code sandbox needs root") == (
        "no_privileges"
    )
    start_failed = "sandbox error: the model sandbox did not start: x"
    assert sandbox_error_reason(start_failed) == "start_failed"
    assert sandbox_error_reason("job deadline passed") == "other"
    assert code_tally([]) == {}


def test_metrics_code_starts_in_a_forked_grading_process_travel_in_its_summary(
    registry,
):
    # Given the worker's metrics, built in this (the task's) process,
    metrics = WorkerMetrics(registry)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a grading process forked from it (the line pool's)
        os.close(read)
        metrics.sandbox_started("model", 0.05)
        metrics.sandbox_started("harness", 0.04)
        os.write(write, json.dumps(graded_summary([])).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        summary = json.loads(pipe.read())
    os.waitpid(pid, 0)
    # its starts were kept for the unit's summary, not written from the child,
    assert summary["sandbox_starts"] == [["model", 0.05], ["harness", 0.04]]
    starts = "gradefleet_code_sandbox_starts_total"
    assert _value(registry, starts, role="model") == 0
    # and the task counts them when it commits the unit.
    observer = TaskObserver(metrics)
    observer.items_summed(summary)
    observer.commit()
    assert _value(registry, starts, role="model") == 1
    assert _value(registry, starts, role="harness") == 1
