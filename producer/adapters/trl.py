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

Code rows. A row with test columns (`tests`, `input_output`, `test_list`,
`test` + `entry_point`, a `ground_truth` holding a test spec, ... : the CLI's code
fields, `workers.code.item.CODE_ROW_FIELDS`; a `tests` list of assert strings is
read as MBPP's `test_list`) is graded by running the completion's program
against them in gradefleet's sandbox: 1 when every test passes, else 0. The same
function grades math and code rows side by side; `code_reward` is it under a name
that reads right in TRL's logs. The (string) prompt goes with a row that has an
`entry_point` (HumanEval: the completion is the body under the prompt's
signature); any other prompt is left out of the program.

TRL's call site (huggingface/trl@f2cd577, trl/trainer/grpo_trainer.py,
`_calculate_rewards`): every dataset column but the prompt is passed by name:

    output_reward_func = await reward_func(
        prompts=prompts, completions=completions, completion_ids=completion_ids_list,
        trainer_state=self.state, log_extra=..., log_metric=..., **reward_kwargs)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producer.adapters._common import (
    code_gold,
    gold_text,
    grade_pairs_async,
    reward_config,
)
from producer.adapters.compat import tests_row
from workers.code.item import CODE_NESTED_FIELDS, CODE_ROW_FIELDS, is_code_row
from workers.models import Status

__all__ = ["code_reward", "math_reward"]

_GOLD_COLUMNS = ("solution", "answer", "ground_truth")
# The columns a code row's tests are read from (TRL's own `prompts` goes as prompt).
_CODE_COLUMNS = tuple(
    name for name in (*CODE_ROW_FIELDS, *CODE_NESTED_FIELDS) if name != "prompt"
)


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


def _column(kwargs: dict[str, Any], name: str) -> Sequence[object] | None:
    values = kwargs.get(name)
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        return None
    return values


def code_golds(kwargs: dict[str, Any], count: int) -> list[str | None]:
    """Per row, the code gold of a row with tests (None: not a code row)."""
    columns = {
        name: values
        for name in _CODE_COLUMNS
        if (values := _column(kwargs, name)) is not None
    }
    if not columns:
        return [None] * count  # a math data set: no row to look at
    prompts = _column(kwargs, "prompts")
    golds: list[str | None] = []
    for index in range(count):
        row = {name: values[index] for name, values in columns.items()}
        if row.get("tests") is not None:
            row.update(tests_row(row.pop("tests")))
        if (
            prompts is not None
            and isinstance(prompts[index], str)
            and row.get("entry_point") is not None
        ):
            # HumanEval's prompt is the signature the completion's body goes
            # under; any other prompt is a question, never part of the program.
            row["prompt"] = prompts[index]
        golds.append(code_gold(row) if is_code_row(row) else None)
    return golds


async def math_reward(
    completions: Sequence[object], **kwargs: Any
) -> list[float | None]:
    """One reward per completion; None where the gold is missing or invalid."""
    golds: Sequence[object] = [None] * len(completions)
    for column in _GOLD_COLUMNS:
        if kwargs.get(column) is not None:
            golds = kwargs[column]
            break
    texts = [
        code or gold_text(gold)
        for code, gold in zip(code_golds(kwargs, len(completions)), golds, strict=True)
    ]
    graded = [i for i, gold in enumerate(texts) if gold is not None]
    pairs = [(completion_text(completions[i]), texts[i] or "") for i in graded]
    verdicts = await grade_pairs_async(pairs, kwargs)
    reward = reward_config(kwargs)
    rewards: list[float | None] = [None] * len(completions)
    for index, verdict in zip(graded, verdicts, strict=True):
        if verdict.status is not Status.INVALID_GOLD:
            rewards[index] = reward.score(verdict)
    return rewards


async def code_reward(
    completions: Sequence[object], **kwargs: Any
) -> list[float | None]:
    """`math_reward` by its code name: a row with tests is graded by them, 1 when
    all pass, else 0, None where they are unusable (a row without tests is graded
    as math)."""
    return await math_reward(completions, **kwargs)
