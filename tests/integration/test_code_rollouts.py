"""Code rollouts everywhere the math grader is (issue 39, section 6): one mixed file of
math and code rows graded by the embedded CLI (line mode and row mode) and by a fleet
(a real redis-server and a real worker) gives the same verdicts; math verdicts are
those of a math-only run; a re-grade takes code verdicts from the cache, but never a
load-dependent one (a timeout).

These need the code sandbox (bubblewrap, root): without it they fail, never skip.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from producer import ProducerSettings, Rollout, code_rollout, open_grader
from producer.cli import cli
from producer.errors import InvalidRolloutError
from tests.code_mixed import math_rows, mixed_rows, write_jsonl

pytestmark = pytest.mark.integration

ITEM_TIMEOUT_S = 30.0
EMBEDDED = ["--processes", "2", "--item-timeout-s", str(ITEM_TIMEOUT_S)]
NO_BROKER = {"GRADEFLEET_BROKER_URL": ""}


@pytest.fixture(autouse=True)
def _needs_the_sandbox() -> None:
    # A failure, not a skip: CI installs bubblewrap, and a code grader that cannot
    # sandbox answers `error` for every code row, which these tests would catch
    # late and obscurely.
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is not installed"


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def _without_cached(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "cached"} for r in records]


def _grade(src: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(
        cli, ["grade", str(src), "-o", str(out), *extra], env=env or NO_BROKER
    )
    assert result.exit_code == 0, result.output
    return result.stderr


def _by_id(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        found.setdefault(record["id"], []).append(record)
    return found


def _check_code_verdicts(records: list[dict[str, Any]]) -> None:
    """What the mixed file's code rows must get (see `tests.code_mixed`)."""
    rows = _by_id(records)
    code = [r for r in records if r.get("kind") == "code"]
    assert len(code) == len(records) - len(math_rows())
    assert all(r["grader_version"].startswith("code-") for r in code)
    assert not any(r["status"] == "error" for r in code), code
    (reference,) = rows["MbppEval/2-ref"]
    assert reference["correct"]
    assert reference["tests_passed"] == 3
    assert not any(r["correct"] for r in code if r["id"].endswith("-none"))
    for mbpp in ("mbpp-11", "mbpp-12", "mbpp-13"):  # pass@k: two samples, one right
        right, exits = rows[mbpp]
        assert (right["sample_idx"], exits["sample_idx"]) == (0, 1)
        assert right["correct"]
        assert not exits["correct"]
    assert rows["nemo-echo"][0]["correct"]
    hostile = [r for r in code if r["id"].startswith("hostile-")]
    assert len(hostile) == 3
    assert not any(r["correct"] for r in hostile)
    assert rows["hostile-sleep"][0]["failure"]["kind"] == "timeout"
    invalid = [r for r in code if r["id"].startswith("invalid-")]
    assert [r["status"] for r in invalid] == ["invalid_gold", "invalid_gold"]
    assert all(
        r["score"] == r["tests_passed"] / r["tests_total"]
        for r in code
        if r["tests_total"]
    )


def test_embedded_line_and_row_mode_agree_and_math_is_unchanged(tmp_path: Path) -> None:
    # Given a file of math and code rows, and its math rows alone
    mixed = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows())
    math = write_jsonl(tmp_path / "math.jsonl", math_rows())
    # When the embedded CLI grades it in line mode, in row mode (--resume), and the
    # math rows alone
    lines, rows, alone = (tmp_path / f"{n}.jsonl" for n in ("lines", "rows", "alone"))
    _grade(mixed, lines, "--no-cache", *EMBEDDED)
    _grade(mixed, rows, "--no-cache", "--resume", *EMBEDDED)
    _grade(math, alone, "--no-cache", *EMBEDDED)
    # Then both modes give the same verdicts, the code rows the expected ones
    graded = _read(lines)
    assert _without_cached(graded) == _without_cached(_read(rows))
    _check_code_verdicts(graded)
    # And a math row's verdict is what it gets without code around it (line numbers
    # aside), with no code field
    math_graded = [r for r in graded if r["id"].startswith("math-")]
    strip = lambda r: {k: v for k, v in r.items() if k != "gradefleet_line"}  # noqa: E731
    assert [strip(r) for r in math_graded] == [strip(r) for r in _read(alone)]
    assert not any("kind" in r for r in math_graded)


def test_regrade_takes_code_verdicts_from_the_cache_but_never_a_timeout(
    tmp_path: Path,
) -> None:
    # Given a mixed file graded once with the cache on
    mixed = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows())
    cache = ["--cache-dir", str(tmp_path / "cache"), *EMBEDDED]
    first, second, rows = (tmp_path / f"{n}.jsonl" for n in ("first", "second", "rows"))
    _grade(mixed, first, *cache)
    # When it is graded again, in line mode and in row mode
    _grade(mixed, second, *cache)
    _grade(mixed, rows, "--resume", *cache)
    # Then the verdicts are the same, and every code verdict but the timeout is
    # read from the cache
    for again in (second, rows):
        graded = _read(again)
        assert _without_cached(graded) == _without_cached(_read(first))
        fresh = [r["id"] for r in graded if r.get("kind") == "code" and not r["cached"]]
        assert fresh == ["hostile-sleep"]


