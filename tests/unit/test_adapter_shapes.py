"""Pure parts of the adapters: reward mapping, result keys, protocol text rules."""

from __future__ import annotations

import json
import subprocess
import sys

from producer.adapters.compat import nemo_gym_text, strip_query
from producer.adapters.reward import RESULT_KEYS, RewardConfig, result_dict
from producer.adapters.trl import completion_text
from workers.models import ExtractionMethod, Status, Verdict


def _verdict(status: Status, *, format_valid: bool = True) -> Verdict:
    return Verdict(
        correct=status is Status.CORRECT,
        status=status,
        format_valid=format_valid,
        extracted="4" if status is not Status.NO_ANSWER else None,
        extraction_method=ExtractionMethod.BOXED,
        grader_version="v",
    )


def test_default_reward_is_one_for_correct_only() -> None:
    reward = RewardConfig()
    assert reward.score(_verdict(Status.CORRECT)) == 1.0
    for status in Status:
        if status is not Status.CORRECT:
            assert reward.score(_verdict(status)) == 0.0


def test_reward_overrides_and_format_bonus() -> None:
    reward = RewardConfig().updated({"wrong_score": -1, "format_reward": 0.1, "x": 5})
    assert reward.score(_verdict(Status.WRONG)) == -0.9
    assert reward.score(_verdict(Status.CORRECT, format_valid=False)) == 1.0
    env = {"GRADEFLEET_FORMAT_REWARD": "0.2", "GRADEFLEET_TIMEOUT_SCORE": "-0.5"}
    from_env = RewardConfig.from_env(env)
    assert from_env.score(_verdict(Status.TIMEOUT, format_valid=False)) == -0.5


def test_code_partial_credit_scores_the_fraction_between_wrong_and_correct() -> None:
    code = _verdict(Status.WRONG, format_valid=False).replace(
        kind="code", score=0.75, tests_passed=3, tests_total=4
    )
    assert RewardConfig().score(code) == 0.0  # all-or-nothing by default
    partial = RewardConfig.from_env({"GRADEFLEET_CODE_PARTIAL_CREDIT": "1"})
    assert partial.score(code) == 0.75
    assert partial.updated({"wrong_score": -1}).score(code) == 0.5
    # an unrun rollout and a math verdict keep their status scores
    error = code.replace(status=Status.ERROR, tests_passed=0, tests_total=0)
    assert partial.score(error) == 0.0
    assert partial.score(_verdict(Status.WRONG, format_valid=False)) == 0.0
    assert not RewardConfig().updated({"code_partial_credit": "no"}).code_partial_credit


def test_result_keys_are_fixed_whatever_the_verdict() -> None:
    for status in Status:
        result = result_dict(_verdict(status), RewardConfig())
        assert tuple(result) == RESULT_KEYS
        assert isinstance(result["pred"], str)


def test_openrlhf_query_loses_prompt_and_trailing_tokens() -> None:
    prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    query = prompt + "so \\boxed{4}<|im_end|>\n<|endoftext|><|endoftext|>  "
    assert strip_query(query, prompt) == r"so \boxed{4}"
    assert strip_query("A </s><pad><pad>", None) == "A"
    assert strip_query("<｜end▁of▁sentence｜>", None) == ""
    assert strip_query("x < y and |z| > 1", None) == "x < y and |z| > 1"
    # Long whitespace runs cost linear time (the tail is searched, not the text).
    assert strip_query(" " * 500_000 + "x", None) == " " * 500_000 + "x"


def test_nemo_gym_text_joins_output_text_of_messages_only() -> None:
    response = {
        "output": [
            {"type": "reasoning", "content": [{"type": "output_text", "text": "no"}]},
            {"type": "message", "content": [{"type": "output_text", "text": "a"}]},
            {"type": "message", "content": [{"type": "refusal", "refusal": "no"}]},
            {"type": "message", "content": [{"type": "output_text", "text": "b"}]},
        ]
    }
    assert nemo_gym_text(response) == "ab"
    assert nemo_gym_text({}) == ""


def test_trl_completion_text() -> None:
    assert completion_text("plain") == "plain"
    chat = [{"role": "assistant", "content": "a"}, {"role": "tool", "content": "x"}]
    assert completion_text(chat) == "a"
    assert completion_text(None) == ""


