"""Each adapter called on code rows exactly as its framework calls it (verl's reward
loop and batch manager, TRL's reward call, OpenRLHF's per-sample threads, NeMo Gym's
`code_gen` verify), grading on a real fleet directly and through a real
`gradefleet serve`; programs run in real sandboxes.

None of the frameworks installs here (verl, TRL, OpenRLHF, NeMo Gym pull in torch
and GPU stacks), so their call sites are reproduced from their sources, as
tests/integration/test_adapters.py does for math.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from producer.adapters import nemo_gym, openrlhf, trl, verl
from producer.adapters.reward import RESULT_KEYS
from producer.client.fleet import GradingClient
from producer.client.grading import close_graders
from tests.integration.test_serve import real_rollouts
from tests.integration.test_serve_code import _jsonl, nemo_code_gen_requests
from tests.serve_procs import ServeProcess
from workers.code.item import encode_code_gold
from workers.models import Rollout

pytestmark = pytest.mark.integration

WRONG = "```python\ndef nothing():\n    return 0\n```"
# verl's prime_code shape: stdin/stdout tests; this program passes two of three.
PLUS_ONE = "```python\nprint(int(input()) + 1)\n```"
STDIO_SPEC = json.dumps(
    {"inputs": ["1\n", "2\n", "3\n"], "outputs": ["2\n", "3\n", "5\n"]}
)
# verl's call-based shape (TACO/APPS `fn_name`): arguments per test, results.
CALL_SPEC = json.dumps(
    {"fn_name": "add", "inputs": [[1, 2], [5, 5]], "outputs": [3, 10]}
)
ADD = "```python\ndef add(a, b):\n    return a + b\n```"


@pytest.fixture(params=["http", "fleet"])
def grader_url(request, service: ServeProcess, redis_server: str, monkeypatch) -> str:
    url = service.url if request.param == "http" else redis_server
    monkeypatch.setenv("GRADEFLEET_URL", url)
    return url


async def _closing(coro: Any) -> Any:
    try:
        return await coro
    finally:
        await close_graders()


def verl_rows() -> list[dict[str, Any]]:
    """verl samples: MBPP rows as `assert_case` specs (reference program, then a
    wrong one), a stdin spec, a call spec, and math rows between them."""
    rows = []
    for row in _jsonl("mbpp_samples.jsonl")[:4]:
        truth = json.dumps({"assert_case": row["test_list"]})
        right = f"```python\n{row['canonical_solution']}\n```"
        rows.append({"data_source": "mbpp", "response": right, "ground_truth": truth})
        rows.append({"data_source": "mbpp", "response": WRONG, "ground_truth": truth})
    rows.append(
        {
            "data_source": "codecontests",
            "response": PLUS_ONE,
            "ground_truth": STDIO_SPEC,
        }
    )
    # A data source verl does not route to code: the test spec is recognised itself.
    rows.append({"data_source": "my_set", "response": ADD, "ground_truth": CALL_SPEC})
    for math in real_rollouts(4):
        rows.append(
            {
                "data_source": "lighteval/MATH",
                "response": math["response"],
                "ground_truth": math["gold"],
            }
        )
    return rows


def _fleet_verdicts(redis_server: str, rows: list[dict[str, Any]]) -> list[Any]:
    rollouts = [
        Rollout(
            row["response"],
            encode_code_gold({"ground_truth": row["ground_truth"]})
            if row["data_source"] != "lighteval/MATH"
            else row["ground_truth"],
        )
        for row in rows
    ]
    with GradingClient(redis_server) as client:
        return client.grade(rollouts)


def test_verl_reward_loop_on_code_rows(grader_url: str, redis_server: str) -> None:
    rows = verl_rows()
    expected = _fleet_verdicts(redis_server, rows)

    async def reward_loop(**reward_kwargs: Any) -> list[dict[str, Any]]:
        # verl's reward-loop manager: one awaited call per sample, gathered.
        calls = [
            verl.compute_score(
                data_source=row["data_source"],
                solution_str=row["response"],
                ground_truth=row["ground_truth"],
                extra_info={"index": i},
                **reward_kwargs,
            )
            for i, row in enumerate(rows)
        ]
        return await asyncio.gather(*calls)

    results = asyncio.run(_closing(reward_loop()))
    assert all(tuple(r) == RESULT_KEYS for r in results)
    assert [r["status"] for r in results] == [v.status.value for v in expected]
    assert [r["acc"] for r in results] == [v.correct for v in expected]
    assert [r["score"] for r in results] == [float(v.correct) for v in expected]
    statuses = [r["status"] for r in results[:10]]
    assert statuses == ["correct", "wrong"] * 4 + ["wrong", "correct"]
    # continuous=True (verl's prime_code default for code sets): fraction passed.
    results = asyncio.run(_closing(reward_loop(continuous=True)))
    assert results[8]["score"] == pytest.approx(2 / 3)
    assert results[8]["acc"] is False
    assert [r["score"] for r in results[:8]] == [1.0, 0.0] * 4
    assert [r["score"] for r in results[10:]] == [
        float(v.correct) for v in expected[10:]
    ]


def test_verl_batch_manager_on_code_rows(grader_url: str) -> None:
    rows = verl_rows()
    # verl's batch manager passes the non-tensor batch's numpy arrays.
    results = verl.compute_score_batch(
        data_sources=np.array([row["data_source"] for row in rows], dtype=object),
        solution_strs=[row["response"] for row in rows],
        ground_truths=np.array([row["ground_truth"] for row in rows], dtype=object),
        extra_infos=[{"index": i} for i in range(len(rows))],
        continuous=True,
    )
    assert all(tuple(r) == RESULT_KEYS for r in results)
    assert [r["score"] for r in results[:9]] == pytest.approx([1.0, 0.0] * 4 + [2 / 3])
    # A code source whose ground truth is no test spec: invalid_gold, score 0.
    (bad,) = verl.compute_score_batch(
        data_sources=["codecontests"], solution_strs=[ADD], ground_truths=["42"]
    )
    assert (bad["status"], bad["score"]) == ("invalid_gold", 0.0)


def test_trl_reward_takes_a_tests_column(grader_url: str) -> None:
    math = real_rollouts(2)
    mbpp = _jsonl("mbpp_samples.jsonl")[:2]
    right = [f"```python\n{row['canonical_solution']}\n```" for row in mbpp]

    async def trl_call() -> list[float | None]:
        # TRL: every dataset column but the prompt is passed by name, as lists; a
        # math row has None in the code column, a code row None in the gold one.
        return await trl.code_reward(
            prompts=["q"] * 6,
            completions=[
                [{"role": "assistant", "content": right[0]}],
                WRONG,
                right[1],
                math[0]["response"],
                math[1]["response"],
                "no code at all",
            ],
            completion_ids=[[1]] * 6,
            trainer_state=None,
            tests=[
                *(row["test_list"] for row in mbpp),
                *(mbpp[1]["test_list"], None, None),
                {"inputs": [], "outputs": []},
            ],
            solution=[None, None, None, math[0]["gold"], math[1]["gold"], None],
        )

    rewards = asyncio.run(_closing(trl_call()))
    assert rewards[:3] == [1.0, 0.0, 1.0]
    verdict_math = [1.0 if r else 0.0 for r in rewards[3:5]]
    assert rewards[3:5] == verdict_math  # math rows graded as math (not None)
    assert rewards[5] is None  # unusable tests: "not applicable", like a bad gold


def test_openrlhf_reward_func_with_test_spec_labels(grader_url: str) -> None:
    mbpp = _jsonl("mbpp_samples.jsonl")[:3]
    prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    right = [
        f"{prompt}```python\n{r['canonical_solution']}\n```<|im_end|>" for r in mbpp
    ]
    labels = [json.dumps({"assert_case": r["test_list"]}) for r in mbpp]

    async def per_sample_threads() -> list[dict[str, Any]]:
        # OpenRLHF: reward_func(queries, prompts, labels) in a thread per sample;
        # the label column is the tests (a JSON test spec) or `tests` rides along.
        calls = [
            asyncio.to_thread(openrlhf.reward_func, [query], [prompt], [label])
            for query, label in zip(
                [*right, prompt + WRONG], [*labels, labels[0]], strict=True
            )
        ] + [
            asyncio.to_thread(
                openrlhf.reward_func, [query], [prompt], [None], tests=[r["test_list"]]
            )
            for query, r in zip(right, mbpp, strict=True)
        ]
        return await asyncio.gather(*calls)

    replies = asyncio.run(per_sample_threads())
    assert [r["rewards"][0] for r in replies] == [1.0] * 3 + [0.0] + [1.0] * 3
    assert [r["extra_logs"]["status"][0] for r in replies][3] == "wrong"
    assert all(r["extra_logs"]["status"][0] in {"wrong", "correct"} for r in replies)


def test_nemo_gym_code_gen_verify_adapter(grader_url: str) -> None:
    async def verify_all() -> list[tuple[dict[str, Any], float]]:
        pairs = nemo_code_gen_requests()
        answers = await asyncio.gather(*(nemo_gym.verify(body) for body, _ in pairs))
        return list(zip(answers, [reward for _, reward in pairs], strict=True))

    for answer, reward in asyncio.run(_closing(verify_all())):
        assert answer["reward"] == reward  # NeMo Gym's own verdict
        assert answer["extracted_model_output"]
        assert "verifier_metadata" in answer
