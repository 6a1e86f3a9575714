"""A real worker with its metrics endpoint on (prometheus_client's multiprocess mode)
grades a mixed math and code file in line mode, then batches of rollouts from the
Python API: no code rollout is `error`, and its /metrics counts them by kind, their
tests and the sandbox's starts (issue 40, section 5). Line units are graded in the
line pool's forked process, whose fork hygiene closes the metrics' files: counting
starts there once made every code rollout `error` ("code grader raised OSError")."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from producer import code_rollout, open_grader
from producer.cli import cli
from tests.code_mixed import mixed_rows, write_jsonl
from tests.helpers import free_port

pytestmark = pytest.mark.integration


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _code_rows(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    return [r for r in rows if r.get("kind") == "code"]


def test_worker_metrics_count_code_rollouts_of_line_units_and_batches(
    workers: Any, redis_server: str, tmp_path: Path
) -> None:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is not installed"
    # Given a worker whose metrics endpoint is on
    port = free_port()
    workers.start(
        concurrency=1,
        item_timeout_s=30.0,
        extra_env={
            "GRADEFLEET_METRICS_PORT": str(port),
            "GRADEFLEET_METRICS_DIR": str(tmp_path / "metrics"),
        },
    )
    # When a mixed file is graded on it in line mode,
    src = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows())
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        cli,
        ["grade", str(src), "-o", str(out), "--broker", redis_server, "--quiet"],
        env={"GRADEFLEET_CACHE_URL": "none"},
    )
    assert result.exit_code == 0, result.output
    code = _code_rows(out)
    # then no code row is `error`,
    assert code
    assert not [r for r in code if r["status"] == "error"], code
    samples = _scrape(port)
    by_kind = "gradefleet_kind_rollouts_graded_total"
    assert samples[(by_kind, (("kind", "code"),))] == len(code)
    tests = "gradefleet_code_tests_total"
    passed = samples[(tests, (("result", "passed"),))]
    assert passed == sum(r["tests_passed"] or 0 for r in code)
    # the zygotes started in the line pool's process are counted by the task,
    starts = "gradefleet_code_sandbox_starts_total"
    assert samples[(starts, (("role", "model"),))] >= 1
    errors = "gradefleet_code_sandbox_errors_total"
    assert all(v == 0 for (name, _), v in samples.items() if name == errors)
    # and batches of rollouts (graded in the task's own process) count too.
    right = "```python\ndef add(a, b):\n    return a + b\n```"
    mbpp = {"test_list": ["assert add(1, 2) == 3"], "test_setup_code": ""}
    with open_grader(redis_server) as grader:
        verdicts = grader.grade([code_rollout(right, mbpp)] * 2, deadline_s=120)
    assert [v.status.value for v in verdicts] == ["correct", "correct"]
    again = _scrape(port)
    assert again[(by_kind, (("kind", "code"),))] >= len(code) + 1
    assert again[(tests, (("result", "passed"),))] >= passed + 1