def test_adapters_import_no_framework_and_no_sympy() -> None:
    code = (
        "import json, sys\n"
        "import producer.adapters.verl, producer.adapters.trl\n"
        "import producer.adapters.openrlhf, producer.adapters.nemo_gym\n"
        "import producer.client.grading, producer.client.coalesce\n"
        "import producer.client.backends\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    loaded = {m.split(".")[0] for m in json.loads(done.stdout)}
    forbidden = {"sympy", "verl", "trl", "openrlhf", "inspect_ai", "nemo_gym"}
    assert not forbidden & loaded
    assert not {"torch", "fastapi", "uvicorn", "celery"} & loaded


def test_verl_code_sources_and_test_specs_become_code_golds() -> None:
    from producer.adapters.compat import label_gold, spec_gold, tests_row
    from producer.adapters.verl import is_code_source, sample_gold
    from workers.code.item import decode_code_gold, is_code_gold

    for source in ("codecontests", "deepmind/code_contests", "likaixin/TACO", "MBPP"):
        assert is_code_source(source)
    for source in ("lighteval/MATH", "openai/gsm8k", None, 3):
        assert not is_code_source(source)
    spec = json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})
    # verl's ground_truth as it passes it: JSON text, or a dict
    for truth in (spec, json.loads(spec), json.dumps({"assert_case": ["assert 1"]})):
        gold = sample_gold("my_set", truth)
        assert is_code_gold(gold)
        assert decode_code_gold(gold) == {"ground_truth": truth}
    # math answers never look like code, whatever the data source calls itself
    assert sample_gold("lighteval/MATH", "42") == "42"
    assert sample_gold(None, 3.5) == "3.5"
    assert spec_gold("{not json") is None
    assert spec_gold('{"a": 1}') is None  # an object, but no tests
    # a code source's unusable ground truth is still a code gold (invalid_gold)
    assert is_code_gold(sample_gold("apps", "42"))
    # OpenRLHF labels: a test spec, or the math answer's text
    assert is_code_gold(label_gold(spec))
    assert label_gold(7) == "7"
    assert tests_row(["assert f(1) == 2"]) == {"test_list": ["assert f(1) == 2"]}
    assert tests_row({"inputs": [], "outputs": []}) == {
        "tests": {"inputs": [], "outputs": []}
    }


def test_trl_code_golds_read_code_columns_only_where_a_row_has_tests() -> None:
    from producer.adapters.trl import code_golds
    from workers.code.item import decode_code_gold

    golds = code_golds(
        {
            "tests": [["assert f(1) == 2"], None, None],
            "entry_point": [None, None, "f"],
            "test": [None, None, "def check(candidate):\n    assert candidate(1)"],
            "prompts": ["Write f.", "What is 2+2?", "def f(x):\n"],
        },
        3,
    )
    assert golds[1] is None  # a math row
    assert golds[0] is not None
    assert golds[2] is not None
    assert decode_code_gold(golds[0]) == {"test_list": ["assert f(1) == 2"]}
    assert decode_code_gold(golds[2])["prompt"] == "def f(x):\n"  # HumanEval's
    assert code_golds({"solution": ["4"]}, 1) == [None]  # no code column at all


def test_a_code_gold_over_its_bound_is_invalid_gold_and_the_rest_graded() -> None:
    from producer.adapters._common import _split
    from workers.code.item import encode_code_gold
    from workers.wire.contract import MAX_CODE_GOLD_CHARS, MAX_TEXT_CHARS

    big = encode_code_gold({"tests": {"inputs": ["x" * MAX_CODE_GOLD_CHARS]}})
    fits = encode_code_gold({"tests": {"inputs": ["x" * MAX_TEXT_CHARS]}})
    known, todo = _split([("r", big), ("r", fits), ("r", "1" * (MAX_TEXT_CHARS + 9))])
    assert known[0] is not None
    assert known[0].status is Status.INVALID_GOLD
    assert known[0].kind == "code"
    assert "limit 4,000,000" in known[0].reason
    assert known[1:] == [None, None]
    # a code gold within its bound goes whole; a math gold is cut to its bound
    assert todo == [("r", fits), ("r", "1" * MAX_TEXT_CHARS)]
