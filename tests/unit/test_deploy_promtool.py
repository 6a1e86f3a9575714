"""The Prometheus config, alert rules and alert unit tests pass promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROM_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _promtool(*args: str) -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed (Debian package `prometheus`)")
    proc = subprocess.run(
        [binary, *args],
        cwd=PROM_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output


def test_deploy_promtool_check_config():
    assert "SUCCESS" in _promtool("check", "config", "prometheus.yml")


def test_deploy_promtool_check_rules():
    assert "SUCCESS: 15 rules found" in _promtool("check", "rules", "alerts.yml")


def test_deploy_promtool_test_rules():
    assert "SUCCESS" in _promtool("test", "rules", "alerts_test.yml")


def test_deploy_promtool_tests_cover_every_alert_firing_and_not():
    # Every alert in alerts.yml is named in at least one firing case (exp_alerts)
    # and one not-firing case (no exp_alerts) of alerts_test.yml.
    alerts = set(_field_values(PROM_DIR / "alerts.yml", "- alert:"))
    firing: set[str] = set()
    quiet: set[str] = set()
    lines = (PROM_DIR / "alerts_test.yml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("alertname:"):
            name = line.split(":", 1)[1].strip()
            following = lines[i + 1].strip() if i + 1 < len(lines) else ""
            (firing if following.startswith("exp_alerts:") else quiet).add(name)
    assert len(alerts) == 15
    assert alerts == firing, alerts ^ firing
    assert alerts == quiet, alerts ^ quiet


def _field_values(path: Path, prefix: str) -> list[str]:
    return [
        line.strip()[len(prefix) :].strip()
        for line in path.read_text().splitlines()
        if line.strip().startswith(prefix)
    ]
