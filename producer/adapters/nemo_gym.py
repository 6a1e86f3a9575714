"""NeMo Gym verify: `verify(body)` with a resources server's request/response, for
`math_with_judge` (math) and `code_gen` (unit tests) requests.

Mirrors `resources_servers/math_with_judge` (NVIDIA-NeMo/Gym@05a4377): the response
text is the concatenation of the `output_text` contents of `message` items in
`body["response"]["output"]`; the reply echoes the request and adds `reward`,
`extracted_answer` and `library_reward` (and `gradefleet_status`). A NeMo Gym server
can call it from its own `verify`, or point at `gradefleet serve`'s
`POST /compat/nemo-gym/verify`, which answers the same.

    async def verify(self, body: LibraryJudgeMathVerifyRequest)
        -> LibraryJudgeMathVerifyResponse:
        ...
        return LibraryJudgeMathVerifyResponse(**body.model_dump(), reward=reward,
            extracted_answer=extracted_answer, library_reward=library_reward, ...)

A `code_gen` request carries `verifier_metadata.unit_tests` (`{inputs, outputs,
fn_name?}`, stdin/stdout or a function's calls) instead of `expected_answer`; the
program in the response text is run against them in gradefleet's sandbox and the
reply echoes the request with `reward` (1.0 only when every test passed),
`extracted_model_output`, `extracted_model_code`, `tests_passed`, `tests_total`,
`failure` and `gradefleet_status` (resources_servers/code_gen, NVIDIA-NeMo/Gym@07d6b0d).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from producer.adapters._common import gold_text, grade_pairs_async, reward_config
from producer.adapters.compat import (
    nemo_gym_code_fields,
    nemo_gym_code_gold,
    nemo_gym_fields,
    nemo_gym_text,
    nemo_gym_unit_tests,
)

__all__ = ["verify"]


async def verify(body: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """The verify response for one rollout (a dict, or a pydantic model's dump)."""
    data = dict(body.model_dump() if hasattr(body, "model_dump") else body)
    response = data.get("response")
    text = nemo_gym_text(response if isinstance(response, dict) else {})
    unit_tests = nemo_gym_unit_tests(data)
    if unit_tests is not None:
        pair = (text, nemo_gym_code_gold(unit_tests))
        (verdict,) = await grade_pairs_async([pair], kwargs)
        data.update(nemo_gym_code_fields(verdict, reward_config(kwargs), text))
        return data
    gold = gold_text(data.get("expected_answer")) or ""
    (verdict,) = await grade_pairs_async([(text, gold)], kwargs)
    data.update(nemo_gym_fields(verdict, reward_config(kwargs)))
    return data
