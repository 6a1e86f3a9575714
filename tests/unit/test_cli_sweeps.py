"""The CLI for long sweeps: samples per line end to end, Parquet out, --report,
--resume, stop signals, closed pipes, usage errors, --version, numeric golds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from producer.cli import cli
from producer.client.fleet import validate_rollouts
from producer.errors import InvalidRolloutError
from producer.files.formats import iter_records
from tests.helpers import QWEN_FILE as QWEN
from workers import __version__
from workers.models import Status
from workers.verifier import grade

EMBEDDED = ["--no-cache", "--processes", "2", "--item-timeout-s", "30"]
MAIN = "import sys; from producer.cli import main; main(sys.argv[1:])"


def _grade(*args: str) -> Result:
    return CliRunner().invoke(cli, ["grade", *args])


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _samples_file(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "in.jsonl",
        [
            {"uid": "p1", "responses": ["\\boxed{4}", "\\boxed{5}", "x"], "gt": 4},
            {"uid": "p2", "code": ["\\boxed{0.5}"], "gold": ["1/3", "1/2"]},
        ],
    )


def test_cli_grade_expands_samples_and_accepts_any_listed_gold(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    report = tmp_path / "report.json"
    source = _samples_file(tmp_path)
    result = _grade(str(source), "-o", str(out), "--report", str(report), *EMBEDDED)
    assert result.exit_code == 0, result.output
    rows = _read(out)
    assert [(r["uid"], r["sample_idx"], r["correct"]) for r in rows] == [
        ("p1", 0, True),
        ("p1", 1, False),
        ("p1", 2, False),
        ("p2", 0, True),  # 0.5 matches the second acceptable gold
    ]
    assert rows[3]["gold"] == ["1/3", "1/2"]  # the input object is kept
    assert rows[1]["canonical_pred"] == "5"
    summary = json.loads(report.read_text())
    assert summary["overall"]["n"] == 4
    assert summary["overall"]["prompts"] == 2
    assert summary["overall"]["pass_at"]["1"] == pytest.approx((1 / 3 + 1) / 2)


def test_cli_grade_parquet_out_then_report_and_diff_read_it(tmp_path: Path):
    source = _samples_file(tmp_path)
    out = tmp_path / "out.parquet"
    assert _grade(str(source), "-o", str(out), *EMBEDDED).exit_code == 0
    assert out.read_bytes()[:4] == b"PAR1"
    rows = [r for _, r in iter_records(str(out))]  # type: ignore[misc]
    assert [r["sample_idx"] for r in rows] == [0, 1, 2, 0]
    again = tmp_path / "again.jsonl"
    assert _grade(str(out), "-o", str(again), *EMBEDDED).exit_code == 0  # re-score
    diff = CliRunner().invoke(cli, ["diff", str(out), str(again)])
    assert diff.exit_code == 0, diff.output
    assert "flipped: 0" in diff.output


def test_cli_grade_help_prints_the_alias_table():
    result = CliRunner().invoke(cli, ["grade", "--help"])
    assert "reward_model.ground_truth" in result.output
    assert "gt, target" in result.output
    assert "--response-field" in result.output


def test_cli_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_cli_broker_http_url_is_a_usage_error(tmp_path: Path):
    source = _samples_file(tmp_path)
    args = [str(source), "-o", str(tmp_path / "o"), "--broker", "http://h:8000"]
    result = _grade(*args)
    assert result.exit_code == 2
    assert "not a Redis URL" in result.output
    assert "Traceback" not in result.output


def test_cli_output_equal_to_input_is_refused(tmp_path: Path):
    source = _samples_file(tmp_path)
    before = source.read_text()
    result = _grade(str(source), "-o", str(tmp_path / "." / "in.jsonl"), *EMBEDDED)
    assert result.exit_code == 2
    assert "is the input file" in result.output
    assert source.read_text() == before


def test_cli_resume_keeps_final_verdicts_and_regrades_transient_ones(tmp_path: Path):
    source = _samples_file(tmp_path)
    out = tmp_path / "out.jsonl"
    assert _grade(str(source), "-o", str(out), *EMBEDDED).exit_code == 0
    rows = _read(out)
    # A deadline cut row 1 short; row 2 carries a mark that only reuse keeps.
    rows[1] |= {"status": "timeout", "correct": False, "reason": "cut"}
    rows[2] |= {"reason": "kept from the first run"}
    _write(out, rows)
    result = _grade(str(source), "-o", str(out), "--resume", *EMBEDDED)
    assert result.exit_code == 0, result.output
    assert "resumed from output  3" in result.stderr
    again = _read(out)
    assert again[1]["status"] == "wrong"
    assert again[2]["reason"] == "kept from the first run"


def _temp_files(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cli_stop_signal_leaves_no_temp_file_and_exits_128_plus_signal(
    tmp_path: Path, signum: int
):
    # Given a run long enough to be stopped midway: the Qwen file 40 times over
    # (32,000 rollouts, one process; 800 finished before the signal on a fast run)
    source = tmp_path / "many.jsonl"
    source.write_text(QWEN.read_text(encoding="utf-8") * 40, encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ["grade", str(source), "-o", str(out), "--no-cache", "--processes", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-c", MAIN, *args],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _temp_files(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _temp_files(tmp_path), "the run never opened its output"
        time.sleep(0.5)  # grading has started
        # When the signal arrives
        os.kill(proc.pid, signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # Then it exits 128 + signal, with no temp file, no output and no traceback
    assert proc.returncode == 128 + signum, stderr
    assert _temp_files(tmp_path) == []
    assert not out.exists()
    assert "Traceback" not in stderr
    assert signal.Signals(signum).name in stderr


@pytest.mark.parametrize("command", ["grade", "report"])
def test_cli_closed_pipe_exits_quietly(tmp_path: Path, command: str):
    # Given output much bigger than a pipe's buffer, read by `head -c 10`
    if command == "grade":
        args = f"grade {QWEN} -o - --no-cache --processes 2 -q"
    else:
        rows = [
            {"id": f"r{i}", "response": "r", "gold": "1", "correct": True}
            | {"status": "correct", "grader_version": "v"}
            for i in range(3000)
        ]
        args = f"report {_write(tmp_path / 'g.jsonl', rows)} --by id --json -"
    shell = f"{sys.executable} -c '{MAIN}' {args} | head -c 10"
    proc = subprocess.run(
        ["bash", "-c", f"{shell}; echo rc=${{PIPESTATUS[0]}} >&2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Then no traceback, no error line: just the bytes head took
    assert len(proc.stdout) == 10
    assert proc.stderr.strip() in {"rc=0", "rc=1"}, proc.stderr


GOLDS = [(5, "5"), (2.5, "2.5"), (Decimal("2.50"), "2.50"), (Fraction(1, 2), "1/2")]


@pytest.mark.parametrize(("gold", "text"), GOLDS, ids=str)
def test_verifier_grade_accepts_numeric_golds_as_exact_text(gold: object, text: str):
    assert grade(r"\boxed{5}", gold).to_dict() == grade(r"\boxed{5}", text).to_dict()  # type: ignore[arg-type]
    assert grade(r"\boxed{5}", 5).status is Status.CORRECT


@pytest.mark.parametrize("gold", [True, None, float("nan"), ["5"], {"a": 1}], ids=str)
def test_verifier_grade_rejects_other_gold_types_with_type_error(gold: object):
    with pytest.raises(TypeError, match="gold"):
        grade(r"\boxed{5}", gold)  # type: ignore[arg-type]


def test_client_accepts_numeric_golds_and_names_the_bad_field():
    assert validate_rollouts([{"response": "r", "gold": 5}]) == [(0, "r", "5")]
    assert validate_rollouts([{"response": "r", "gold": Fraction(3, 4)}]) == [
        (0, "r", "3/4")
    ]
    with pytest.raises(InvalidRolloutError, match=r"rollout 1: field 'gold'.*bool"):
        validate_rollouts(
            [{"response": "r", "gold": "1"}, {"response": "r", "gold": True}]
        )
    with pytest.raises(InvalidRolloutError, match=r"field 'response'.*int"):
        validate_rollouts([{"response": 3, "gold": "1"}])


def test_cli_embedded_deadline_writes_every_row_as_timeout_and_names_lines(
    tmp_path: Path,
):
    # Given a deadline too short for anything to be graded (embedded mode)
    out = tmp_path / "out.jsonl"
    args = [str(QWEN), "-o", str(out), "--deadline-s", "0.001", *EMBEDDED]
    result = _grade(*args)
    # Then every row is written, as timeout, and exit 6 names the input lines
    assert result.exit_code == 6, result.output
    assert "input lines 1-100" in result.stderr
    rows = _read(out)
    assert len(rows) == 800
    assert {r["status"] for r in rows} == {"timeout"}
    assert {r["reason"] for r in rows} == {
        "the --deadline-s passed before a result arrived"
    }
    # and --resume grades them afterwards
    again = _grade(str(QWEN), "-o", str(out), "--resume", *EMBEDDED)
    assert again.exit_code == 0, again.output
    assert "timeout" not in {r["status"] for r in _read(out)}


SWALLOWED = """
import signal
from producer.commands.signals import exit_on_signals

class Finalized:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)  # Python ignores what __del__ raises

with exit_on_signals():
    Finalized()
    print("block went on")
"""


def test_stop_signal_swallowed_by_python_still_stops_the_run():
    # Given a stop signal that lands where Python ignores exceptions (a finalizer,
    # as an at-fork callback does)
    proc = subprocess.run(
        [sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=60
    )
    # Then the block finishes, and the process still exits 128 + SIGTERM with its
    # one line and no "Exception ignored" traceback
    assert "block went on" in proc.stdout
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert proc.stderr == "gradefleet: stopped by SIGTERM\n"
