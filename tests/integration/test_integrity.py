"""Integrity against a client with write access to the broker (issue 13), on a real
redis-server and real worker processes holding a fleet key: a poisoned cache entry,
a forged saved-verdicts hash and a forged task carrying a victim's ids are all
ignored, counted, and the verdicts equal a clean in-process grade."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from producer.cli import cli
from producer.client.fleet import GradingClient
from tests.helpers import free_port
from tests.integration.faults import publish_batch
from workers import verifier
from workers.cache.results import cache_keyer
from workers.models import GradeOptions, Verdict
from workers.wire.contract import GRADE_BATCH, QUEUE, batch_to_wire, detach_items
from workers.wire.protocol import (
    partial_key,
    read_task_meta,
    result_key,
    result_rejection,
    task_meta_key,
)
from workers.wire.signing import Keyring, items_digest

pytestmark = pytest.mark.integration

KEY = "integrity-test-key-0123456789abcdef"  # 35 bytes
KEYRING = Keyring.from_text(KEY)
_WAIT_S = 60.0


def _keyed_worker(make_workers: Any, url: str, tmp_path: Path) -> int:
    """Start one worker holding the fleet key (from a file); returns its metrics
    port."""
    key_file = tmp_path / "fleet.key"
    key_file.write_text(KEY + "\n")
    port = free_port()
    env = {
        "GRADEFLEET_SIGNING_KEY_FILE": str(key_file),
        "GRADEFLEET_METRICS_PORT": str(port),
        "GRADEFLEET_METRICS_DIR": str(tmp_path / "metrics"),
    }
    make_workers(url).start(item_timeout_s=10.0, extra_env=env)
    return port


def test_integrity_status_says_which_workers_hold_the_key(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a keyed worker (key from a file) and an unkeyed one on the same broker
    url = start_redis_server()
    _keyed_worker(make_workers, url, tmp_path)
    make_workers(url).start(item_timeout_s=10.0)
    args = ["status", "--broker", url, "--window-s", "0.1", "--timeout-s", "3"]
    # When `gradefleet status` asks them over the control bus, as a client holding
    # the fleet key and as one holding another key
    mine = CliRunner().invoke(
        cli, [*args, "--json"], env={"GRADEFLEET_SIGNING_KEY": KEY}
    )
    other_key = "not-the-fleet-key-0123456789abcdefgh"
    table = CliRunner().invoke(cli, args, env={"GRADEFLEET_SIGNING_KEY": other_key})
    # Then each worker says whether it is keyed, by the key's id, never the key
    assert mine.exit_code == 0, mine.output
    assert KEY not in mine.stdout
    status = json.loads(mine.stdout)
    assert sorted((w["keyed"], w["signing_key_id"]) for w in status["workers"]) == [
        (False, None),
        (True, KEYRING.signing_id),
    ]
    assert status["client_key_id"] == KEYRING.signing_id
    # and a worker under another key than the caller's is flagged
    assert table.exit_code == 0, table.output
    assert "workers      2 live, 1 keyed" in table.stdout
    assert f"keyed (key {KEYRING.signing_id}), not this client's key" in table.stdout
    assert "NOT keyed" in table.stdout


def _rejected(port: int, kind: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    prefix = f'gradefleet_integrity_rejected_total{{kind="{kind}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def _clean(rollouts: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """In-process verdicts, without `cached` (the fleet's may say True)."""
    return [
        {k: v for k, v in verifier.grade(r, g).to_dict().items() if k != "cached"}
        for r, g in rollouts
    ]


def _plain(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    return [{k: v for k, v in x.to_dict().items() if k != "cached"} for x in verdicts]


def test_integrity_poisoned_cache_entry_is_ignored_and_regraded(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a keyed worker, and a forged "correct" cache entry for \boxed{41} vs 42
    # written straight into Redis (unsigned, and signed with another key)
    url = start_redis_server()
    port = _keyed_worker(make_workers, url, tmp_path)
    client = redis.Redis.from_url(url)
    options = GradeOptions()
    key_of = cache_keyer(verifier.GRADER_VERSION, options)
    poisoned = [("so \\boxed{41}", "42"), ("\\boxed{7}", "8")]
    forged = {
        "status": "correct",
        "correct": True,
        "verify_method": "exact",
        "reason": "identical canonical form",
        "canonical_pred": "42",
        "canonical_gold": "42",
        "grader_version": verifier.GRADER_VERSION,
    }
    other = Keyring.from_text("not-the-fleet-key-0123456789abcdefgh")
    names = []
    for (response, gold), sign in zip(poisoned, [False, True], strict=True):
        decision_key = verifier.prepare(response, gold, options=options).decision_key
        assert decision_key is not None
        digest = key_of(decision_key)
        entry = json.dumps(forged, sort_keys=True, separators=(",", ":"))
        value = f"{other.sign('cache', digest, entry)}|{entry}" if sign else entry
        client.set(result_key(digest), value)
        names.append(result_key(digest))
    # When both are graded, twice
    with GradingClient(url, keyring=KEYRING, deadline_s=_WAIT_S) as grader:
        first = grader.grade([{"response": r, "gold": g} for r, g in poisoned])
        again = grader.grade([{"response": r, "gold": g} for r, g in poisoned])
    # Then both are graded (wrong), the forged entries counted and overwritten by
    # signed ones, which the second run reads back
    assert _plain(first) == _clean(poisoned)
    assert [v.correct for v in first] == [False, False]
    assert [v.cached for v in first] == [False, False]
    assert [v.cached for v in again] == [True, True]
    assert _plain(again) == _clean(poisoned)
    assert _rejected(port, "cache") == 2
    for name in names:
        assert client.get(name).startswith(KEYRING.signing_id.encode() + b":")


def _wait_result(client: redis.Redis[bytes], batch_id: str) -> Any:
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        raw = client.get(task_meta_key(batch_id))
        if raw is not None:
            meta = read_task_meta(raw)
            if meta.status == "SUCCESS":
                return meta
        time.sleep(0.05)
    pytest.fail(f"no result for {batch_id} in {_WAIT_S} s")


def test_integrity_forged_partial_hash_is_ignored_and_regraded(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a keyed worker and, before a batch runs, its saved-verdicts hash filled
    # with "correct" verdicts for 16 wrong answers (unsigned, and one copied from a
    # genuine-looking tag of another index)
    url = start_redis_server()
    port = _keyed_worker(make_workers, url, tmp_path)
    client = redis.Redis.from_url(url)
    rollouts = [(f"\\boxed{{{n + 1}}}", str(n)) for n in range(16)]
    items = [(n, r, g) for n, (r, g) in enumerate(rollouts)]
    job_id, batch_id = "victim-job", "victim-job.0"
    digest = items_digest(
        detach_items(
            batch_to_wire(
                job_id=job_id,
                batch_id=batch_id,
                items=items,
                options=GradeOptions(),
                enqueued_at=0.0,
            )
        )[1]
    )
    lie = verifier.grade("\\boxed{1}", "1").to_dict()
    text = json.dumps(lie)
    copied = KEYRING.sign("partial", batch_id, digest, "0", text)  # index 0's tag
    forged = {str(n): text for n in range(15)}
    forged["15"] = f"{copied}|{text}"
    client.hset(partial_key(batch_id), mapping=forged)
    # When a key-holding producer sends that batch
    sent_digest = publish_batch(url, batch_id, items, keyring=KEYRING)
    meta = _wait_result(client, batch_id)
    # Then the forged verdicts are ignored (all 16 counted) and every item graded
    assert sent_digest == digest
    assert (
        result_rejection(
            meta.envelope,
            job_id=job_id,
            batch_id=batch_id,
            items_digest=digest,
            keyring=KEYRING,
        )
        is None
    )
    verdicts = [v for _, v in sorted(meta.results)]
    assert _plain(verdicts) == _clean(rollouts)
    assert not any(v.correct for v in verdicts)
    assert _rejected(port, "partial") == 16


def test_integrity_forged_task_with_victim_ids_cannot_answer_the_victim(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a victim's job of 16 wrong answers queued (no worker yet), signed
    url = start_redis_server()
    client = redis.Redis.from_url(url)
    rollouts = [(f"\\boxed{{{n + 1}}}", str(n)) for n in range(16)]
    grader = GradingClient(url, keyring=KEYRING, deadline_s=_WAIT_S, batch_size=16)
    job = grader.submit([{"response": r, "gold": g} for r, g in rollouts])
    (genuine,) = client.lrange(QUEUE, 0, -1)
    body = json.loads(json.loads(genuine)["body"])
    victim = body[0][0]
    # ...and an attacker without the key, who read the ids off the queue, queues a
    # forged task ahead of it: the victim's ids, inline items that grade correct
    client.rpop(QUEUE)
    attacker = Celery("attacker", broker=url, set_as_current=False)
    forged = batch_to_wire(
        job_id=victim["job_id"],
        batch_id=victim["batch_id"],
        items=[(n, "\\boxed{1}", "1") for n in range(16)],
        options=GradeOptions(),
        enqueued_at=time.time(),
    )
    attacker.send_task(
        GRADE_BATCH, args=[forged], task_id=victim["batch_id"], queue=QUEUE
    )
    attacker.close()
    client.lpush(QUEUE, genuine)  # consumed after the forged one
    # When a keyed worker starts and the victim collects
    port = _keyed_worker(make_workers, url, tmp_path)
    started = time.monotonic()
    verdicts = job.results()
    grader.close()
    # Then the forged task was dropped (counted), and the victim got the true
    # verdicts of its own items
    print(f"victim's job done {time.monotonic() - started:.2f} s after worker start")
    assert _plain(verdicts) == _clean(rollouts)
    assert not any(v.correct for v in verdicts)
    assert _rejected(port, "task") == 1
