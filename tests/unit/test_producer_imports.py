"""Import boundaries of the producer: no SymPy, no worker code, light CLI start-up."""

from __future__ import annotations

import json
import subprocess
import sys

import producer

FORBIDDEN = (
    "sympy",
    "workers.verifier",
    "workers.sandbox.process",
    "workers.fleet.tasks",
    "workers.embedded.pool",
)


def _modules_after(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(done.stdout))


def test_producer_imports_no_sympy_or_worker_code() -> None:
    loaded = _modules_after("import producer, producer.cli, workers.lines.records")
    assert not [m for m in loaded if m.split(".")[0] == "sympy"]
    assert not [m for m in FORBIDDEN if m in loaded]


def test_producer_cli_import_does_not_load_celery_or_redis() -> None:
    # `gradefleet --help` and embedded mode should not pay for the broker client.
    loaded = _modules_after("import producer.cli")
    assert not {"celery", "kombu", "redis", "prometheus_client"} & loaded


def test_producer_client_import_stays_off_the_verifier() -> None:
    loaded = _modules_after("import producer.client.fleet")
    assert not [m for m in FORBIDDEN if m in loaded]
    assert "sympy" not in loaded


def test_producer_all_names_resolve() -> None:
    for name in producer.__all__:
        assert getattr(producer, name) is not None, name
    assert sorted(producer.__all__) == producer.__all__
