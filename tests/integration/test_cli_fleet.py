"""`gradefleet grade --broker` and `gradefleet status` with real workers and Redis."""

from __future__ import annotations

import json
import random
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from producer.cli import cli
from producer.client.board import read_job_board
from producer.client.fleet import GradingClient
from tests.helpers import free_port, mixed_lines
from tests.hooks import HANG
from tests.integration.faults import (
    counter_total,
    metered_worker,
    publish_batch,
    save_first_verdict,
)
from workers import verifier
from workers.fleet.metrics import ProducerMetrics
from workers.lines.fields import FieldSpec
from workers.lines.records import LINE_FIELD
from workers.lines.units import fleet_unit_payload, line_unit
from workers.models import GradeOptions
from workers.wire.protocol import partial_key, read_task_meta, task_meta_key

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample.jsonl"
# Generous on a shared 2-core machine: no real rollout should come near it.
ITEM_TIMEOUT_S = 30.0


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def _without_cached(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "cached"} for r in records]


def _status(redis_url: str, *extra: str) -> dict[str, Any]:
    args = ["status", "--broker", redis_url, "--json", "--window-s", "0.2", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def test_cli_fleet_grade_matches_embedded_mode(
    workers: Any, redis_server: str, tmp_path: Path
) -> None:
    # Given a worker with the same item deadline as the embedded run
    workers.start(concurrency=2, item_timeout_s=ITEM_TIMEOUT_S)
    timeout = ["--item-timeout-s", str(ITEM_TIMEOUT_S)]
    fleet_out, local_out = tmp_path / "fleet.jsonl", tmp_path / "local.jsonl"
    # When the sample (hostile item included) is graded on the fleet and embedded
    on_fleet = ["--broker", redis_server, "--batch-size", "16", *timeout]
    fleet = CliRunner().invoke(
        cli, ["grade", str(SAMPLE), "-o", str(fleet_out), *on_fleet]
    )
    embedded = ["--no-cache", "--processes", "2", *timeout]
    local = CliRunner().invoke(
        cli,
        ["grade", str(SAMPLE), "-o", str(local_out), *embedded],
        env={"GRADEFLEET_BROKER_URL": ""},
    )
    # Then both succeed and the files are identical but for `cached`
    assert fleet.exit_code == 0, fleet.output
    assert local.exit_code == 0, local.output
    fleet_rows, local_rows = _read_jsonl(fleet_out), _read_jsonl(local_out)
    assert len(fleet_rows) == len(SAMPLE.read_text("utf-8").splitlines())
    assert _without_cached(fleet_rows) == _without_cached(local_rows)
    assert [r[LINE_FIELD] for r in fleet_rows] == list(range(1, len(fleet_rows) + 1))
    assert "rollouts graded  197" in fleet.stderr


def test_cli_status_shows_queue_depth_and_live_workers(
    workers: Any, redis_server: str, wait_until: Any
) -> None:
    # Given no worker consuming
    before = _status(redis_server)
    assert before["workers"] == [], "a worker from another test is still running"
    assert [
        (lane["lane"], lane["kind"], lane["queue"]) for lane in before["lanes"]
    ] == [
        ("interactive", "math", "gradefleet"),
        ("interactive", "code", "gradefleet.code"),
        ("bulk", "math", "gradefleet.bulk"),
        ("bulk", "code", "gradefleet.code.bulk"),
    ]
    # When a job of 5 batches is submitted
    with GradingClient(redis_server, batch_size=2) as client:
        rollouts = [{"response": f"\\boxed{{{n}}}", "gold": str(n)} for n in range(10)]
        job = client.submit(rollouts, deadline_s=120)
        # Then status counts them as ready in the interactive lane (the client's
        # default) and lists the job there
        queued = _status(redis_server)
        assert queued["ready"] == before["ready"] + 5
        assert queued["lanes"][0]["ready"] == before["lanes"][0]["ready"] + 5
        (listed,) = [j for j in queued["jobs"] if j["job_id"] == job.job_id]
        assert (listed["lane"], listed["total"], listed["done"]) == (
            "interactive",
            10,
            0,
        )
        assert listed["in_flight"] == 5
        # And once a worker runs, it is listed live and the queue drains
        port = free_port()
        env = {"GRADEFLEET_METRICS_PORT": str(port)}
        workers.start(concurrency=1, item_timeout_s=ITEM_TIMEOUT_S, extra_env=env)
        verdicts = job.results()
    assert [v.correct for v in verdicts] == [True] * 10
    drained = wait_until(
        lambda: (s := _status(redis_server))["ready"] == 0 and s,
        timeout_s=30,
        what="queue drained in status",
    )
    assert len(drained["workers"]) == 1
    assert job.job_id not in [j["job_id"] for j in drained["jobs"]]  # done: off
    assert drained["workers"][0]["batches_done"] >= 5
    assert drained["workers"][0]["concurrency"] == 1
    # (started without the fleet key, and it says so on the control bus, with the
    # kinds it takes: both, as this machine runs the code sandbox)
    assert drained["workers"][0]["keyed"] is False
    assert drained["workers"][0]["signing_key_id"] is None
    assert drained["workers"][0]["kinds"] == ["math", "code"]
    # And with the worker's metrics endpoint, rollouts by status are shown
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    with_metrics = _status(redis_server, "--metrics", metrics_url)
    assert with_metrics["metrics_errors"] == []
    assert with_metrics["graded_by_status"]["correct"] >= 10
    assert with_metrics["rollouts_per_s"] is not None
    table = CliRunner().invoke(
        cli, ["status", "--broker", redis_server, "--metrics", metrics_url]
    )
    assert table.exit_code == 0, table.output
    assert "workers      1 live, 0 keyed" in table.stdout
    assert "batches done, NOT keyed" in table.stdout
    assert "gradefleet: 0 ready" in table.stdout
    assert "rollouts: correct" in table.stdout


def test_cli_grade_deadline_without_workers_writes_timeouts_and_exits_6(
    redis_server: str, tmp_path: Path
) -> None:
    # Given a reachable broker but no worker to consume
    assert _status(redis_server)["workers"] == [], "a worker is still running"
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"response": "\\\\boxed{1}", "gold": "1"}\n\n'
        '{"response": ["\\\\boxed{2}", "\\\\boxed{3}"], "gold": "2"}\n'
    )
    out = tmp_path / "out.jsonl"
    # When grading with a 3 s deadline
    args = ["grade", str(source), "-o", str(out), "--broker", redis_server]
    result = CliRunner().invoke(cli, [*args, "--deadline-s", "3"])
    # Then a warning says within seconds that nobody is working
    assert "no live worker answers" in result.stderr
    # and it exits 6 naming the input lines, having written every row as timeout
    assert result.exit_code == 6, result.output
    assert "did not arrive by the deadline" in result.stderr
    assert "input lines 1, 3" in result.stderr
    rows = _read_jsonl(out)
    assert [(r[LINE_FIELD], r.get("sample_idx")) for r in rows] == [
        (1, None),
        (3, 0),
        (3, 1),
    ]
    assert {r["status"] for r in rows} == {"timeout"}
    assert [p.name for p in tmp_path.iterdir()] == ["in.jsonl", "out.jsonl"]


