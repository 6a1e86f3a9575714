"""A real Prometheus scrapes a real worker node: graded-rollouts rate, the timeout of a
hostile item, exact per-status totals after a pool child is SIGKILLed, and every
dashboard / alert expression accepted by the server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from producer.client.fleet import GradingClient, Rollout
from tests.helpers import free_port
from tests.hooks import HANG

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ITEM_TIMEOUT_S = 3.0
_DEADLINE_S = 90.0


def _get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        body: bytes = response.read()
        return body


class PrometheusServer:
    """A `prometheus` process on a free port scraping one target every second."""

    def __init__(self, workdir: Path, target: str) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed (Debian package `prometheus`)")
        shutil.copy(DEPLOY / "prometheus" / "alerts.yml", workdir / "alerts.yml")
        config = workdir / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "rule_files: [alerts.yml]\n"
            "scrape_configs:\n"
            "  - job_name: gradefleet-workers\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.port = free_port()
        self.log_path = workdir / "prometheus.log"
        args = [binary, f"--config.file={config}"]
        args += [f"--storage.tsdb.path={workdir / 'data'}"]
        args += [f"--web.listen-address=127.0.0.1:{self.port}"]
        args += ["--web.enable-lifecycle"]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                args, cwd=workdir, stdout=log, stderr=subprocess.STDOUT
            )
        wait_for(self._ready, what="prometheus /-/ready", timeout_s=30)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"prometheus exited:\n{self.log_path.read_text()}")
        try:
            return _get(f"http://127.0.0.1:{self.port}/-/ready").startswith(b"Prom")
        except (urllib.error.URLError, OSError):
            return False

    def query(self, promql: str) -> list[dict[str, object]]:
        """Instant query; fails the test on a PromQL error."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        try:
            reply = json.loads(_get(url))
        except urllib.error.HTTPError as exc:
            pytest.fail(f"query rejected: {promql!r}: {exc.read().decode()}")
        assert reply["status"] == "success", reply
        result: list[dict[str, object]] = reply["data"]["result"]
        return result

    def scalar(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None  # type: ignore[index]

    def rule_count(self) -> int:
        reply = json.loads(_get(f"http://127.0.0.1:{self.port}/api/v1/rules"))
        return sum(len(g["rules"]) for g in reply["data"]["groups"])

    def targets(self) -> str:
        return _get(f"http://127.0.0.1:{self.port}/api/v1/targets").decode()[:2000]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)


def wait_for(
    predicate: Callable[[], object],
    *,
    what: str,
    timeout_s: float = _DEADLINE_S,
    describe: Callable[[], str] = str,
) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}{describe()}")


@pytest.fixture
def node(workers, tmp_path: Path) -> Iterator[tuple[object, int, PrometheusServer]]:
    """One worker node (2 prefork processes) with --metrics-port, and a Prometheus."""
    metrics_port = free_port()
    env = {
        "GRADEFLEET_METRICS_PORT": str(metrics_port),
        "GRADEFLEET_METRICS_DIR": str(tmp_path / "prom-multiproc"),
    }
    worker = workers.start(concurrency=2, item_timeout_s=ITEM_TIMEOUT_S, extra_env=env)
    wait_for(
        lambda: b"gradefleet_build_info{" in _scrape(metrics_port),
        what="worker metrics endpoint with build_info",
    )
    (tmp_path / "prom").mkdir()
    server = PrometheusServer(tmp_path / "prom", f"127.0.0.1:{metrics_port}")
    # Prometheus applies new targets up to 5 s after start: wait for real scrapes, or
    # a quick job could finish before the first sample and show no rate at all.
    wait_for(
        lambda: (
            (server.scalar('count_over_time(up{job="gradefleet-workers"}[1m])') or 0)
            >= 2
        ),
        what="two scrapes of the worker",
    )
    try:
        yield worker, metrics_port, server
    finally:
        server.stop()


def _scrape(port: int) -> bytes:
    try:
        return _get(f"http://127.0.0.1:{port}/metrics")
    except (urllib.error.URLError, OSError):
        return b""


def _graded_by_status(port: int) -> dict[str, float]:
    out = {}
    for line in _scrape(port).decode().splitlines():
        if line.startswith('gradefleet_rollouts_graded_total{status="'):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('"')[1]] = float(value)
    return out


def _known_rollouts(
    tag: str, n_each: int, hang_at: tuple[int, ...] = ()
) -> list[Rollout]:
    """3 x n_each ordinary rollouts (unique texts: right, wrong, no answer), plus hang
    items at the given positions."""
    rollouts = []
    for i in range(n_each):
        rollouts.append(Rollout(f"{tag} so \\boxed{{{1000 + i}}}", str(1000 + i)))
        rollouts.append(Rollout(f"{tag} so \\boxed{{{5000 + i}}}", str(9000 + i)))
        rollouts.append(Rollout(f"{tag} I cannot say.", "7"))
    for position in hang_at:
        rollouts.insert(position, Rollout(f"{tag} {HANG}", "1"))
    return rollouts


