"""Import boundaries: the pure verifier pulls in no fleet dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FLEET_MODULES = ("celery", "redis", "prometheus_client", "kombu", "billiard")


def _modules_after_import(module: str) -> set[str]:
    """Top-level packages loaded by importing `module` in a fresh interpreter."""
    script = (
        "import json, sys\n"
        f"import {module}\n"
        "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(completed.stdout))


@pytest.mark.parametrize(
    "module", ["workers.verifier", "workers.verifier.extract", "workers.models"]
)
def test_imports_verifier_loads_no_fleet_modules(module: str) -> None:
    loaded = _modules_after_import(module)
    assert module.split(".")[0] in loaded
    assert sorted(loaded & set(FLEET_MODULES)) == []


def test_imports_redis_client_uses_the_hiredis_parser() -> None:
    # A declared dependency: without it every Redis reply is parsed in Python
    # (the fleet's per-batch bookkeeping took about twice as long).
    import redis

    client = redis.Redis()
    try:
        connection = client.connection_pool.make_connection()
        assert "Hiredis" in type(connection._parser).__name__
    finally:
        client.close()