def test_cli_fleet_grade_lone_surrogate_is_escaped_and_every_line_kept(
    workers: Any, redis_server: str, tmp_path: Path
) -> None:
    # Given the line of issue 13 (a lone surrogate escaped in the input JSON)
    workers.start(concurrency=1, item_timeout_s=ITEM_TIMEOUT_S)
    source = tmp_path / "in.jsonl"
    good = '{"response":"\\\\boxed{1}","gold":"1"}\n'
    bad = '{"response":"so \\\\boxed{\\ud800}","gold":"1"}\n'
    source.write_text(good + bad + good, encoding="ascii")
    out = tmp_path / "out.jsonl"
    # When graded on the fleet
    result = CliRunner().invoke(
        cli, ["grade", str(source), "-o", str(out), "--broker", redis_server]
    )
    # Then every line is written, the surrogate kept as its JSON escape
    assert result.exit_code == 0, result.output
    graded = _read_jsonl(out)
    assert [g[LINE_FIELD] for g in graded] == [1, 2, 3]
    assert graded[1]["response"] == "so \\boxed{\ud800}"
    assert [g["correct"] for g in graded] == [True, False, True]


def test_cli_fleet_grade_of_several_chunks_keeps_every_row_in_order(
    workers: Any, redis_server: str, tmp_path: Path
) -> None:
    # Given 13,000 lines (chunks of 2,048 and 6,144 rows, then the last 4,808 cut
    # into 2,760 and 2,048: two graded at once), malformed lines in the first chunk
    # and in both pieces of the last, and two workers
    workers.start(concurrency=2, item_timeout_s=ITEM_TIMEOUT_S)
    lines = [
        json.dumps({"response": f"so \\boxed{{{n % 7}}}", "gold": str(n % 3)})
        for n in range(13_000)
    ]
    lines[10] = "not json"
    lines[9_000] = "not json either"
    lines[12_990] = '{"gold": "1"}'
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["grade", str(source), "-o", str(out), "--broker", redis_server]
    # When graded on the fleet
    first = CliRunner().invoke(cli, args)
    # Then every good line is written once, in input order, with its own verdict,
    # and the three bad lines are reported (exit 3)
    assert first.exit_code == 3, first.output
    assert "line 11:" in first.stderr
    assert "line 9001:" in first.stderr
    assert "line 12991:" in first.stderr
    rows = _read_jsonl(out)
    good = [n for n in range(13_000) if n not in (10, 9_000, 12_990)]
    assert [r[LINE_FIELD] for r in rows] == [n + 1 for n in good]
    assert [r["correct"] for r in rows] == [n % 7 == n % 3 for n in good]
    # When three verdicts are made transient and the file is graded with --resume
    for at in (100, 5_000, 12_000):
        rows[at]["status"] = "timeout"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = CliRunner().invoke(cli, [*args, "--resume"])
    # Then only those are graded again, and the output is as before
    assert again.exit_code == 3, again.output
    assert re.search(rf"resumed from output +{len(good) - 3:,}\n", again.stderr)
    assert _without_cached(_read_jsonl(out)) == _without_cached(
        [dict(r, status="correct" if r["correct"] else "wrong") for r in rows]
    )