def test_prometheus_e2e_rate_and_hostile_timeout(node, redis_server):
    _, _, prom = node
    # Given a job of 90 ordinary rollouts and one that hangs the grader
    rollouts = _known_rollouts("e2e-rate", 30, hang_at=(45,))
    # When the fleet grades it
    with GradingClient(
        redis_server,
        batch_size=30,
        deadline_s=_DEADLINE_S,
        item_timeout_s=ITEM_TIMEOUT_S,
    ) as client:
        verdicts = client.grade(rollouts)
    statuses = Counter(v.status.value for v in verdicts)
    assert statuses["timeout"] == 1, statuses
    # Then Prometheus sees a positive graded rate and the hostile item's timeout
    wait_for(
        lambda: (
            (prom.scalar("sum(rate(gradefleet_rollouts_graded_total[15s]))") or 0) > 0
        ),
        what="rate(gradefleet_rollouts_graded_total) > 0",
        timeout_s=20,
        describe=lambda: f"\nup: {prom.query('up')}\ntargets: {prom.targets()}",
    )
    wait_for(
        lambda: (
            (
                prom.scalar('sum(gradefleet_rollouts_graded_total{status="timeout"})')
                or 0
            )
            >= 1
        ),
        what='gradefleet_rollouts_graded_total{status="timeout"} >= 1',
    )
    assert prom.scalar("max(gradefleet_queue_depth_up)") == 1.0
    assert (
        prom.scalar('sum(gradefleet_sandbox_restarts_total{reason="timeout"})') or 0
    ) >= 1
    # The client's jobs are interactive: counted and timed in that lane
    interactive = 'sum(gradefleet_lane_rollouts_total{lane="interactive"})'
    wait_for(
        lambda: (prom.scalar(interactive) or 0) >= len(rollouts),
        what=f"{interactive} >= {len(rollouts)}",
    )
    assert prom.scalar('sum(gradefleet_lane_rollouts_total{lane="bulk"})') == 0
    waits = 'sum(gradefleet_queue_wait_seconds_count{lane="interactive"})'
    assert (prom.scalar(waits) or 0) >= 1
    # And the real server loaded every alert rule and accepts every dashboard query
    assert prom.rule_count() == 15
    for expr in _dashboard_exprs():
        prom.query(expr.replace("$__rate_interval", "1m"))


def _progress_done(client: redis.Redis, batch_id: str) -> int:
    """Items graded so far by a running batch, from its heartbeat (else 0)."""
    raw = client.get(f"celery-task-meta-{batch_id}")
    meta = json.loads(raw) if raw else {}
    if meta.get("status") != "PROGRESS":
        return 0
    return int(meta["result"]["done"])


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana/dashboards/gradefleet.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_prometheus_e2e_exact_totals_after_pool_child_killed(
    node, redis_server, tmp_path
):
    worker, port, prom = node
    multiproc_dir = tmp_path / "prom-multiproc"
    # Given two batches of 32 (a first chunk of 16), each hanging at its 21st item
    rollouts = _known_rollouts("e2e-exact", 21, hang_at=(20, 52))
    assert len(rollouts) == 65
    before = _graded_by_status(port)
    client = GradingClient(
        redis_server,
        batch_size=32,
        deadline_s=_DEADLINE_S,
        item_timeout_s=ITEM_TIMEOUT_S,
    )
    try:
        job = client.submit(rollouts)
        # When both pool children sit in a hang item, SIGKILL one of them
        # (the heartbeat, a PROGRESS state in each batch's result key, counts the
        # items graded so far; the first chunk took milliseconds, so none is saved
        # and the killed batch's 16 graded items must not be counted twice)
        results = redis.Redis.from_url(redis_server)
        wait_for(
            lambda: all(
                _progress_done(results, f"{job.job_id}.{n}") >= 16 for n in (0, 1)
            ),
            what="both batches past their first chunk",
        )
        # Items 16-19 take milliseconds; the hang item holds for ITEM_TIMEOUT_S.
        time.sleep(1.0)
        victim = worker.pool_pids()[0]
        os.kill(victim, signal.SIGKILL)
        verdicts = job.results()
        results.close()
    finally:
        client.close()
    # Then every rollout has a verdict (the two hostile ones: timeout) ...
    expected = Counter(v.status.value for v in verdicts)
    assert len(verdicts) == 65
    assert expected["timeout"] == 2, expected
    # ... and Prometheus's totals grew by exactly N per status (nothing double-counted)
    want = {s: before.get(s, 0.0) + expected.get(s, 0) for s in before}

    def prom_totals() -> dict[str, float]:
        result = prom.query("sum by (status) (gradefleet_rollouts_graded_total)")
        return {r["metric"]["status"]: float(r["value"][1]) for r in result}  # type: ignore[index]

    deadline = time.monotonic() + 30
    while prom_totals() != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert prom_totals() == want
    assert _graded_by_status(port) == want
    # The victim really died mid-batch, and its counter file still counts
    assert victim not in worker.pool_pids()
    assert (multiproc_dir / f"counter_{victim}.db").exists()
    # And the killed child's busy gauge is gone: nothing is grading now
    wait_for(
        lambda: prom.scalar("sum(gradefleet_workers_busy)") == 0.0,
        what="gradefleet_workers_busy back to 0",
    )
