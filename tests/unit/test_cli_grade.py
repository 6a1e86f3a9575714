"""`gradefleet grade` in embedded mode, end to end through the real LocalPool."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from producer.cli import cli
from producer.errors import MalformedInputError
from workers.lines.records import LINE_FIELD, VERDICT_FIELDS
from workers.models import GradeOptions
from workers.verifier import grade

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample.jsonl"
# Generous: the test machine is shared; no real rollout should come near it.
ITEM_TIMEOUT = ["--item-timeout-s", "30", "--processes", "2"]


def _real_rollouts(n: int) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in SAMPLE.read_text("utf-8").splitlines()]
    real = [r for r in records if not r["id"].startswith("hostile")]
    assert len(real) >= n
    return real[:n]


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def _run(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["grade", *args], input=stdin)


def _without_cached(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "cached"} for r in records]


def test_cli_grade_embedded_matches_in_process_grade(tmp_path: Path) -> None:
    # Given 100 real rollouts
    rollouts = _real_rollouts(100)
    source = _write_jsonl(tmp_path / "in.jsonl", rollouts)
    out = tmp_path / "out.jsonl"
    # When graded by the CLI in embedded mode (real processes, no cache)
    result = _run(str(source), "-o", str(out), "--no-cache", *ITEM_TIMEOUT)
    # Then every line comes back, in order, with the in-process verdict
    assert result.exit_code == 0, result.output
    graded = _read_jsonl(out)
    assert [g["id"] for g in graded] == [r["id"] for r in rollouts]
    assert [g[LINE_FIELD] for g in graded] == list(range(1, 101))
    for rollout, line in zip(rollouts, graded, strict=True):
        expected = grade(rollout["response"], rollout["gold"], options=GradeOptions())
        want = {k: v for k, v in expected.to_dict().items() if k in VERDICT_FIELDS}
        assert {k: line[k] for k in VERDICT_FIELDS} == want, rollout["id"]
        assert {k: line[k] for k in rollout} == rollout  # input fields kept
        assert line["cached"] is False


def test_cli_grade_warm_cache_and_no_cache_give_identical_output(
    tmp_path: Path,
) -> None:
    # Given 40 real rollouts, each response twice (GRPO-like duplicates)
    rollouts = _real_rollouts(20)
    rollouts = rollouts + [dict(r, id=r["id"] + "-dup") for r in rollouts]
    source = _write_jsonl(tmp_path / "in.jsonl", rollouts)
    cache = ["--cache-dir", str(tmp_path / "cache")]
    # When graded with no cache, a cold cache and a warm cache
    runs = {}
    for name, extra in (("off", ["--no-cache"]), ("cold", cache), ("warm", cache)):
        out = tmp_path / f"{name}.jsonl"
        result = _run(str(source), "-o", str(out), *extra, *ITEM_TIMEOUT)
        assert result.exit_code == 0, result.output
        runs[name] = (_read_jsonl(out), result.stderr)
    # Then the outputs are identical except `cached`, and the warm run hits
    assert _without_cached(runs["off"][0]) == _without_cached(runs["cold"][0])
    assert _without_cached(runs["cold"][0]) == _without_cached(runs["warm"][0])
    assert not any(r["cached"] for r in runs["off"][0])
    assert sum(r["cached"] for r in runs["warm"][0]) > len(rollouts) // 2
    assert "cache hit rate   0.0%" not in runs["warm"][1]


LINES = [
    '{"id": 1, "response": "so \\\\boxed{4}", "gold": "4"}',
    '{"id": 2, "completion": "A: 7", "answer": "7"}',
    '{"id": 3, "response": "\\\\boxed{1}", "gold": ',  # bad JSON
    '{"id": 4, "solution_str": "\\\\boxed{3}", "reward_model": {"ground_truth": "5"}}',
    '{"id": 5, "response": "\\\\boxed{2}"}',  # no gold
    "",  # blank: skipped silently
    '["not", "an", "object"]',
    '{"id": 8, "output": "I do not know.", "gold": "12"}',
]


def test_cli_grade_malformed_lines_reported_and_others_graded(tmp_path: Path) -> None:
    # Given a file with malformed lines 3, 5 and 7 among good ones
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    # When graded
    result = _run(str(source), "-o", str(out), "--no-cache", *ITEM_TIMEOUT)
    # Then the exit code says so, each bad line is named, the rest is graded in order
    assert result.exit_code == MalformedInputError.exit_code, result.output
    err = result.stderr
    assert f"{source}: line 3: invalid JSON" in err
    assert f"{source}: line 5: no gold field" in err
    assert f"{source}: line 7: expected a JSON object, got list" in err
    assert "line 6" not in err
    assert "3 malformed input line(s) left out; the other 4 were graded" in err
    graded = _read_jsonl(out)
    assert [g["id"] for g in graded] == [1, 2, 4, 8]
    assert [g[LINE_FIELD] for g in graded] == [1, 2, 4, 8]
    assert [g["status"] for g in graded] == ["correct", "correct", "wrong", "no_answer"]
    assert graded[2]["reward_model"] == {"ground_truth": "5"}  # original fields kept
    assert all(set(VERDICT_FIELDS) <= set(g) for g in graded)


def test_cli_grade_summary_table(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    result = _run(
        str(source), "-o", str(tmp_path / "o.jsonl"), "--no-cache", *ITEM_TIMEOUT
    )
    rows = dict(
        line.strip().rsplit("  ", 1)
        for line in result.stderr.splitlines()
        if "  " in line.strip()
    )
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["rollouts graded"] == "4"
    assert rows["accuracy"] == "50.0%"
    assert rows["correct"] == "50.0%"
    assert rows["wrong"] == "25.0%"
    assert rows["no_answer"] == "25.0%"
    assert rows["timeout"] == "0.0%"
    assert rows["input errors"] == "3"
    assert rows["cache hit rate"] == "0.0%"
    assert rows["throughput"].endswith("rollouts/s")
    assert rows["wall time"].endswith(" s")


def test_cli_grade_stdin_to_stdout_and_quiet(tmp_path: Path) -> None:
    text = LINES[0] + "\n" + LINES[1] + "\n"
    result = _run("-", "-o", "-", "--quiet", "--no-cache", *ITEM_TIMEOUT, stdin=text)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["id"], r["correct"]) for r in lines] == [(1, True), (2, True)]
    assert result.stderr == ""  # --quiet: no summary


def test_cli_grade_no_fallback_changes_verdicts(tmp_path: Path) -> None:
    # "The answer is 4" has no explicit marker: correct only when fallback is allowed.
    source = _write_jsonl(
        tmp_path / "in.jsonl", [{"response": "2+2 makes 4", "gold": "4"}]
    )
    out = tmp_path / "o.jsonl"
    loose = _run(str(source), "-o", str(out), "--no-cache", "-q", *ITEM_TIMEOUT)
    assert loose.exit_code == 0, loose.output
    loose_line = _read_jsonl(out)[0]
    strict = _run(
        str(source), "-o", str(out), "--no-cache", "-q", "--no-fallback", *ITEM_TIMEOUT
    )
    assert strict.exit_code == 0, strict.output
    strict_line = _read_jsonl(out)[0]
    assert loose_line["format_valid"] is strict_line["format_valid"] is False
    want = grade("2+2 makes 4", "4", options=GradeOptions(allow_fallback=False))
    assert strict_line["status"] == want.status.value
    assert strict_line["correct"] is False


@pytest.mark.parametrize("empty", ["", "\n\n"], ids=["empty", "blank-lines"])
def test_cli_grade_empty_input_writes_empty_output(tmp_path: Path, empty: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(empty)
    out = tmp_path / "o.jsonl"
    result = _run(str(source), "-o", str(out), "--no-cache", *ITEM_TIMEOUT)
    assert result.exit_code == 0, result.output
    assert out.read_text() == ""
    assert "rollouts graded  0" in result.stderr


def test_cli_grade_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    # Given stderr attached to a pseudo-terminal
    source = _write_jsonl(tmp_path / "in.jsonl", _real_rollouts(3))
    args = ["grade", str(source), "-o", str(tmp_path / "o.jsonl"), "--no-cache"]
    code = "import sys; from producer.cli import main; main(sys.argv[1:])"
    master, slave = os.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args, *ITEM_TIMEOUT],
            stderr=slave,
            stdout=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's writer is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
    # Then the bar is drawn with its position, then the summary
    terminal = b"".join(chunks).decode()
    assert proc.returncode == 0, terminal
    assert "grading" in terminal
    assert "3/3" in terminal
    assert "rollouts graded  3" in terminal


def test_cli_grade_many_malformed_lines_are_summarised(tmp_path: Path) -> None:
    # Given 25 malformed lines and one good one
    source = tmp_path / "in.jsonl"
    source.write_text("{oops\n" * 25 + LINES[0] + "\n", encoding="utf-8")
    result = _run(str(source), "-o", str(tmp_path / "o.jsonl"), "--no-cache", "-q")
    # Then the first 20 are listed, the rest counted, and the good line graded
    assert result.exit_code == MalformedInputError.exit_code
    assert result.stderr.count(": invalid JSON") == 20
    assert "... and 5 more malformed lines" in result.stderr
    assert len(_read_jsonl(tmp_path / "o.jsonl")) == 1


# The line of issue 13, byte for byte: a lone surrogate escaped in the input JSON.
SURROGATE_LINE = '{"response":"so \\\\boxed{\\ud800}","gold":"1"}\n'


@pytest.mark.parametrize("cache", ["--no-cache", "--cache-dir"])
def test_cli_grade_lone_surrogate_is_escaped_and_every_line_kept(
    tmp_path: Path, cache: str
) -> None:
    # Given the line between two ordinary ones
    source = tmp_path / "in.jsonl"
    good = '{"response":"\\\\boxed{1}","gold":"1"}\n'
    source.write_text(good + SURROGATE_LINE + good, encoding="ascii")
    out = tmp_path / "out.jsonl"
    extra = [cache] if cache == "--no-cache" else [cache, str(tmp_path / "c")]
    # When graded in embedded mode (to a file, and to stdout)
    result = _run(str(source), "-o", str(out), *extra, *ITEM_TIMEOUT)
    to_stdout = _run(str(source), "-o", "-", "-q", *extra, *ITEM_TIMEOUT)
    # Then every line is written, the surrogate kept as its JSON escape
    assert result.exit_code == 0, result.output
    graded = _read_jsonl(out)
    assert [g[LINE_FIELD] for g in graded] == [1, 2, 3]
    assert graded[1]["response"] == "so \\boxed{\ud800}"
    assert [g["correct"] for g in graded] == [True, False, True]
    assert "\\ud800" in out.read_text("utf-8")
    assert to_stdout.exit_code == 0, to_stdout.output
    again = [json.loads(x) for x in to_stdout.stdout.splitlines()]
    assert _without_cached(again) == _without_cached(graded)


def test_cli_grade_freezes_its_heap_once_the_pool_is_warm(tmp_path: Path) -> None:
    # Given a file graded in this process by the CLI's embedded pool
    source = _write_jsonl(tmp_path / "in.jsonl", _real_rollouts(20))
    gc.unfreeze()
    try:
        result = _run(str(source), "-o", str(tmp_path / "o.jsonl"), "--no-cache")
        # Then its long-lived objects (SymPy's among them, imported by the pool's
        # warm-up) are out of the collector's reach
        assert result.exit_code == 0, result.output
        assert "sympy" in sys.modules
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
