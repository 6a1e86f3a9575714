"""The request and reply shapes of OpenRLHF's remote reward and NeMo Gym's verify,
and how a framework's gold value becomes a gold (a math answer's text, or a code
row's tests encoded; pure: used by the HTTP routes and by the in-process adapters
alike)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from producer.adapters.reward import RewardConfig
from workers.code.item import encode_code_gold, is_code_row
from workers.models import Verdict

__all__ = [
    "code_gold",
    "label_gold",
    "label_text",
    "nemo_gym_code_fields",
    "nemo_gym_code_gold",
    "nemo_gym_fields",
    "nemo_gym_text",
    "nemo_gym_unit_tests",
    "openrlhf_payload",
    "spec_gold",
    "strip_query",
    "tests_row",
]

# End-of-text and padding tokens OpenRLHF leaves in `query` (it decodes with special
# tokens kept): <|im_end|>, <|endoftext|>, <|eot_id|>, </s>, <pad>, <eos>,
# <｜end▁of▁sentence｜>, ...
_SPECIAL_TOKEN = r"<\|[^|<>]{1,40}\|>|<｜[^｜<>]{1,40}｜>|</s>|<pad>|<eos>"
# Matched against a short tail only: a pattern anchored at `$` and scanned over a
# long response would retry at every whitespace position (quadratic).
_LAST_SPECIAL = re.compile(rf"(?:{_SPECIAL_TOKEN})$")
_TAIL_CHARS = 64


def strip_query(query: str, prompt: str | None) -> str:
    """The response part of an OpenRLHF `query`: prompt prefix and trailing
    end/pad tokens removed."""
    if prompt and query.startswith(prompt):
        query = query[len(prompt) :]
    while True:
        query = query.rstrip()
        tail = query[-_TAIL_CHARS:]
        found = _LAST_SPECIAL.search(tail)
        if found is None:
            return query
        query = query[: len(query) - len(tail) + found.start()]


def nemo_gym_text(response: dict[str, Any]) -> str:
    """NeMo Gym's rule: `output_text` contents of `message` items, concatenated."""
    parts: list[str] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        for content in item.get("content") or []:
            if isinstance(content, dict) and content.get("type") == "output_text":
                text = content.get("text")
                if isinstance(text, str):
                    parts.append(text)
    return "".join(parts)


def label_text(label: object) -> str:
    if isinstance(label, str):
        return label
    if isinstance(label, int | float) and not isinstance(label, bool):
        return str(label)
    return ""


def code_gold(row: Mapping[str, Any]) -> str:
    """The gold of a code rollout: its row's test fields, encoded (`workers.code.item`);
    a row whose tests cannot be used is graded `invalid_gold`, never an exception."""
    return encode_code_gold(row)


def spec_gold(value: object) -> str | None:
    """The code gold of a gold value that is a test spec (verl's `ground_truth`: a
    dict, or JSON text of one, with inputs/outputs/fn_name or assert_case); None for
    any other value (a math answer). Only an object is looked at: a number or an
    answer's text never costs a JSON parse."""
    if isinstance(value, str):
        if not value.lstrip().startswith("{"):
            return None
    elif not isinstance(value, Mapping):
        return None
    row = {"ground_truth": value}
    return code_gold(row) if is_code_row(row) else None


def tests_row(tests: object) -> dict[str, Any]:
    """The row of a `tests` value as a framework passes it: a list of assert
    strings is MBPP's `test_list`; anything else (`{inputs, outputs, fn_name?}`,
    a list of `{input, output}`, JSON text of either) is read as `tests`."""
    if isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests):
        return {"test_list": tests}
    return {"tests": tests}


def label_gold(label: object) -> str:
    """An OpenRLHF label as a gold: a test spec's code gold (`spec_gold`), else the
    math answer's text."""
    return spec_gold(label) or label_text(label)


def openrlhf_payload(verdicts: list[Verdict], reward: RewardConfig) -> dict[str, Any]:
    """OpenRLHF's reward reply: `rewards`, `scores`, `extra_logs` (aligned lists)."""
    rewards = [reward.score(v) for v in verdicts]
    return {
        "rewards": rewards,
        "scores": rewards,
        "extra_logs": {
            "acc": [float(v.correct) for v in verdicts],
            "format_valid": [float(v.format_valid) for v in verdicts],
            "status": [v.status.value for v in verdicts],
            "pred": [v.extracted or "" for v in verdicts],
        },
    }


def nemo_gym_unit_tests(data: Mapping[str, Any]) -> object | None:
    """A NeMo Gym `code_gen` request's `verifier_metadata.unit_tests` (None: not
    one; a math request carries `expected_answer` instead)."""
    metadata = data.get("verifier_metadata")
    if not isinstance(metadata, Mapping):
        return None
    return metadata.get("unit_tests")


def nemo_gym_code_gold(unit_tests: object) -> str:
    """The code gold of a `code_gen` request's unit tests ({inputs, outputs,
    fn_name?}; unusable ones are graded `invalid_gold`)."""
    return code_gold({"verifier_metadata": {"unit_tests": unit_tests}})


def nemo_gym_code_fields(
    verdict: Verdict, reward: RewardConfig, text: str
) -> dict[str, Any]:
    """What NeMo Gym's `code_gen` verify adds to the request it echoes: `reward`
    (1.0 only when every unit test passed), `extracted_model_output`,
    `extracted_model_code`, and gradefleet's tests passed/total and first failure
    (NeMo Gym's per-test `result` list is not reproduced)."""
    from workers.code.program import extract_program  # pure: parses, never runs

    return {
        "reward": reward.score(verdict),
        "extracted_model_output": text,
        "extracted_model_code": extract_program(text, None, None),
        "tests_passed": verdict.tests_passed,
        "tests_total": verdict.tests_total,
        "failure": verdict.failure,
        "gradefleet_status": verdict.status.value,
    }


def nemo_gym_fields(verdict: Verdict, reward: RewardConfig) -> dict[str, Any]:
    """What NeMo Gym's math verify adds to the request it echoes."""
    score = reward.score(verdict)
    return {
        "reward": score,
        "extracted_answer": verdict.extracted,
        "library_reward": score,
        "gradefleet_status": verdict.status.value,
    }
