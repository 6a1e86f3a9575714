"""Helpers of the broker-fault tests (issue 13): a redis-server a test can restart
or starve of memory, real rollouts, verdict comparison, a worker's counters."""

from __future__ import annotations

import collections
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from producer.client.fleet import GradingClient
from tests.helpers import free_port, real_rollouts
from workers.models import ExtractionMethod, GradeOptions, Status, Verdict
from workers.wire.contract import (
    GRADE_BATCH,
    QUEUE,
    batch_to_wire,
    detach_items,
    sign_task,
)
from workers.wire.protocol import attempts_key, partial_key
from workers.wire.signing import Keyring, items_digest

NO_CACHE = {"GRADEFLEET_CACHE_URL": "none"}


class RestartableRedis:
    """A redis-server on a fixed port, without persistence, that a test restarts."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self._workdir)]
        self.proc = subprocess.Popen([*args, *self._extra], stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def starve(self) -> None:
        """Set `maxmemory` far below what is used (noeviction): every write that
        may grow memory is refused with OutOfMemoryError, however many keys are
        deleted meanwhile; reads and deletes pass."""
        admin = redis.Redis.from_url(self.url)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        admin.close()

    def feed(self) -> None:
        """Lift the memory limit again."""
        admin = redis.Redis.from_url(self.url)
        admin.config_set("maxmemory", 0)
        admin.close()


def fleet_rollouts(n: int) -> list[dict[str, str]]:
    """`n` real rollouts (repeating the real set past its length)."""
    real = real_rollouts()
    return [
        {"response": real[i % len(real)].response, "gold": real[i % len(real)].gold}
        for i in range(n)
    ]


def plain(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    """Verdicts as dicts without `cached` (which differs between runs)."""
    return [{k: v for k, v in x.to_dict().items() if k != "cached"} for x in verdicts]


def collect(
    client: GradingClient, rollouts: list[dict[str, str]]
) -> tuple[list[Verdict], Any]:
    """Grade through `as_completed`, asserting no index arrives twice."""
    job = client.submit(rollouts)
    seen: collections.Counter[int] = collections.Counter()
    verdicts: list[Verdict | None] = [None] * len(rollouts)
    for index, verdict in job.as_completed():
        seen[index] += 1
        verdicts[index] = verdict
    assert set(seen.values()) == {1}, "an index arrived twice"
    assert None not in verdicts
    return [v for v in verdicts if v is not None], job


def counter_total(port: int, name: str, **labels: str) -> float:
    """Sum of a counter family on a worker's metrics endpoint (label filter)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def metered_worker(
    make_workers: Any, url: str, tmp_path: Path, *, concurrency: int
) -> tuple[Any, int]:
    """A worker node without cache, with a metrics endpoint: (it, its port)."""
    port = free_port()
    env = {
        **NO_CACHE,
        "GRADEFLEET_METRICS_PORT": str(port),
        "GRADEFLEET_METRICS_DIR": str(tmp_path / "metrics"),
    }
    worker = make_workers(url).start(concurrency=concurrency, extra_env=env)
    return worker, port


def publish_batch(
    url: str,
    batch_id: str,
    items: list[tuple[int, str, str]],
    *,
    keyring: Keyring | None = None,
    unit: bytes | None = None,
) -> str:
    """Store a batch's items and queue its task as a producer does (job id: the part
    of `batch_id` before the dot; signed when a `keyring` is given); returns the
    items digest. With `unit` (a `workers.lines.units.fleet_unit_payload`), that is
    stored in place of the items, as `GradingClient.submit_units` does."""
    wire, items_json = detach_items(
        batch_to_wire(
            job_id=batch_id.split(".")[0],
            batch_id=batch_id,
            items=items,
            options=GradeOptions(),
            enqueued_at=time.time(),
        )
    )
    if unit is not None:
        items_json = unit
    if keyring is not None:
        wire = sign_task(wire, items_json, keyring)
    redis.Redis.from_url(url).set(wire["items_key"], items_json, ex=600)
    app = Celery("producer", broker=url, set_as_current=False)
    try:
        app.send_task(GRADE_BATCH, args=[wire], task_id=batch_id, queue=QUEUE)
    finally:
        app.close()
    return items_digest(items_json)


def save_first_verdict(client: redis.Redis, batch_id: str) -> Verdict:
    """Leave what a delivery of `batch_id` that died after grading item 0 leaves:
    its saved verdict (returned; graded again, "3" would not come out so) and one
    delivery counted."""
    saved = Verdict(
        correct=True,
        status=Status.CORRECT,
        format_valid=True,
        extracted="3",
        extraction_method=ExtractionMethod.BOXED,
        reason="saved by an earlier delivery",
    )
    client.hset(partial_key(batch_id), "0", json.dumps(saved.to_dict()))
    client.set(attempts_key(batch_id), 1)
    return saved