def test_fleet_and_embedded_verdicts_are_identical_on_a_mixed_file(
    workers: Any, redis_server: str, tmp_path: Path
) -> None:
    # Given a worker with the embedded run's item deadline
    workers.start(concurrency=2, item_timeout_s=ITEM_TIMEOUT_S)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows())
    fleet, fleet_rows, local = (
        tmp_path / f"{n}.jsonl" for n in ("fleet", "fleet_rows", "local")
    )
    # When the file is graded on the fleet (line mode and row mode) and embedded
    on_fleet = ["--broker", redis_server, "--batch-size", "8"]
    timeout = ["--item-timeout-s", str(ITEM_TIMEOUT_S)]
    _grade(mixed, fleet, *on_fleet, *timeout, env={})
    _grade(mixed, fleet_rows, "--resume", *on_fleet, *timeout, env={})
    _grade(mixed, local, "--no-cache", *EMBEDDED)
    # Then all three give the same verdicts (but for `cached`)
    embedded = _without_cached(_read(local))
    _check_code_verdicts(_read(fleet))
    assert _without_cached(_read(fleet)) == embedded
    assert _without_cached(_read(fleet_rows)) == embedded
    # And the fleet's cache answered the second run's code rows, and answers a
    # third (line mode again), all but the timeout
    again = tmp_path / "again.jsonl"
    _grade(mixed, again, *on_fleet, *timeout, env={})
    assert _without_cached(_read(again)) == embedded
    for graded in (_read(fleet_rows), _read(again)):
        fresh = [r["id"] for r in graded if r.get("kind") == "code" and not r["cached"]]
        assert fresh == ["hostile-sleep"]


def _api_rollouts() -> list[Any]:
    mbpp = {"test_list": ["assert add(1, 2) == 3"], "test_setup_code": ""}
    right = "```python\ndef add(a, b):\n    return a + b\n```"
    wrong = "```python\ndef add(a, b):\n    return a * b\n```"
    return [
        {"response": "so $\\boxed{4}$", "gold": "4"},
        code_rollout(right, mbpp),
        {"response": wrong, **mbpp},  # a mapping with tests and no gold
        Rollout(response="\\boxed{5}", gold="4"),
    ]


def test_python_api_grades_code_embedded_and_on_a_fleet(
    workers: Any, redis_server: str
) -> None:
    # Given math and code rollouts, and a worker
    workers.start(concurrency=1, item_timeout_s=ITEM_TIMEOUT_S)
    rollouts = _api_rollouts()
    settings = ProducerSettings(
        item_timeout_s=ITEM_TIMEOUT_S, processes=1, cache_dir=None
    )
    # When the embedded pool and the fleet grade them through `open_grader`
    with open_grader(None, settings=settings) as grader:
        embedded = grader.grade(rollouts)
    with open_grader(redis_server, settings=settings) as grader:
        fleet = grader.grade(rollouts)
    # Then the verdicts are the same, code ones of kind "code"
    assert [v.kind for v in embedded] == ["math", "code", "code", "math"]
    assert [v.correct for v in embedded] == [True, True, False, False]
    assert [v.replace(cached=False) for v in fleet] == [
        v.replace(cached=False) for v in embedded
    ]
    # And a row without tests is refused as a code rollout
    with pytest.raises(InvalidRolloutError, match="no code tests"):
        code_rollout(rollouts[1].response, {"answer": "4"})


def test_code_tests_of_megabytes_are_graded_embedded_and_on_a_fleet(
    workers: Any, redis_server: str
) -> None:
    # Given rollouts whose tests hold 3 MB of input each (over a math text's
    # bound; 6 of them are 18 MB, past a batch's text budget)
    workers.start(concurrency=1, item_timeout_s=ITEM_TIMEOUT_S)
    tests = {"tests": {"inputs": ["x" * 3_000_000 + "\n"], "outputs": ["3000000\n"]}}
    right = "```python\nprint(len(input()))\n```"
    wrong = "```python\nprint(len(input()) + 1)\n```"
    rollouts = [code_rollout(r, tests) for r in (right, wrong) * 3]
    settings = ProducerSettings(
        item_timeout_s=ITEM_TIMEOUT_S, processes=1, cache_dir=None
    )
    # When the embedded pool and the fleet grade them
    with open_grader(None, settings=settings) as grader:
        embedded = grader.grade(rollouts)
    with open_grader(redis_server, settings=settings) as grader:
        fleet = grader.grade(rollouts)
    # Then each is graded (no input error, no batch refused), the same both ways
    assert [v.status.value for v in embedded] == ["correct", "wrong"] * 3
    assert [v.replace(cached=False) for v in fleet] == [
        v.replace(cached=False) for v in embedded
    ]