@pytest.mark.parametrize("signed", [False, True])
def test_cli_fleet_line_mode_writes_what_item_mode_writes(
    workers: Any,
    redis_server: str,
    tmp_path: Path,
    signed: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given every kind of line (samples, alternative golds, big numbers, floats,
    # NaN, lone surrogates, a BOM, blank, malformed and overlong lines, invalid
    # UTF-8), two workers and, signed, a fleet key on both sides
    env = {"GRADEFLEET_SIGNING_KEY": "k1:" + "cd" * 32} if signed else {}
    workers.start(concurrency=2, item_timeout_s=ITEM_TIMEOUT_S, extra_env=env)
    source = tmp_path / "in.jsonl"
    source.write_bytes(mixed_lines())
    base = ["--broker", redis_server, "--item-timeout-s", str(ITEM_TIMEOUT_S)]
    runs = {}
    units: list[int] = []  # units each run submitted (the real method, counted)
    submit_units = GradingClient.submit_units

    def counted(client: GradingClient, payloads: Any, *a: Any, **kw: Any) -> Any:
        units.append(len(payloads))
        return submit_units(client, payloads, *a, **kw)

    monkeypatch.setattr(GradingClient, "submit_units", counted)
    # When it is graded in line mode (units of 7 lines: a line's samples and
    # the lines around it meet across units), then in item mode (--resume of a
    # new output reads rows)
    for mode, extra in (("lines", ["--batch-size", "7"]), ("items", ["--resume"])):
        out = tmp_path / f"{mode}.jsonl"
        args = ["grade", str(source), "-o", str(out), *base, *extra]
        result = CliRunner().invoke(cli, args, env=env)
        runs[mode] = (result, out.read_bytes())
        if mode == "lines":  # 167 lines, in units of at most 7: line mode it was
            assert sum(units) >= 167 // 7
            units.clear()
    assert units == []  # and item mode sent rows
    # Then both report the same six bad lines (exit 3) and write the same rows
    (lines, lines_out), (items, items_out) = runs["lines"], runs["items"]
    assert lines.exit_code == items.exit_code == 3, lines.output
    assert (
        lines.stderr.split("rollouts graded")[0]
        == items.stderr.split("rollouts graded")[0]
    )
    assert "rollouts graded  161" in lines.stderr
    assert len(lines_out.splitlines()) == 161
    # (the cache answers the second run: only `cached` may differ)
    as_rows = [_read_bytes(out) for out in (lines_out, items_out)]
    assert _without_cached(as_rows[0]) == _without_cached(as_rows[1])
    # And the output lines kept beside the results were all read and deleted
    admin = redis.Redis.from_url(redis_server)
    assert list(admin.scan_iter(match="gradefleet:v1:lines:*")) == []


def _read_bytes(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines()]


def test_job_board_counts_the_rollouts_of_a_job_of_line_units(
    start_redis_server: Any,
) -> None:
    # Given a job of two units of lines (3 and 5 lines) and no worker, on a
    # Redis of its own (its queued batches stay behind)
    url = start_redis_server()
    payloads = [
        fleet_unit_payload(*line_unit(lines, FieldSpec(), GradeOptions()))
        for lines in (
            [(n, b'{"response": "1", "gold": "1"}\n') for n in range(1, 4)],
            [(n, b'{"response": "2", "gold": "1"}\n') for n in range(4, 9)],
        )
    ]
    with GradingClient(url) as client:
        job = client.submit_units(payloads, [3, 5])
        # Then `gradefleet status` shows its rollouts, not its two results
        entries = read_job_board(redis.Redis.from_url(url))
        assert [(e.job_id, e.total, e.done) for e in entries] == [(job.job_id, 8, 0)]
        assert (job.total, job.rollouts) == (2, 8)


def test_fleet_line_units_through_the_client_count_rollouts(
    workers: Any, redis_server: str
) -> None:
    # Given a worker, and a client with metrics
    workers.start(concurrency=1, item_timeout_s=ITEM_TIMEOUT_S)
    metrics = ProducerMetrics()
    units = [
        [(n, b'{"response": "\\\\boxed{1}", "gold": "1"}\n') for n in range(1, 4)],
        [(n, b'{"response": "\\\\boxed{2}", "gold": "1"}\n') for n in range(4, 9)],
    ]
    payloads = [
        fleet_unit_payload(*line_unit(lines, FieldSpec(), GradeOptions()))
        for lines in units
    ]
    # When two units of 3 and 5 lines are graded through the client
    with GradingClient(redis_server, metrics=metrics) as client:
        results = dict(client.submit_units(payloads, [3, 5]).as_completed(60.0))
    # Then each comes back with its output lines, in order, and the counters
    # count rollouts, not units
    rows = {
        i: [json.loads(line) for line in r["out"].splitlines()]
        for i, r in results.items()
    }
    assert [[r[LINE_FIELD] for r in rows[i]] for i in (0, 1)] == [
        [1, 2, 3],
        [4, 5, 6, 7, 8],
    ]
    assert [r["correct"] for r in rows[0] + rows[1]] == [True] * 3 + [False] * 5
    samples = {
        name: metrics.registry.get_sample_value(f"gradefleet_producer_{name}_total")
        for name in ("rollouts_submitted", "results_received")
    }
    assert samples == {"rollouts_submitted": 8.0, "results_received": 8.0}


def test_cli_fleet_line_units_skip_the_answer_cache_item_batches_use_it(
    workers: Any, redis_server: str, tmp_path: Path
) -> None:
    # Given a worker with the result cache in the broker's Redis (the default)
    workers.start(concurrency=1, item_timeout_s=ITEM_TIMEOUT_S)
    admin = redis.Redis.from_url(redis_server)
    base = ["--broker", redis_server, "--item-timeout-s", str(ITEM_TIMEOUT_S)]

    def grade(name: str, *extra: str) -> list[dict[str, Any]]:
        out = tmp_path / f"{name}.jsonl"
        args = ["grade", str(SAMPLE), "-o", str(out), *base, *extra]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        return _read_jsonl(out)

    def cached_answers() -> int:
        return len(list(admin.scan_iter(match="gradefleet:v1:result:*")))

    for key in admin.scan_iter(match="gradefleet:v1:result:*"):  # earlier tests'
        admin.delete(key)
    # When the file is graded twice in line mode
    first, second = grade("lines1"), grade("lines2")
    # Then the units neither stored answers nor found any
    assert cached_answers() == 0
    assert not any(row["cached"] for row in first + second)
    # When it is graded twice as items (--resume of new outputs reads rows)
    items1, items2 = grade("items1", "--resume"), grade("items2", "--resume")
    # Then the batches stored their answers and the second run found them, with
    # the verdicts of line mode
    assert cached_answers() > 0
    assert any(row["cached"] for row in items2)
    assert _without_cached(items1) == _without_cached(items2) == _without_cached(first)


def _unit_line(line_no: int, response: str, gold: str) -> tuple[int, bytes]:
    return line_no, json.dumps({"response": response, "gold": gold}).encode() + b"\n"


def _unit(lines: list[tuple[int, bytes]]) -> bytes:
    return fleet_unit_payload(*line_unit(lines, FieldSpec(), GradeOptions()))


def test_fleet_line_unit_with_hang_items_saves_its_verdicts_and_counts_once(
    make_workers: Any, redis_server: str, tmp_path: Path, wait_until: Any
) -> None:
    # Given a worker (1 s item deadline) with metrics, and a unit of 40 lines whose
    # 4th and 31st rollouts hang
    _worker, port = metered_worker(make_workers, redis_server, tmp_path, concurrency=1)
    admin = redis.Redis.from_url(redis_server)
    gold = str(random.randrange(10**12, 10**13))  # no cached answer for the hangs
    lines = [_unit_line(n + 1, f"saves \\boxed{{{n}}}", str(n)) for n in range(40)]
    for k in (3, 30):
        lines[k] = _unit_line(k + 1, f"\\boxed{{{HANG} saves {k}}}", gold)
    with GradingClient(redis_server, deadline_s=60) as client:
        job = client.submit_units([_unit(lines)], [40])
        # When the unit is graded whole, Then the verdicts up to the first hang are
        # saved once it is answered (the unit goes again without it, its chunk
        # ending there): a worker lost now costs the re-delivery no second wait on
        # it, while the second hang still runs to its deadline
        key = partial_key(f"{job.job_id}.0")
        wait_until(lambda: admin.hexists(key, "3"), timeout_s=30, what="saved hang")
        saved = admin.hgetall(key)
        [(_unit_index, result)] = list(job.as_completed(60.0))
    assert {int(index) for index in saved} >= set(range(4))
    assert json.loads(saved[b"3"])["status"] == "timeout"
    rows = [json.loads(line) for line in result["out"].splitlines()]
    assert [row["status"] for row in rows].count("timeout") == 2
    assert [rows[3]["status"], rows[30]["status"]] == ["timeout", "timeout"]
    # And the worker counted each rollout once and both hangs' restarts
    assert counter_total(port, "gradefleet_rollouts_graded_total") == 40
    restarts = counter_total(
        port, "gradefleet_sandbox_restarts_total", reason="timeout"
    )
    assert restarts == 2
    # And once the result is stored, the saved verdicts are dropped
    wait_until(lambda: not admin.exists(key), timeout_s=10, what="drop")


def test_fleet_redelivered_line_unit_answers_saved_verdicts_ungraded(
    workers: Any, redis_server: str, wait_until: Any
) -> None:
    # Given a unit of two lines whose first rollout an earlier delivery graded and
    # saved before it died
    workers.start(concurrency=1, item_timeout_s=ITEM_TIMEOUT_S)
    admin = redis.Redis.from_url(redis_server)
    batch_id = f"unit-{uuid.uuid4().hex}.0"
    saved = save_first_verdict(admin, batch_id)
    lines = [_unit_line(1, "\\boxed{7}", "3"), _unit_line(2, "\\boxed{4}", "5")]
    # When it is delivered again
    publish_batch(redis_server, batch_id, [(0, "", "")], unit=_unit(lines))
    raw = wait_until(
        lambda: (
            admin.get(task_meta_key(batch_id))
            if b"SUCCESS" in (admin.get(task_meta_key(batch_id)) or b"")
            else None
        ),
        timeout_s=30,
        what="the unit's result",
    )
    lines_meta = read_task_meta(raw).lines
    assert lines_meta is not None
    out = admin.get(lines_meta["out_key"])
    assert out is not None
    rows = [json.loads(line) for line in out.splitlines()]
    # Then its first line carries the saved verdict (not graded again: graded, it
    # is wrong), and the second is graded
    assert (rows[0]["correct"], rows[0]["reason"]) == (True, saved.reason)
    assert (rows[1]["correct"], rows[1]["status"]) == (False, "wrong")
    assert lines_meta["totals"]["correct"] == 1


def test_fleet_line_unit_past_the_batch_backstop_keeps_what_it_graded(
    workers: Any, redis_server: str
) -> None:
    # Given a worker sized for 1-item batches (soft limit ~12 s at a 1 s deadline),
    # and a unit of 16 usual lines then 16 whose rollouts hang
    workers.start(item_timeout_s=1.0, extra_env={"GRADEFLEET_MAX_BATCH_SIZE": "1"})
    lines = [_unit_line(n + 1, f"so \\boxed{{{n}}}", str(n % 5)) for n in range(16)]
    lines += [_unit_line(n + 1, f"\\boxed{{{HANG} {n}}}", "1") for n in range(16, 32)]
    # When the unit runs into the backstop
    with GradingClient(redis_server, deadline_s=90) as client:
        job = client.submit_units([_unit(lines)], [32])
        [(_unit_index, result)] = list(job.as_completed(90.0))
    rows = [json.loads(line) for line in result["out"].splitlines()]
    # Then the usual lines keep the verdicts they were graded (kept, with the first
    # hang's, after it), and every hang is `timeout`, the last ones stood in for
    for row in rows[:16]:
        want = verifier.grade(row["response"], row["gold"])
        assert (row["correct"], row["status"]) == (want.correct, want.status.value)
    assert [row["status"] for row in rows[16:]] == ["timeout"] * 16
    assert rows[-1]["reason"] == "batch time limit reached before this item"
    assert rows[16]["reason"] != rows[-1]["reason"]  # its deadline, not the backstop
