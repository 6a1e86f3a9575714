"""Inspect's unit-test scorer for real: `inspect eval` of a small code task with the
replay model (graded in an embedded pool, in gradefleet's sandbox, no Docker), then
`inspect score LOG --scorer gradefleet/unit_tests` re-scoring that log on a fleet (a
real redis-server and a real worker) through the `gradefleet` entry point.

These need the code sandbox (bubblewrap, root): without it they fail, never skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from producer.client.grader import open_grader
from tests.serve_procs import REPO_ROOT
from workers.code.item import encode_code_gold

pytestmark = pytest.mark.integration

_INSPECT = (
    "import tests.inspect_task.replay_model; "
    "from inspect_ai._cli.main import main; main()"
)
ITEM_TIMEOUT_S = 30.0


def _inspect(args: list[str], url: str, tmp_path: Path) -> str:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "GRADEFLEET_URL": url}
    env["GRADEFLEET_BROKER_URL"] = ""
    env["INSPECT_LOG_DIR"] = str(tmp_path / "logs")
    done = subprocess.run(
        [sys.executable, "-c", _INSPECT, *args, "--display", "plain"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _only_score(sample: Any) -> Any:
    (score,) = sample.scores.values()  # the task has one scorer: ours
    return score


def _check_scores(log: Any) -> dict[str, Any]:
    """Every sample scored as `code_samples` says, with answer, explanation and
    metadata filled in; returns the scores by sample id."""
    from tests.inspect_task.code_samples import code_samples

    assert log.samples is not None
    scores = {str(s.id): _only_score(s) for s in log.samples}
    expected = {s.sid: s for s in code_samples()}
    assert set(scores) == set(expected)
    for sid, sample in expected.items():
        score = scores[sid]
        meta = score.metadata
        if sample.expected is None:
            assert score.unscored, sid
            assert meta["gradefleet_status"] == "invalid_gold"
            continue
        assert score.value == sample.expected, (sid, score.explanation)
        assert meta["grader_version"].startswith("code-")
        assert meta["tests_total"] >= 1
        assert score.answer  # the program extracted from the reply
        if sample.expected == "C":
            assert meta["tests_passed"] == meta["tests_total"]
            assert meta["failure"] is None
            assert score.explanation == f"correct: {meta['tests_total']}/" + (
                f"{meta['tests_total']} tests passed"
            )
        else:
            assert meta["tests_passed"] < meta["tests_total"]
            assert "first failing test " in score.explanation, sid
    # The first failing test is named with its source (an assert) or its input.
    assert "assert add(1, 2) == 3" in scores["assert-wrong"].explanation
    assert "stdin '3\\n' expected '4\\n'" in scores["io-fake"].explanation
    assert "(exited)" in scores["mbpp-11-exit"].explanation
    # The answer is the extracted program, not the reply's prose.
    assert scores["assert-right"].answer.startswith("def add(a, b):")
    return scores


@pytest.fixture(autouse=True)
def _needs_the_sandbox() -> None:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is not installed"


def test_inspect_eval_with_unit_tests_then_inspect_score_on_a_fleet(
    start_redis_server: Callable[..., str],
    make_workers: Callable[[str], Any],
    tmp_path: Path,
) -> None:
    from inspect_ai.log import read_eval_log

    from tests.inspect_task.code_samples import code_samples

    # When the task runs with the scorer in it (embedded pool: no URL)
    log_dir = tmp_path / "logs"
    out = _inspect(
        [
            "eval",
            "tests/inspect_task/replay_code_task.py",
            "--model",
            "gradefleet_replay/code",
            "--log-dir",
            str(log_dir),
        ],
        "",
        tmp_path,
    )
    assert "unit_tests" in out
    (log_path,) = log_dir.glob("*.eval")
    log = read_eval_log(str(log_path))
    assert log.status == "success"
    before = _check_scores(log)

    # Then the verdicts are the engine's for the same (reply, tests) pairs
    from producer.adapters.inspect import code_tests_row

    graded = [s for s in code_samples() if s.expected is not None]
    pairs: list[dict[str, str]] = []
    for sample in graded:
        row = code_tests_row(sample.metadata, sample.target)
        assert row is not None
        pairs.append({"response": sample.reply, "gold": encode_code_gold(row)})
    with open_grader() as grader:
        verdicts = grader.grade(pairs)
    for sample, verdict in zip(graded, verdicts, strict=True):
        meta = before[sample.sid].metadata
        assert (meta["gradefleet_status"], meta["tests_passed"]) == (
            verdict.status.value,
            verdict.tests_passed,
        )
        assert meta["failure"] == verdict.failure

    # And `inspect score` re-scores the saved log with the entry point's scorer,
    # graded this time on a fleet, to the same scores
    broker = start_redis_server()
    make_workers(broker).start(concurrency=2, item_timeout_s=ITEM_TIMEOUT_S)
    rescored_path = tmp_path / "rescored.eval"
    _inspect(
        [
            "score",
            str(log_path),
            "--scorer",
            "gradefleet/unit_tests",
            "--action",
            "overwrite",
            "--output-file",
            str(rescored_path),
        ],
        broker,
        tmp_path,
    )
    rescored = read_eval_log(str(rescored_path))
    after = _check_scores(rescored)
    for sid, score in after.items():
        old = before[sid]
        assert (score.answer, score.explanation) == (old.answer, old.explanation)
        assert score.metadata == old.metadata
    assert rescored.results is not None
    assert rescored.results.scores[0].scorer.endswith("unit_tests")
