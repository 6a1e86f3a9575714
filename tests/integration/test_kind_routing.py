"""Routing by kind within one broker (issue 40, "code rollouts everywhere"): a worker
started `--kinds math` and one `--kinds code` on the same redis-server; a mixed file
is graded with each rollout on a worker of its kind, verdicts as in embedded mode; a
fleet without a code worker leaves code batches queued (never answered `error`)
until one comes; `/readyz` on the fleet says whether a live worker takes code.

These need the code sandbox (bubblewrap, root): without it they fail, never skip.
"""

from __future__ import annotations

import shutil
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from producer import code_rollout
from producer.cli import cli
from producer.client.fleet import GradingClient
from tests.code_mixed import mixed_rows, write_jsonl
from tests.helpers import free_port
from tests.integration.test_code_rollouts import (
    EMBEDDED,
    ITEM_TIMEOUT_S,
    _check_code_verdicts,
    _grade,
    _read,
    _without_cached,
)
from tests.serve_procs import start_serve
from workers.models import Rollout, Status
from workers.wire.lanes import BULK, CODE, INTERACTIVE, MATH, queue_for

pytestmark = pytest.mark.integration

_KIND_COUNT = "gradefleet_kind_rollouts_graded_total"


@pytest.fixture(autouse=True)
def _needs_the_sandbox() -> None:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is not installed"


def _kind_counts(port: int) -> dict[str, float]:
    """Rollouts a worker node graded, by kind (its /metrics)."""
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        s.labels["kind"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == _KIND_COUNT
    }


def _start(fleet: Any, kinds: str, tmp_path: Path, port: int = 0) -> Any:
    """A worker node taking `kinds` (`--kinds`), without the answer cache (every
    rollout is graded where it goes), its metrics on `port` if given."""
    env = {"GRADEFLEET_CACHE_URL": "none"}
    if port:
        env["GRADEFLEET_METRICS_PORT"] = str(port)
        env["GRADEFLEET_METRICS_DIR"] = str(tmp_path / f"metrics-{kinds}")
    return fleet.start(
        concurrency=2,
        item_timeout_s=ITEM_TIMEOUT_S,
        extra_env=env,
        args=["--kinds", kinds],
    )


def test_kind_routing_mixed_file_each_kind_graded_by_workers_of_its_kind(
    start_redis_server: Callable[..., str],
    make_workers: Callable[[str], Any],
    tmp_path: Path,
) -> None:
    # Given one broker, a worker that takes math only and one that takes code only
    broker = start_redis_server()
    fleet = make_workers(broker)
    math_port, code_port = free_port(), free_port()
    _start(fleet, "math", tmp_path, math_port)
    _start(fleet, "code", tmp_path, code_port)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows())
    lines, rows, local = (tmp_path / f"{n}.jsonl" for n in ("lines", "rows", "local"))
    # When a mixed file is graded on the fleet in line mode and in row mode
    # (--resume), and embedded
    on_fleet = ["--broker", broker, "--batch-size", "8", "--no-cache"]
    timeout = ["--item-timeout-s", str(ITEM_TIMEOUT_S)]
    _grade(mixed, lines, *on_fleet, *timeout, env={})
    _grade(mixed, rows, "--resume", *on_fleet, *timeout, env={})
    _grade(mixed, local, "--no-cache", *EMBEDDED)
    # Then every code row has its verdict (none `error`), every math row its own,
    # and both runs give exactly the embedded verdicts
    embedded = _without_cached(_read(local))
    for graded in (_read(lines), _read(rows)):
        _check_code_verdicts(graded)
        math = [r for r in graded if r.get("kind") != "code"]
        assert math
        assert not [r for r in math if r["status"] == Status.ERROR.value]
        assert _without_cached(graded) == embedded
    # And each kind was graded by its own worker only: every code rollout of both
    # runs on the code worker, none on the math worker, and the reverse
    code_rollouts = sum(r.get("kind") == "code" for r in embedded)
    on_math, on_code = _kind_counts(math_port), _kind_counts(code_port)
    assert on_math[CODE] == 0
    assert on_math[MATH] > 0
    assert on_code[MATH] == 0
    assert on_code[CODE] == 2 * code_rollouts


def _readyz(url: str) -> dict[str, Any]:
    reply = httpx.get(url + "/readyz", timeout=30)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def _api_rollouts() -> list[Rollout]:
    mbpp = {"test_list": ["assert add(1, 2) == 3"]}
    right = "```python\ndef add(a, b):\n    return a + b\n```"
    wrong = "```python\ndef add(a, b):\n    return a * b\n```"
    return [
        Rollout("so $\\boxed{4}$", "4"),
        code_rollout(right, mbpp),
        Rollout("\\boxed{5}", "4"),
        code_rollout(wrong, mbpp),
    ]


