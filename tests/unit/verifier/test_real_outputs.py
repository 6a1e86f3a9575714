"""Agreement of `grade` with other graders' labels on real model outputs.

Qwen2.5-Math CoT outputs (800, labelled by Qwen's grader) and GPT-3 GSM8K outputs
(5,276, labelled by OpenAI). Every disagreement is reviewed, with who is right, in
`real_output_disagreements.json`; the test fails on any new or vanished disagreement.

`messy_dev.jsonl` (2,870 outputs of weak and early-RL models, labelled by their repos'
strict graders, `null` where the grader never compared) is held to its own reviewed
list, `messy_dev_disagreements.json`: every row where our verdict differs from a label,
and every null-label row we grade correct (each a possible false positive), with who is
right and why. Its labels check formats strictly, so no agreement floor applies there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.verifier import grade

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
REVIEWED_PATH = Path(__file__).with_name("real_output_disagreements.json")
MESSY_REVIEWED_PATH = Path(__file__).with_name("messy_dev_disagreements.json")
MIN_AGREEMENT = 0.995


@dataclass(frozen=True, slots=True)
class LabelledOutput:
    item_id: str
    response: str
    gold: str
    label: bool


def qwen_outputs() -> Iterator[LabelledOutput]:
    """`code[i]` is the response, `gt` the gold, `score[i]` Qwen's verdict."""
    path = DATA_DIR / "qwen25math_math_cot_100.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for sample, (response, label) in enumerate(
            zip(record["code"], record["score"], strict=True)
        ):
            item_id = f"qwen:{record['idx']}:{sample}"
            yield LabelledOutput(item_id, response, record["gt"], bool(label))


def gsm8k_outputs() -> Iterator[LabelledOutput]:
    """Four models per problem; gold is the whole solution ending in `A: n`."""
    path = DATA_DIR / "gsm8k_example_model_solutions.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines):
        record = json.loads(line)
        for model, output in sorted(record.items()):
            if not isinstance(output, dict):
                continue
            item_id = f"gsm8k:{number}:{model}"
            gold = record["ground_truth"]
            yield LabelledOutput(
                item_id, output["solution"], gold, bool(output["is_correct"])
            )


@dataclass(frozen=True, slots=True)
class MessyOutput:
    item_id: str
    response: str
    gold: str
    label: bool | None


def messy_outputs() -> Iterator[MessyOutput]:
    """`id`, `response`, `gold` and `label` (None: the repo's grader never compared)."""
    path = DATA_DIR / "messy_dev.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        label = record["label"]
        yield MessyOutput(
            record["id"],
            record["response"],
            record["gold"],
            None if label is None else bool(label),
        )


def disagreements(items: list[LabelledOutput]) -> dict[str, bool]:
    """Our verdict for every item where it differs from the label."""
    found: dict[str, bool] = {}
    for item in items:
        ours = grade(item.response, item.gold).correct
        if ours != item.label:
            found[item.item_id] = ours
    return found


def load_reviewed() -> dict[str, dict[str, object]]:
    entries = json.loads(REVIEWED_PATH.read_text(encoding="utf-8"))
    return {str(entry["id"]): entry for entry in entries}


DATASETS = {"qwen": qwen_outputs, "gsm8k": gsm8k_outputs}


@pytest.mark.parametrize("dataset", list(DATASETS))
def test_real_outputs_agree_with_labels(dataset: str) -> None:
    # Given: the labelled outputs and the reviewed disagreements for this dataset
    items = list(DATASETS[dataset]())
    reviewed = {
        item_id: entry
        for item_id, entry in load_reviewed().items()
        if item_id.startswith(f"{dataset}:")
    }
    # When: every output is graded
    found = disagreements(items)
    # Then: agreement is high and every disagreement is exactly one we reviewed
    agreement = 1 - len(found) / len(items)
    assert agreement >= MIN_AGREEMENT, f"{dataset}: {agreement:.4f}"
    actual = {(item_id, ours) for item_id, ours in found.items()}
    expected = {(item_id, bool(entry["ours"])) for item_id, entry in reviewed.items()}
    assert sorted(actual - expected) == [], "new disagreements: review them"
    assert sorted(expected - actual) == [], "fixed disagreements: drop them"


def test_real_outputs_reviewed_list_is_well_formed() -> None:
    labels = {item.item_id: item.label for item in qwen_outputs()}
    labels.update((item.item_id, item.label) for item in gsm8k_outputs())
    for item_id, entry in load_reviewed().items():
        assert item_id in labels, item_id
        assert entry["label"] == labels[item_id], item_id
        assert entry["ours"] != entry["label"], item_id
        assert entry["right"] in {"ours", "label", "unclear"}, item_id
        assert isinstance(entry["reason"], str), item_id
        assert entry["reason"].strip(), item_id


def _messy_reviewed() -> dict[str, dict[str, object]]:
    entries = json.loads(MESSY_REVIEWED_PATH.read_text(encoding="utf-8"))
    return {str(entry["id"]): entry for entry in entries}


def test_messy_dev_disagreements_are_the_reviewed_ones() -> None:
    # Given: the messy outputs and their reviewed list
    reviewed = _messy_reviewed()
    # When: every output is graded; a label disagreement or a null-label "correct"
    # is a row to review
    found = {}
    for item in messy_outputs():
        ours = grade(item.response, item.gold).correct
        if ours != item.label and (item.label is not None or ours):
            found[item.item_id] = ours
    # Then: exactly the reviewed rows, with the reviewed verdicts
    actual = set(found.items())
    expected = {(item_id, bool(entry["ours"])) for item_id, entry in reviewed.items()}
    assert sorted(actual - expected) == [], "new disagreements: review them"
    assert sorted(expected - actual) == [], "fixed disagreements: drop them"


def test_messy_dev_reviewed_list_is_well_formed() -> None:
    labels = {item.item_id: item.label for item in messy_outputs()}
    for item_id, entry in _messy_reviewed().items():
        assert item_id in labels, item_id
        assert entry["label"] == labels[item_id], item_id
        assert entry["ours"] != entry["label"], item_id
        assert entry["right"] in {"ours", "label", "unclear"}, item_id
        assert isinstance(entry["reason"], str), item_id
        assert entry["reason"].strip(), item_id
