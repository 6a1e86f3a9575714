"""The request and reply shapes of OpenRLHF's remote reward and NeMo Gym's verify
(pure: used by the HTTP routes and by the in-process adapters alike)."""

from __future__ import annotations

import re
from typing import Any

from producer.adapters.reward import RewardConfig
from workers.models import Verdict

__all__ = [
    "label_text",
    "nemo_gym_fields",
    "nemo_gym_text",
    "openrlhf_payload",
    "strip_query",
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


def nemo_gym_fields(verdict: Verdict, reward: RewardConfig) -> dict[str, Any]:
    """What NeMo Gym's math verify adds to the request it echoes."""
    score = reward.score(verdict)
    return {
        "reward": score,
        "extracted_answer": verdict.extracted,
        "library_reward": score,
        "gradefleet_status": verdict.status.value,
    }