def test_kind_routing_code_waits_queued_for_a_code_worker_and_readyz_says_so(
    start_redis_server: Callable[..., str],
    make_workers: Callable[[str], Any],
    tmp_path: Path,
    wait_until: Any,
) -> None:
    # Given one broker with a math-only worker, and the HTTP service on it
    broker = start_redis_server()
    fleet = make_workers(broker)
    _start(fleet, "math", tmp_path)
    server = start_serve(tmp_path, broker=broker)
    queues = redis.Redis.from_url(broker)
    try:
        # Then /readyz: ready (math), but no live worker takes code
        ready = _readyz(server.url)
        assert ready["ready"] is True
        assert ready["code"]["ready"] is False, ready
        assert "takes code" in ready["code"]["detail"]
        # When math and code rollouts are submitted in one job
        with GradingClient(broker, item_timeout_s=ITEM_TIMEOUT_S) as client:
            job = client.submit(_api_rollouts())
            # Then the math ones are graded, and the code batch waits in the
            # interactive code queue, untouched (no `error` verdict for it)
            wait_until(lambda: job.poll().done == 2, timeout_s=60, what="math")
            assert queues.llen(queue_for(INTERACTIVE, CODE)) == 1
            assert queues.llen(queue_for(INTERACTIVE, MATH)) == 0
            assert queues.llen(queue_for(BULK, CODE)) == 0
            assert job.poll().done == 2
            # When a code worker joins the same broker
            _start(fleet, "code", tmp_path)
            # Then /readyz says code can be graded, naming it
            code = wait_until(
                lambda: _readyz(server.url)["code"]["ready"] and _readyz(server.url),
                timeout_s=30,
                what="readyz code true",
            )["code"]
            assert "1 live workers take code" in code["detail"]
            # And it grades the queued batch: every verdict, in input order
            verdicts = job.results(timeout_s=120)
        assert [v.kind for v in verdicts] == ["math", "code", "math", "code"]
        assert [v.correct for v in verdicts] == [True, True, False, False]
        assert [v.status for v in verdicts].count(Status.ERROR) == 0
        assert queues.llen(queue_for(INTERACTIVE, CODE)) == 0
    finally:
        queues.close()
        server.stop()


def test_kind_routing_cli_warns_when_no_live_worker_takes_code(
    start_redis_server: Callable[..., str],
    make_workers: Callable[[str], Any],
    tmp_path: Path,
) -> None:
    # Given one broker with a math-only worker
    broker = start_redis_server()
    _start(make_workers(broker), "math", tmp_path)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows())
    out = tmp_path / "out.jsonl"
    # When the CLI grades a mixed file on it, with a short deadline
    args = ["grade", str(mixed), "-o", str(out), "--broker", broker, "--no-cache"]
    result = CliRunner().invoke(cli, [*args, "--deadline-s", "8"], env={})
    # Then the math results arrive, and a warning says within seconds that the
    # code rollouts wait because no live worker takes code
    assert "code rollouts wait in their queues" in result.stderr, result.stderr
    assert "none of the 1 live workers" in result.stderr
    assert "no live worker answers" not in result.stderr
    # and at the deadline the code rows are written as timeouts (exit 6), while
    # math ones were graded
    assert result.exit_code == 6, result.output
    rows = _read(out)
    math = [r for r in rows if str(r["id"]).startswith("math-")]
    code = [r for r in rows if r not in math]
    assert code
    assert {r["status"] for r in code} == {Status.TIMEOUT.value}
    assert Status.CORRECT.value in {r["status"] for r in math}


def test_kind_routing_cli_says_nothing_when_a_code_worker_is_live(
    start_redis_server: Callable[..., str],
    make_workers: Callable[[str], Any],
    tmp_path: Path,
) -> None:
    # Given one broker with a worker that takes both kinds
    broker = start_redis_server()
    _start(make_workers(broker), "math,code", tmp_path)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows())
    # When the CLI grades a mixed file on it
    args = ["grade", str(mixed), "-o", str(tmp_path / "out.jsonl")]
    args += ["--broker", broker, "--no-cache", "--item-timeout-s", str(ITEM_TIMEOUT_S)]
    result = CliRunner().invoke(cli, args, env={})
    # Then every row is graded and no warning is printed
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr, result.stderr
