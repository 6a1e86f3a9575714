"""`describe_failure` (a first failing test as text) on rows of each test mode, and
the Inspect scorer's test convention (`code_tests_row`): pure, nothing runs."""

from __future__ import annotations

import json

from producer.adapters.inspect import code_tests_row
from tests.code_mixed import CODE, _jsonl
from workers.code.describe import MAX_DESCRIBED_CHARS, describe_failure
from workers.code.item import decode_code_gold, encode_code_gold


def test_describe_names_the_failing_assert_of_an_mbpp_row() -> None:
    (row,) = _jsonl(CODE / "mbpp_samples.jsonl", 1)
    failure = {"index": 2, "kind": "wrong_answer", "detail": "assertion failed"}
    text = describe_failure(row, failure)
    assert text == (
        f"test 2: wrong_answer (assertion failed): {row['test_list'][2].strip()}"
    )


def test_describe_names_stdio_and_call_cases() -> None:
    stdio = {"input_output": {"inputs": ["1\n", "2\n"], "outputs": ["1\n", "4\n"]}}
    assert describe_failure(stdio, {"index": 1, "kind": "wrong_answer"}) == (
        "test 1: wrong_answer: stdin '2\\n' expected '4\\n'"
    )
    call = {
        "input_output": {"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"},
    }
    failure = {"index": 0, "kind": "runtime_error", "exception": "TypeError"}
    assert describe_failure(call, failure) == (
        "test 0: runtime_error (TypeError): add(1, 2) expected 3"
    )


def test_describe_without_usable_tests_names_index_and_kind_only() -> None:
    failure = {"index": 0, "kind": "timeout"}
    assert describe_failure(None, failure) == "test 0: timeout"
    assert describe_failure({"test_list": "not json ["}, failure) == "test 0: timeout"
    assert describe_failure({"test_list": ["assert 1"]}, None) is None
    long = {"test_list": ["assert f('" + "x" * 1000 + "') == 1"]}
    text = describe_failure(long, failure)
    assert text is not None
    assert len(text) < MAX_DESCRIBED_CHARS + 20
    assert text.endswith("…")


def test_inspect_tests_come_from_metadata_then_a_json_target_then_test_code() -> None:
    humaneval = _jsonl(CODE / "mbpp_sanitized.jsonl", 1)[0]
    meta = {k: humaneval[k] for k in ("prompt", "entry_point", "test")}
    # metadata holding a row's test fields wins, whatever the target says
    assert code_tests_row(meta, "ignored") == meta
    # a JSON target with test fields
    spec = {"input_output": {"inputs": ["1\n"], "outputs": ["2\n"]}}
    assert code_tests_row({}, json.dumps(spec)) == spec
    # test code: HumanEval's check with an entry point, else an assert script
    check = humaneval["test"]
    assert code_tests_row({"entry_point": "f"}, check) == {
        "test": check,
        "entry_point": "f",
    }
    assert code_tests_row({}, "assert f(1) == 2\n") == {
        "test_list": ["assert f(1) == 2\n"]
    }
    # nothing: no tests (the scorer leaves the sample unscored)
    assert code_tests_row({}, "  ") is None
    assert code_tests_row(None, "") is None
    # what is graded is the encoded row, as `gradefleet grade` encodes it
    gold = encode_code_gold(code_tests_row(meta, "") or {})
    assert decode_code_gold(gold) == meta
