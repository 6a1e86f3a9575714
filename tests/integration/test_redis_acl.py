"""The least-privilege Redis ACL users of docs/operations.md, on a real redis-server:
a worker, a producer and `gradefleet status` each work with their own user, and
the producer's user cannot write the result cache."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from producer import code_rollout
from producer.cli import cli
from producer.client.fleet import GradingClient

pytestmark = pytest.mark.integration

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _acl_lines() -> dict[str, list[str]]:
    """The `ACL SETUSER` lines of the operations guide's ACL example, by user name."""
    text = OPERATIONS.read_text()
    block = text.split("```redis-acl\n", 1)[1].split("```", 1)[0]
    users: dict[str, list[str]] = {}
    for line in block.splitlines():
        if line.startswith("ACL SETUSER "):
            words = line.split()[2:]
            users[words[0]] = words
    return users


def _acl_server(start_redis_server: Any, producer_drops: str = "") -> tuple[str, Any]:
    """A Redis with the guide's users (passwords swapped for test ones; the
    producer's without the key pattern `producer_drops`): its port, an admin
    client."""
    url = start_redis_server()
    admin = redis.Redis.from_url(url)
    users = _acl_lines()
    assert set(users) >= {"gradefleet-worker", "gradefleet-producer"}
    if producer_drops:
        assert producer_drops in users["gradefleet-producer"]
        users["gradefleet-producer"].remove(producer_drops)
    for name, words in sorted(users.items(), key=lambda kv: kv[0] == "default"):
        args = [re.sub(r"^>.*", f">{name}-pw", w) for w in words]
        admin.execute_command("ACL", "SETUSER", *args)  # "default off" last
    return url.rsplit(":", 1)[1], admin


def _grade_as_producer(
    port: str, make_workers: Any, tmp_path: Path
) -> tuple[str, list[dict[str, Any]]]:
    """A worker as its user, the CLI as the producer's, 40 lines: the producer's
    URL and the graded lines (exit 0 asserted)."""
    worker_url = f"redis://gradefleet-worker@127.0.0.1:{port}"
    producer_url = f"redis://gradefleet-producer@127.0.0.1:{port}"
    env = {"GRADEFLEET_REDIS_PASSWORD": "gradefleet-worker-pw"}
    make_workers(worker_url).start(extra_env=env)
    source = tmp_path / "in.jsonl"
    rows = [{"response": f"\\boxed{{{n}}}", "gold": str(n % 3)} for n in range(40)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    runner = CliRunner(env={"GRADEFLEET_REDIS_PASSWORD": "gradefleet-producer-pw"})
    result = runner.invoke(
        cli, ["grade", str(source), "-o", str(out), "--broker", producer_url, "-q"]
    )
    assert result.exit_code == 0, result.output
    return producer_url, [json.loads(line) for line in out.read_text().splitlines()]


def test_redis_acl_worker_and_producer_work_with_their_own_users(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a Redis with the guide's users
    port, admin = _acl_server(start_redis_server)
    # When a worker runs as its user and the CLI grades as the producer's
    producer_url, graded = _grade_as_producer(port, make_workers, tmp_path)
    # Then every line is graded
    assert [g["correct"] for g in graded] == [n % 3 == n for n in range(40)]
    # ...status works as its user
    status = CliRunner(
        env={"GRADEFLEET_REDIS_PASSWORD": "gradefleet-status-pw"}
    ).invoke(
        cli,
        ["status", "--broker", f"redis://gradefleet-status@127.0.0.1:{port}", "--json"],
    )
    assert status.exit_code == 0, status.output
    assert len(json.loads(status.stdout)["workers"]) == 1
    # ...the producer's user sends code rollouts to the code queues, which the
    # worker's user consumes (this machine runs the sandbox: it takes both kinds)
    user = f"redis://gradefleet-producer:gradefleet-producer-pw@127.0.0.1:{port}"
    mbpp = {"test_list": ["assert add(1, 2) == 3"]}
    with GradingClient(user) as client:
        (verdict,) = client.grade(
            [code_rollout("def add(a, b):\n    return a + b", mbpp)]
        )
    assert (verdict.kind, verdict.correct) == ("code", True)
    # ...no command of theirs was refused (some are retried or best effort)
    denied = [e for e in admin.acl_log() if e["username"] != "default"]
    assert denied == [], [(e["username"], e["object"], e["reason"]) for e in denied]
    # ...and the producer's user may not poison the cache nor flush Redis
    producer = redis.Redis.from_url(producer_url, password="gradefleet-producer-pw")
    for write in (
        lambda: producer.set("gradefleet:v1:result:" + "0" * 64, "{}"),
        lambda: producer.flushall(),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            write()


def test_redis_acl_producer_without_the_output_lines_keys_grades_lines_as_rows(
    start_redis_server: Any, make_workers: Any, tmp_path: Path
) -> None:
    # Given a producer's user from before line mode: no output lines keys
    port, admin = _acl_server(start_redis_server, "~gradefleet:v1:lines:*")
    # When the CLI grades on the fleet as that user
    _url, graded = _grade_as_producer(port, make_workers, tmp_path)
    # Then its reads of the output lines were refused, and every line is graded
    # all the same, as rows
    denied = {e["object"] for e in admin.acl_log() if e["username"] != "default"}
    assert denied, "the output lines were read"
    assert all(key.startswith("gradefleet:v1:lines:") for key in denied), denied
    assert [g["correct"] for g in graded] == [n % 3 == n for n in range(40)]
    assert [g["gradefleet_line"] for g in graded] == list(range(1, 41))
