"""Code rows as (response, gold) items: the gold encodes the tests, the records reader
makes code rows of rows with tests (math rows untouched), the batch grader grades
them beside math items with the result cache, keeping no load-dependent verdict and
missing on a new code grader version. Real sandbox (bubblewrap): fails without it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from workers.cache.results import (
    SqliteResultCache,
    cache_entry,
    code_verdict_from_entry,
)
from workers.code import suite
from workers.code.grade import grade_code
from workers.code.item import (
    CODE_GOLD_PREFIX,
    TRIGGER_FIELDS,
    code_limits_from_env,
    code_uid_base_from_env,
    decode_code_gold,
    encode_code_gold,
    grade_code_item,
    is_code_gold,
)
from workers.code.sandbox import CodeSandbox
from workers.code.suite import StdioCase, TestSuite
from workers.embedded.batch import BatchGrader, GradeItem, NullObserver
from workers.embedded.code_items import CodeItemGrader
from workers.embedded.pool import LocalPool
from workers.errors import ConfigError
from workers.fleet.settings import WorkerSettings
from workers.lines.fields import alias_table_text
from workers.lines.records import rows_from_record
from workers.models import GradeOptions, Rollout, Status, Verdict, is_final
from workers.sandbox.process import Sandbox

MBPP = {
    "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
    "test_setup_code": "",
    "content": "Add two numbers.",
}
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
SLEEPS = "```python\nimport time\ndef add(a, b):\n    time.sleep(30)\n```"


@pytest.fixture(autouse=True)
def _needs_the_sandbox() -> None:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is not installed"


def test_the_gold_keeps_only_what_the_grader_reads() -> None:
    row = {
        **MBPP,
        "response": RIGHT,
        "id": 7,
        "metadata": {"func_name": "add", "source": "x"},
        "prompt": [{"role": "user", "content": "chat prompts are not code"}],
    }
    gold = encode_code_gold(row)
    assert is_code_gold(gold)
    assert gold.startswith(CODE_GOLD_PREFIX)
    assert decode_code_gold(gold) == {
        "test_list": MBPP["test_list"],
        "test_setup_code": "",
        "metadata": {"func_name": "add"},
    }
    # equal problems, equal golds (key order aside)
    assert encode_code_gold(dict(reversed(list(row.items())))) == gold
    assert not is_code_gold("42")


def test_the_cheap_gate_covers_every_field_the_suite_reads() -> None:
    nested = {"verifier_metadata", "reward_model", "ground_truth"}
    assert suite._CODE_FIELDS | nested <= TRIGGER_FIELDS


def test_records_with_tests_become_code_rows_one_per_sample() -> None:
    record = {**MBPP, "responses": [RIGHT, WRONG]}
    rows = rows_from_record(record, 3)
    assert isinstance(rows, list)
    assert [r.response for r in rows] == [RIGHT, WRONG]
    assert {r.gold for r in rows} == {encode_code_gold(record)}
    assert [r.record["sample_idx"] for r in rows] == [0, 1]
    assert rows[1].record["test_list"] == MBPP["test_list"]  # a list kept whole
    # a math row, usual layout or verl's, is what it was
    (math,) = rows_from_record({"response": "\\boxed{2}", "gold": "2"}, 1)  # type: ignore[misc]
    assert (math.response, math.gold) == ("\\boxed{2}", "2")
    verl = {"response": "x", "reward_model": {"ground_truth": "2"}}
    (math,) = rows_from_record(verl, 1)  # type: ignore[misc]
    assert math.gold == "2"


def test_a_code_verdict_round_trips_through_a_cache_entry() -> None:
    verdict = grade_code_item(WRONG, encode_code_gold(MBPP))
    assert verdict.kind == "code"
    assert verdict.status is Status.WRONG
    assert verdict.failure == {
        "index": 0,
        "kind": "wrong_answer",
        "detail": "assertion failed",
    }
    back = code_verdict_from_entry(cache_entry(verdict), True)
    assert back == verdict.replace(cached=True)


def test_load_dependent_code_verdicts_are_not_final() -> None:
    timed_out = grade_code_item(SLEEPS, encode_code_gold({**MBPP, "time_limit": 1}))
    assert timed_out.status is Status.WRONG
    assert timed_out.failure is not None
    assert timed_out.failure["kind"] == "timeout"
    assert not is_final(timed_out)
    assert is_final(grade_code_item(WRONG, encode_code_gold(MBPP)))


def test_a_later_timeout_behind_a_wrong_answer_is_not_final() -> None:
    # The first test fails on its answer, the second runs out of time: the verdict
    # shows the first failure, and says that a later one depended on load.
    late = (
        "```python\nimport time\ndef add(a, b):\n"
        "    if a == 1:\n        return 0\n    time.sleep(30)\n```"
    )
    verdict = grade_code_item(late, encode_code_gold({**MBPP, "time_limit": 1}))
    assert verdict.failure is not None
    assert verdict.failure["kind"] == "wrong_answer"
    assert verdict.failure["later"] == "timeout"
    assert verdict.tests_passed == 0
    assert not is_final(verdict)


def _code_grader(cache: SqliteResultCache, version: str = "") -> CodeItemGrader:
    return CodeItemGrader(cache, NullObserver(), version=version)


def test_the_cache_answers_a_regrade_but_not_a_new_version(tmp_path: Path) -> None:
    gold = encode_code_gold({**MBPP, "time_limit": 1})
    items = [(0, RIGHT, gold), (1, WRONG, gold), (2, SLEEPS, gold), (3, RIGHT, gold)]
    options = GradeOptions()
    cache = SqliteResultCache(tmp_path / "c.sqlite")
    try:
        first = _code_grader(cache).grade(items, options)
        again = _code_grader(cache).grade(items, options)
        other = _code_grader(cache, version="code-r0+test").grade(items, options)
    finally:
        cache.close()
    assert [v.correct for v in first] == [True, False, False, True]
    assert [v.cached for v in first] == [False] * 4  # the copy too: graded here
    assert [v.cached for v in again] == [True, True, False, True]
    assert [v.replace(cached=False) for v in again] == first
    assert [v.cached for v in other] == [False] * 4


def test_a_batch_mixes_math_and_code_in_input_order() -> None:
    gold = encode_code_gold(MBPP)
    items = [
        GradeItem(10, "so \\boxed{4}", "4"),
        GradeItem(11, RIGHT, gold),
        GradeItem(12, "\\boxed{5}", "4"),
        GradeItem(13, WRONG, gold),
    ]
    with Sandbox(item_timeout_s=30, item_memory_bytes=1 << 30) as sandbox:
        grader = BatchGrader(sandbox=sandbox, cache=None)
        mixed = grader.grade(items, GradeOptions())
        math_only = grader.grade([items[0], items[2]], GradeOptions())
    assert [i for i, _v in mixed] == [10, 11, 12, 13]
    verdicts: list[Verdict] = [v for _i, v in mixed]
    assert [v.kind for v in verdicts] == ["math", "code", "math", "code"]
    assert [v.correct for v in verdicts] == [True, True, False, False]
    assert [verdicts[0], verdicts[2]] == [v for _i, v in math_only]


def test_held_code_entries_are_written_by_every_flush(tmp_path: Path) -> None:
    # A fleet task holds its new entries and writes them once (`hold_stores`)
    gold = encode_code_gold(MBPP)
    cache = SqliteResultCache(tmp_path / "c.sqlite")
    try:
        with Sandbox(item_timeout_s=30, item_memory_bytes=1 << 30) as sandbox:
            grader = BatchGrader(sandbox=sandbox, cache=cache, hold_stores=True)
            for response in (RIGHT, WRONG):  # two tasks, a flush after each
                grader.grade([GradeItem(0, response, gold)], GradeOptions())
                grader.flush_stores()
            fresh = BatchGrader(sandbox=sandbox, cache=cache)
            again = fresh.grade(
                [GradeItem(0, RIGHT, gold), GradeItem(1, WRONG, gold)], GradeOptions()
            )
    finally:
        cache.close()
    assert [v.cached for _i, v in again] == [True, True]


def test_code_limits_come_from_the_entry_points_environment() -> None:
    assert code_limits_from_env({}) is None
    limits = code_limits_from_env(
        {"GRADEFLEET_CODE_TIME_LIMIT_S": "12", "GRADEFLEET_CODE_MEMORY_MB": "512"}
    )
    assert limits is not None
    assert (limits.time_limit_s, limits.max_time_limit_s) == (12.0, 12.0)
    assert limits.memory_bytes == 512 << 20
    with pytest.raises(ConfigError, match="GRADEFLEET_CODE_WALL_S"):
        code_limits_from_env({"GRADEFLEET_CODE_WALL_S": "-1"})
    settings = WorkerSettings.from_env({"GRADEFLEET_CODE_TIME_LIMIT_S": "20"})
    assert settings.code_limits is not None
    assert settings.longest_batch_s == settings.max_batch_size * (20 + 1 + 0.5)


def test_code_uid_base_comes_from_the_entry_points_environment() -> None:
    assert code_uid_base_from_env({}) is None
    assert code_uid_base_from_env({"GRADEFLEET_CODE_UID_BASE": "30000"}) == 30_000
    for bad in ("0", "-5", "abc", "1e9", str(2**32)):
        with pytest.raises(ConfigError, match="GRADEFLEET_CODE_UID_BASE"):
            code_uid_base_from_env({"GRADEFLEET_CODE_UID_BASE": bad})
    settings = WorkerSettings.from_env({"GRADEFLEET_CODE_UID_BASE": "30000"})
    assert settings.code_uid_base == 30_000


def test_code_sandbox_runs_rollouts_as_uids_from_its_base() -> None:
    # Given a sandbox whose slot uids start at 30,000 (inside a user namespace of
    # 65,536 ids) on a slot name of its own (slot 0),
    case = StdioCase(stdin="", expected_stdout="30000\n")
    uid_suite = TestSuite(mode="stdio", stdio=(case,))
    box = CodeSandbox(f"gradefleet-test-uid-{os.getpid()}", uid_base=30_000)
    try:
        # the model's program runs as the slot's model uid, the base itself.
        verdict = grade_code("import os\nprint(os.getuid())", uid_suite, sandbox=box)
    finally:
        box.close()
    assert verdict.status is Status.CORRECT, verdict.reason


def test_grade_help_lists_the_test_fields() -> None:
    text = alias_table_text()
    for name in ("input_output", "verifier_metadata.unit_tests", "test_list"):
        assert name in text
    assert "assert_case" in text


def test_the_pool_allows_a_code_item_its_own_budget_not_the_math_deadline() -> None:
    # Given a pool whose math item deadline (0.3 s) is far below a code item's run
    slow = "import time\ndef add(a, b):\n    time.sleep(0.5)\n    return a + b\n"
    items = [
        Rollout(slow, encode_code_gold(MBPP)),
        Rollout("so \\boxed{4}", "4"),
    ]
    with LocalPool(
        processes=1, item_timeout_s=0.3, item_memory_bytes=1 << 30, cache_path=None
    ) as pool:
        verdicts = pool.grade(items, GradeOptions())
    # Then the code item is graded (two tests of 0.5 s), not killed at 0.3 s
    assert [v.status for v in verdicts] == [Status.CORRECT, Status.CORRECT]
    assert verdicts[0].kind == "code"


def test_code_items_worker_side_never_imports_the_in_sandbox_modules() -> None:
    # Given a fresh interpreter that imports what a worker uses to grade code
    # (the kind registry, the item, the grader, the sandbox handle); then the
    # modules that run model and test code (zygote, runner, harness: they `exec`)
    # are not loaded in it: they run only inside bwrap.
    import subprocess
    import sys

    code = (
        "import sys, workers.kinds, workers.code.item, workers.code.grade, "
        "workers.code.sandbox, workers.embedded.code_items; "
        "print(sorted(m for m in sys.modules if m in {'workers.code.zygote', "
        "'workers.code.runner', 'workers.code.harness'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
