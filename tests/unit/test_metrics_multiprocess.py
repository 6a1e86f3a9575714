"""Multiprocess mode is exact: forked children's counts sum to N per status, even
after a child is SIGKILLed mid-run. Runs in a fresh interpreter so that
PROMETHEUS_MULTIPROC_DIR never leaks into this pytest process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Each child grades MIX (1,000 verdicts); the killed one stops after KILLED_AFTER.
_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    from workers.fleet import metrics as m
    from workers.models import ExtractionMethod, Status, Verdict

    MIX = {"correct": 500, "wrong": 300, "timeout": 100, "unsupported": 60,
           "error": 40}
    KILLED_AFTER = 450  # correct 450 recorded, nothing else

    def verdicts():
        for status, n in MIX.items():
            for _ in range(n):
                yield Verdict(correct=status == "correct", status=Status(status),
                              format_valid=True, extracted="1",
                              extraction_method=ExtractionMethod.BOXED)

    path = Path(sys.argv[1])
    path.mkdir()
    (path / "counter_1.db").write_bytes(b"junk")  # stale: wiped by prepare
    m.prepare_multiprocess_dir(path)
    inherited = m.WorkerMetrics()  # built in the parent, used by forked children

    def child(own_instance, limit, ready_w):
        obs = m.WorkerMetrics() if own_instance else inherited
        with obs.busy():
            for i, v in enumerate(verdicts()):
                if i == limit:
                    os.write(ready_w, b"x")
                    signal.pause()  # wait here, busy, for the SIGKILL
                obs.item_graded(v, 0.001)
        os._exit(0)

    pids = []
    for own, limit in ((False, None), (True, None), (False, KILLED_AFTER)):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            child(own, limit, w)
        pids.append((pid, r))
    for pid, r in pids[:2]:
        os.waitpid(pid, 0)
    killed, r = pids[2]
    assert os.read(r, 1) == b"x"
    registry = m.metrics_registry(path=path)
    busy_before = registry.get_sample_value("gradefleet_workers_busy")
    os.kill(killed, signal.SIGKILL)
    os.waitpid(killed, 0)
    out_reaped = m.reap_dead_processes(path)  # what a scrape does first
    m.mark_process_dead(killed)  # the explicit hook: idempotent
    out = {s: registry.get_sample_value("gradefleet_rollouts_graded_total",
                                        {"status": s}) for s in MIX}
    out["_busy_before"] = busy_before
    out["_busy_after"] = registry.get_sample_value("gradefleet_workers_busy")
    out["_builds"] = registry.get_sample_value(
        "gradefleet_build_info",
        {"version": __import__("workers").__version__,
         "sympy": __import__("importlib.metadata").metadata.version("sympy")})
    out["_reaped"] = out_reaped == [killed]
    out["_stale"] = (path / "counter_1.db").exists()
    out["_env"] = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    print(json.dumps(out))
    """
)


def _run(tmp_path: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_metrics_multiprocess_counts_are_exact_after_sigkill(tmp_path):
    # Given three forked children (one SIGKILLed after 450 correct verdicts)
    out = _run(tmp_path / "prom")
    # Then every recorded verdict is counted exactly once per status
    assert {k: v for k, v in out.items() if not k.startswith("_")} == {
        "correct": 2 * 500 + 450,
        "wrong": 2 * 300,
        "timeout": 2 * 100,
        "unsupported": 2 * 60,
        "error": 2 * 40,
    }
    # And the busy gauge counted the live child, then forgot it once marked dead
    assert (out["_busy_before"], out["_busy_after"]) == (1.0, 0.0)
    assert out["_reaped"] is True
    assert out["_builds"] == 1.0
    assert out["_stale"] is False
    assert out["_env"] == str(tmp_path / "prom")


def test_metrics_multiprocess_env_not_leaked_into_pytest():
    # The exactness test runs in a subprocess; this process stays single-process.
    import os

    from prometheus_client import values

    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    assert not getattr(values.ValueClass, "_multiprocess", False)


def test_metrics_registry_needs_prepared_dir(monkeypatch):
    from workers.errors import GraderError
    from workers.fleet.metrics import metrics_registry

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(GraderError, match="prepare_multiprocess_dir"):
        metrics_registry()
