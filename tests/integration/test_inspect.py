"""The Inspect scorer for real: `inspect eval` of a small task with a replay model,
then `inspect score` re-scoring that log through the `gradefleet` entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from producer.client.fleet import GradingClient
from tests.serve_procs import REPO_ROOT, ServeProcess

pytestmark = pytest.mark.integration

# Inspect's CLI entry point (`inspect = inspect_ai._cli.main:main`), run after
# importing the replay model so `--model gradefleet_replay/...` resolves; the
# scorer itself is found by Inspect (task file, or the `gradefleet` entry point).
_INSPECT = (
    "import tests.inspect_task.replay_model; "
    "from inspect_ai._cli.main import main; main()"
)


def _inspect(args: list[str], url: str, tmp_path: Path) -> None:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "GRADEFLEET_URL": url}
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


def _only_score(sample: Any) -> Any:
    (score,) = sample.scores.values()  # the task has one scorer: ours
    return score


def test_inspect_eval_then_score_with_our_scorer(
    service: ServeProcess, redis_server: str, tmp_path: Path
) -> None:
    from inspect_ai.log import read_eval_log

    from tests.inspect_task.replay_model import QUESTIONLESS, records

    log_dir = tmp_path / "logs"
    _inspect(
        [
            "eval",
            "tests/inspect_task/replay_task.py",
            "--model",
            "gradefleet_replay/qwen",
            "--log-dir",
            str(log_dir),
        ],
        service.url,
        tmp_path,
    )
    (log_path,) = log_dir.glob("*.eval")
    log = read_eval_log(str(log_path))
    assert log.status == "success"
    assert log.samples is not None
    by_input = {s.input: s for s in log.samples}

    rows = records()
    with GradingClient(redis_server) as client:
        expected = client.grade(
            [{"response": r["code"][0], "gold": r["gt"]} for r in rows]
        )
    for row, verdict in zip(rows, expected, strict=True):
        score = _only_score(by_input[row["question"]])
        assert score.value == ("C" if verdict.correct else "I")
        assert score.answer == verdict.extracted
        assert score.metadata["math_scorer_status"] == verdict.status.value
        assert score.explanation.startswith(verdict.status.value)
    unscored = _only_score(by_input[QUESTIONLESS])
    assert unscored.metadata["gradefleet_status"] == "invalid_gold"
    assert unscored.unscored

    rescored_path = tmp_path / "rescored.eval"
    _inspect(
        [
            "score",
            str(log_path),
            "--scorer",
            "gradefleet/math_verdict",
            "--action",
            "overwrite",
            "--output-file",
            str(rescored_path),
        ],
        service.url,
        tmp_path,
    )
    rescored = read_eval_log(str(rescored_path))
    assert rescored.samples is not None
    for sample in rescored.samples:
        before = _only_score(by_input[sample.input])
        after = _only_score(sample)
        assert (after.value, after.answer) == (before.value, before.answer)
    assert rescored.results is not None
    assert rescored.results.scores[0].scorer.endswith("math_verdict")
