"""OpenRLHF reward function file: `--reward.remote_url /path/to/reward_func.py`.

OpenRLHF imports `reward_func` from a `.py` file given as the reward URL; a one-line
file does it (see README): `from producer.adapters.openrlhf import reward_func`.
The result is the HTTP route's (`/compat/openrlhf/get_reward`): `rewards`, `scores`
and `extra_logs` lists aligned with `queries`. Each `query` is the prompt plus the
response with special tokens kept; the prompt prefix and trailing end/pad tokens are
cut before grading. OpenRLHF calls it once per sample in a thread; those concurrent
calls share batches through one event loop per process.

Code rows: a label that is a test spec (a dict, or JSON text of one: `inputs`/
`outputs`/`fn_name`, `assert_case`, ... — point `--label_key` at the tests column),
or a `tests` list passed beside the labels, is graded by running the response's
program against those tests in gradefleet's sandbox (reward 1 when all pass).

OpenRLHF's call site (OpenRLHF/OpenRLHF@3c3be62, SingleTurnRolloutExecutor):

    async def _fetch_rewards(self, queries, prompts, labels):
        if self.reward_func is not None:
            return await asyncio.gather(
                asyncio.to_thread(self.reward_func, queries, prompts, labels))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producer.adapters._common import grade_pairs_blocking, reward_config
from producer.adapters.compat import (
    code_gold,
    label_gold,
    openrlhf_payload,
    strip_query,
    tests_row,
)

__all__ = ["reward_func"]


def reward_func(
    queries: Sequence[str],
    prompts: Sequence[str] | None = None,
    labels: Sequence[Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """`{"rewards", "scores", "extra_logs"}` for OpenRLHF (lists aligned with
    `queries`)."""
    prompt_list: Sequence[str | None] = prompts or [None] * len(queries)
    label_list: Sequence[Any] = labels or [None] * len(queries)
    tests: Sequence[Any] = kwargs.get("tests") or [None] * len(queries)
    pairs = [
        (
            strip_query(str(query), prompt),
            label_gold(label) if test is None else code_gold(tests_row(test)),
        )
        for query, prompt, label, test in zip(
            queries, prompt_list, label_list, tests, strict=True
        )
    ]
    verdicts = grade_pairs_blocking(pairs, kwargs)
    return openrlhf_payload(verdicts, reward_config(kwargs))
