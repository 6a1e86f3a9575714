"""verl reward functions: `custom_reward_function.path` points at this module.

- `compute_score` (async) for verl's reward loop, which awaits one call per sample:
  `custom_reward_function.name=compute_score`.
- `compute_score_sync`, the same as a plain function (the `remote` reward manager
  needs a sync function).
- `compute_score_batch` for `reward_model.reward_manager=batch` (one call per step).

Each returns `{"score", "acc", "pred", "status", "format_valid", "reason",
"grader_version"}` (same keys on every call: verl gathers each key per sample into
`reward_extra_info`). `custom_reward_function.reward_kwargs` may set `grader_url`,
`format_reward`, `<status>_score`, `deadline_s`, `allow_fallback`, `continuous`.

Code rows. A sample whose `data_source` names a code set (`CODE_DATA_SOURCES`:
codecontests, apps, taco, codeforces, livecodebench, primeintellect, humaneval,
mbpp; any spelling that contains one, e.g. `deepmind/code_contests`), or whose
`ground_truth` is a test spec (a dict or JSON text of one: `inputs`/`outputs`/
`fn_name`, or `assert_case`, as verl's `prime_code` and `sandbox_fusion` take it), is
graded by running its program against those tests in gradefleet's sandbox. `score`
is 1/0 (the reward mapping) unless `continuous=True` is passed (verl's own
`prime_code.compute_score(..., continuous=True)`, which its default reward uses for
code sets): then the fraction of tests passed. `acc` is whether all passed.

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

import re
from collections.abc import Mapping, Sequence
from typing import Any

from producer.adapters._common import (
    code_gold,
    gold_text,
    grade_pairs_async,
    grade_pairs_blocking,
    reward_config,
    spec_gold,
)
from producer.adapters.reward import RewardConfig, result_dict
from workers.models import Verdict

__all__ = [
    "CODE_DATA_SOURCES",
    "compute_score",
    "compute_score_batch",
    "compute_score_sync",
]

# verl routes the first four to `prime_code` (or SandboxFusion); its forks add the
# rest. Matched against the data source with everything but letters and digits
# removed, lower case, as a substring.
CODE_DATA_SOURCES = (
    "codecontests",
    "apps",
    "taco",
    "codeforces",
    "livecodebench",
    "primeintellect",
    "humaneval",
    "mbpp",
)
_NOT_ALNUM = re.compile(r"[^a-z0-9]")


def is_code_source(data_source: object) -> bool:
    """Whether verl's `data_source` names a code data set."""
    if not isinstance(data_source, str):
        return False
    name = _NOT_ALNUM.sub("", data_source.lower())
    return any(source in name for source in CODE_DATA_SOURCES)


def sample_gold(data_source: object, ground_truth: Any) -> str:
    """The gold to grade a verl sample against: its tests, encoded, for a code
    sample (a code source's unusable tests are graded `invalid_gold`); else the
    math answer's text."""
    found = spec_gold(ground_truth)
    if found is not None:
        return found
    if is_code_source(data_source):
        value = ground_truth if isinstance(ground_truth, str | Mapping) else None
        return code_gold({"ground_truth": value})
    return gold_text(ground_truth) or ""


def _result(verdict: Verdict, reward: RewardConfig, continuous: bool) -> dict[str, Any]:
    result = result_dict(verdict, reward)
    if continuous and verdict.kind == "code":
        # From the counts, not `verdict.score`: over HTTP that field is the reward.
        total = verdict.tests_total or 0
        result["score"] = (verdict.tests_passed or 0) / total if total else 0.0
    return result


async def compute_score(
    data_source: str | None = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """One sample's reward dict (awaited by verl's reward loop)."""
    gold = sample_gold(data_source, ground_truth)
    (verdict,) = await grade_pairs_async([(str(solution_str or ""), gold)], kwargs)
    return _result(verdict, reward_config(kwargs), bool(kwargs.get("continuous")))


def compute_score_sync(
    data_source: str | None = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """`compute_score` for sync call sites; concurrent callers still coalesce."""
    gold = sample_gold(data_source, ground_truth)
    (verdict,) = grade_pairs_blocking([(str(solution_str or ""), gold)], kwargs)
    return _result(verdict, reward_config(kwargs), bool(kwargs.get("continuous")))


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
    # Not `data_sources or ...`: verl passes numpy arrays (no truth value).
    sources: Sequence[str | None] = (
        data_sources if len(data_sources) else [None] * len(solution_strs)
    )
    pairs = [
        (str(text or ""), sample_gold(source, gold))
        for text, source, gold in zip(
            solution_strs, sources, ground_truths, strict=True
        )
    ]
    reward = reward_config(kwargs)
    continuous = bool(kwargs.get("continuous"))
    verdicts = grade_pairs_blocking(pairs, kwargs)
    return [_result(v, reward, continuous) for v in verdicts]
