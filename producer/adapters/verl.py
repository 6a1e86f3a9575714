"""verl reward functions: `custom_reward_function.path` points at this module.

- `compute_score` (async) for verl's reward loop, which awaits one call per sample:
  `custom_reward_function.name=compute_score`.
- `compute_score_sync`, the same as a plain function (the `remote` reward manager
  needs a sync function).
- `compute_score_batch` for `reward_model.reward_manager=batch` (one call per step).

Each returns `{"score", "acc", "pred", "status", "format_valid", "reason",
"grader_version"}` (same keys on every call: verl gathers each key per sample into
`reward_extra_info`). `custom_reward_function.reward_kwargs` may set `grader_url`,
`format_reward`, `<status>_score`, `deadline_s`, `allow_fallback`.

verl's call sites (verl-project/verl, reward loop managers, e.g.
verl/experimental/reward_loop/reward_manager/naive.py at b178a3c):

    if self.is_async_reward_score:
        result = await self.compute_score(
            data_source=data_source,
            solution_str=response_str,
            ground_truth=ground_truth,
            extra_info=extra_info,
            **extra_reward_kwargs,
        )
    else:
        result = await self.loop.run_in_executor(None, lambda: self.compute_score(...))

and the batch manager (verl/workers/reward_manager/batch.py):

    scores = self.compute_score(data_sources=data_sources, solution_strs=responses_str,
        ground_truths=ground_truths, extra_infos=extras, **self.reward_kwargs)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producer.adapters._common import (
    gold_text,
    grade_pairs_async,
    grade_pairs_blocking,
    reward_config,
)
from producer.adapters.reward import result_dict

__all__ = ["compute_score", "compute_score_batch", "compute_score_sync"]


async def compute_score(
    data_source: str | None = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """One sample's reward dict (awaited by verl's reward loop)."""
    (verdict,) = await grade_pairs_async(
        [(str(solution_str or ""), gold_text(ground_truth) or "")], kwargs
    )
    return result_dict(verdict, reward_config(kwargs))


def compute_score_sync(
    data_source: str | None = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """`compute_score` for sync call sites; concurrent callers still coalesce."""
    (verdict,) = grade_pairs_blocking(
        [(str(solution_str or ""), gold_text(ground_truth) or "")], kwargs
    )
    return result_dict(verdict, reward_config(kwargs))


def compute_score_batch(
    data_sources: Sequence[str | None] = (),
    solution_strs: Sequence[str] = (),
    ground_truths: Sequence[Any] = (),
    extra_infos: Sequence[dict[str, Any] | None] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """A step's reward dicts in order (verl's `batch` reward manager)."""
    if len(solution_strs) != len(ground_truths):
        raise ValueError(
            f"{len(solution_strs)} solution_strs but {len(ground_truths)} ground_truths"
        )
    pairs = [
        (str(text or ""), gold_text(gold) or "")
        for text, gold in zip(solution_strs, ground_truths, strict=True)
    ]
    reward = reward_config(kwargs)
    return [result_dict(v, reward) for v in grade_pairs_blocking(pairs, kwargs)]
