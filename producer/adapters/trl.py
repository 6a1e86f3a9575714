"""TRL reward function: `GRPOTrainer(reward_funcs=[math_reward])` or
`--reward_funcs producer.adapters.trl.math_reward`.

`math_reward` is a module-level `async def`: TRL detects it with
`inspect.iscoroutinefunction` and awaits it, and it pickles by reference into
AsyncGRPO's spawned reward process (the grader is created lazily there). Completions
may be plain strings or conversations (the assistant messages' contents are graded);
the gold comes from the `solution`, `answer` or `ground_truth` column. A rollout
whose gold cannot be used gets `None` ("not applicable": TRL's weighted sum skips
it), like TRL's own `accuracy_reward`. Settings: `GRADEFLEET_URL` (or a
`functools.partial(math_reward, grader_url=...)`, which TRL also detects as async),
`GRADEFLEET_FORMAT_REWARD`, `GRADEFLEET_<STATUS>_SCORE`.

TRL's call site (huggingface/trl@f2cd577, trl/trainer/grpo_trainer.py,
`_calculate_rewards`): every dataset column but the prompt is passed by name:

    output_reward_func = await reward_func(
        prompts=prompts, completions=completions, completion_ids=completion_ids_list,
        trainer_state=self.state, log_extra=..., log_metric=..., **reward_kwargs)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producer.adapters._common import gold_text, grade_pairs_async, reward_config
from workers.models import Status

__all__ = ["math_reward"]

_GOLD_COLUMNS = ("solution", "answer", "ground_truth")


def completion_text(completion: object) -> str:
    """A plain completion, or the assistant contents of a conversational one."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        parts = []
        for message in completion:
            if isinstance(message, dict) and message.get("role", "assistant") == (
                "assistant"
            ):
                content = message.get("content")
                if isinstance(content, str):
                    parts.append(content)
        return "".join(parts)
    return ""


async def math_reward(
    completions: Sequence[object], **kwargs: Any
) -> list[float | None]:
    """One reward per completion; None where the gold is missing or invalid."""
    golds: Sequence[object] = [None] * len(completions)
    for column in _GOLD_COLUMNS:
        if kwargs.get(column) is not None:
            golds = kwargs[column]
            break
    texts = [gold_text(gold) for gold in golds]
    graded = [i for i, gold in enumerate(texts) if gold is not None]
    pairs = [(completion_text(completions[i]), texts[i] or "") for i in graded]
    verdicts = await grade_pairs_async(pairs, kwargs)
    reward = reward_config(kwargs)
    rewards: list[float | None] = [None] * len(completions)
    for index, verdict in zip(graded, verdicts, strict=True):
        if verdict.status is not Status.INVALID_GOLD:
            rewards[index] = reward.score(verdict)
    return rewards
