"""Every metric named in the alert rules, their tests and the Grafana dashboard is one
the code exports (so a renamed metric cannot leave a silent dashboard or alert)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from workers.fleet.metrics import ProducerMetrics, QueueDepthCollector, WorkerMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# Series Prometheus itself attaches to every scrape target.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
PROMQL_WORDS = {
    "and", "or", "unless", "bool", "by", "without", "on", "ignoring",
    "group_left", "group_right", "offset", "inf", "nan",
}  # fmt: skip
_IDENT = re.compile(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*")


def exported_names() -> set[str]:
    """Names of every sample the code can expose (counters with _total, etc.)."""
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    ProducerMetrics(registry)
    names = {s.name for family in registry.collect() for s in family.samples}
    # The queue collector reads Redis at scrape time; its names come from describe().
    queue = QueueDepthCollector(redis_client=None, queues=())  # type: ignore[arg-type]
    names |= {family.name for family in queue.describe()}
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers left after removing strings,
    label matchers, ranges, grouping clauses, Grafana variables, functions, keywords."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )
    names = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end() :].lstrip()
        word = match.group()
        if rest.startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function or aggregation call, or a keyword
        names.add(word)
    return names


def alert_exprs() -> list[str]:
    """`expr:` values in alerts.yml (block scalars or one-liners); no YAML library."""
    lines = (DEPLOY / "prometheus" / "alerts.yml").read_text().splitlines()
    exprs = []
    for i, line in enumerate(lines):
        key, _, value = line.strip().partition(":")
        if key != "expr":
            continue
        value = value.strip()
        if value not in ("|", ">", "|-", ">-"):
            exprs.append(value)
            continue
        indent = len(line) - len(line.lstrip())
        block = []
        for nxt in lines[i + 1 :]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            block.append(nxt)
        exprs.append("\n".join(block))
    return exprs


def rule_test_series_names() -> set[str]:
    text = (DEPLOY / "prometheus" / "alerts_test.yml").read_text()
    return set(re.findall(r"series:\s*'([A-Za-z_:][A-Za-z0-9_:]*)\{", text))


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana/dashboards/gradefleet.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def unknown_names(exprs: list[str]) -> set[str]:
    known = exported_names() | PROMETHEUS_SYNTHETIC
    return {name for expr in exprs for name in metric_names(expr)} - known


def test_deploy_metric_names_extractor_finds_names():
    expr = (
        'histogram_quantile(0.95, sum by (le) (rate(a_seconds_bucket{x="y z"}[5m])))'
        ' / on() sum(b_total offset 1h) > 1e-6 and absent(up{job="w"} == 1)'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "up"}


def test_deploy_metric_names_alerts_use_exported_metrics():
    exprs = alert_exprs()
    assert len(exprs) == 15  # one per rule: the parser did not miss a block
    assert unknown_names(exprs) == set()
    assert rule_test_series_names() - exported_names() - PROMETHEUS_SYNTHETIC == set()


def test_deploy_metric_names_dashboard_uses_exported_metrics():
    exprs = dashboard_exprs()
    assert len(exprs) >= 12
    names = {name for expr in exprs for name in metric_names(expr)}
    assert len(names) >= 10
    assert unknown_names(exprs) == set()


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(gradefleet_rollouts_gradded_total[5m]))",  # typo
        'max by (queue) (gradefleet_queue_length{state="ready"})',  # made up
        "histogram_quantile(0.9, rate(gradefleet_batch_seconds_bucket[5m]))",
    ],
)
def test_deploy_metric_names_check_catches_made_up_names(expr):
    assert len(unknown_names([expr])) == 1


def test_deploy_metric_names_dashboard_shows_every_worker_metric():
    # The reverse direction: no worker metric is exported but never looked at.
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    families = {family.name for family in registry.collect()}
    families |= {
        "gradefleet_queue_depth",
        "gradefleet_broker_unacked",
        "gradefleet_queue_depth_up",
    }
    shown = {name for expr in dashboard_exprs() for name in metric_names(expr)}
    missing = {
        family
        for family in families
        if not shown & {family + sfx for sfx in ("", "_total", "_bucket", "_sum")}
    }
    assert missing == set()
