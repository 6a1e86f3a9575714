"""An offline Inspect model that replays recorded real outputs.

Registered with Inspect's `@modelapi` extension point when imported. Inspect's
`mockllm` counts tokens with tiktoken, which downloads an encoding (no network here);
this model counts words.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inspect_ai.model import (
    ChatMessage,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    modelapi,
)
from inspect_ai.tool import ToolChoice, ToolInfo

from tests.inspect_task.code_samples import code_samples

DATA = Path(__file__).resolve().parents[1] / "data" / "qwen25math_math_cot_100.jsonl"
SAMPLES = 12
QUESTIONLESS = "What is the unparsable gold?"


def records() -> list[dict[str, Any]]:
    """The first problems of the Qwen2.5-Math file."""
    with DATA.open() as lines:
        return [
            json.loads(line) for _, line in zip(range(SAMPLES), lines, strict=False)
        ]


def replies() -> dict[str, str]:
    """Question -> the recorded response (the first of its eight samples)."""
    out = {r["question"]: r["code"][0] for r in records()}
    out[QUESTIONLESS] = r"\boxed{1}"
    out.update({s.question: s.reply for s in code_samples()})  # replay_code_task
    return out


class ReplayAPI(ModelAPI):
    """Answers with the recorded output for the question; no network, no tokenizer."""

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig = GenerateConfig(),  # noqa: B008 (Inspect's signature)
        **model_args: Any,
    ) -> None:
        super().__init__(model_name, base_url, api_key, [], config)
        self._replies = replies()

    async def generate(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        question = input[-1].text
        return ModelOutput.from_content(self.model_name, self._replies[question])

    async def count_text_tokens(self, text: str) -> int:
        return len(text.split())


@modelapi(name="gradefleet_replay")
def replay() -> type[ModelAPI]:
    return ReplayAPI
