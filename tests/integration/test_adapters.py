"""Each adapter called exactly as its framework calls it, grading on a real fleet
(directly and through a real `gradefleet serve`)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import multiprocessing
import pickle
from typing import Any

import pytest

from producer.adapters import nemo_gym, openrlhf, trl, verl
from producer.adapters.reward import RESULT_KEYS
from producer.client.fleet import GradingClient
from producer.client.grading import close_graders, grader_for
from tests.integration.test_serve import comparable, real_rollouts
from tests.serve_procs import ServeProcess

pytestmark = pytest.mark.integration


@pytest.fixture(params=["http", "fleet"])
def grader_url(request, service: ServeProcess, redis_server: str, monkeypatch) -> str:
    """GRADEFLEET_URL set to the service, or to the fleet's broker."""
    url = service.url if request.param == "http" else redis_server
    monkeypatch.setenv("GRADEFLEET_URL", url)
    return url


def _fleet_verdicts(redis_server: str, rollouts: list[dict[str, str]]) -> list[Any]:
    with GradingClient(redis_server) as client:
        return client.grade(rollouts)


async def _closing(coro: Any) -> Any:
    """Run `coro`, then close this loop's shared graders (no sockets left open)."""
    try:
        return await coro
    finally:
        await close_graders()


def test_verl_reward_loop_calls(grader_url: str, redis_server: str) -> None:
    rollouts = real_rollouts(64)
    expected = _fleet_verdicts(redis_server, rollouts)
    assert inspect.iscoroutinefunction(verl.compute_score)

    async def reward_loop() -> list[dict[str, Any]]:
        # verl's naive reward-loop manager: one awaited call per sample, all keywords,
        # gathered concurrently (RewardLoopWorker.compute_score_batch).
        calls = [
            verl.compute_score(
                data_source="lighteval/MATH",
                solution_str=r["response"],
                ground_truth=r["gold"],
                extra_info={"index": i, "num_turns": 2, "rollout_reward_scores": {}},
            )
            for i, r in enumerate(rollouts)
        ]
        return await asyncio.gather(*calls)

    results = asyncio.run(_closing(reward_loop()))
    assert all(tuple(r) == RESULT_KEYS for r in results)
    assert [r["status"] for r in results] == [v.status.value for v in expected]
    assert [r["pred"] for r in results] == [v.extracted or "" for v in expected]
    assert [r["score"] for r in results] == [float(v.correct) for v in expected]
    assert [r["acc"] for r in results] == [v.correct for v in expected]


def test_verl_sync_twin_from_the_default_executor(grader_url: str) -> None:
    rollouts = real_rollouts(16)

    async def reward_loop() -> list[dict[str, Any]]:
        # verl runs a sync compute_score in the loop's default executor:
        #   await self.loop.run_in_executor(None, lambda: self.compute_score(...))
        loop = asyncio.get_running_loop()
        calls = [
            loop.run_in_executor(
                None,
                lambda r=r: verl.compute_score_sync(
                    data_source="openai/gsm8k",
                    solution_str=r["response"],
                    ground_truth=r["gold"],
                    extra_info=None,
                    reward_router_address=None,
                ),
            )
            for r in rollouts
        ]
        return await asyncio.gather(*calls)

    results = asyncio.run(reward_loop())
    assert all(tuple(r) == RESULT_KEYS for r in results)
    assert all(r["status"] != "error" for r in results)


def test_verl_batch_manager_call(grader_url: str, redis_server: str) -> None:
    rollouts = real_rollouts(48)
    expected = _fleet_verdicts(redis_server, rollouts)
    # verl's batch reward manager: one call per step, keyword lists plus the
    # config's reward_kwargs.
    results = verl.compute_score_batch(
        data_sources=["math_dapo"] * len(rollouts),
        solution_strs=[r["response"] for r in rollouts],
        ground_truths=[r["gold"] for r in rollouts],
        extra_infos=[{"index": i} for i in range(len(rollouts))],
        format_reward=0.1,
    )
    assert all(tuple(r) == RESULT_KEYS for r in results)
    assert [r["status"] for r in results] == [v.status.value for v in expected]
    assert [r["score"] for r in results] == [
        float(v.correct) + (0.1 if v.format_valid else 0.0) for v in expected
    ]


def test_trl_math_reward_plain_and_conversational(grader_url: str) -> None:
    assert inspect.iscoroutinefunction(trl.math_reward)
    assert inspect.iscoroutinefunction(
        functools.partial(trl.math_reward, grader_url=grader_url)
    )
    assert pickle.loads(pickle.dumps(trl.math_reward)) is trl.math_reward
    completions = [r"so \boxed{4}", r"\boxed{5}", r"\boxed{6}", "no idea"]
    conversational = [[{"role": "assistant", "content": c}] for c in completions]
    golds = ["4", "4", "\\frac{", "1"]

    async def step(batch: list[Any]) -> list[float | None]:
        # GRPOTrainer._calculate_rewards: every dataset column but the prompt.
        return await trl.math_reward(
            prompts=["q"] * 4,
            completions=batch,
            completion_ids=[[1, 2]] * 4,
            trainer_state=None,
            log_extra=lambda *a, **k: None,
            log_metric=lambda *a, **k: None,
            solution=golds,
            level=["1"] * 4,
        )

    plain = asyncio.run(_closing(step(completions)))
    chat = asyncio.run(_closing(step(conversational)))
    assert plain == chat
    assert plain == [1.0, 0.0, None, 0.0]  # None: invalid gold, not applicable


def _spawned_trl_call(url: str, queue: Any) -> None:
    import os

    os.environ["GRADEFLEET_URL"] = url
    queue.put(asyncio.run(trl.math_reward(completions=[r"\boxed{9}"], answer=["9"])))


def test_trl_math_reward_runs_in_a_spawned_process(grader_url: str) -> None:
    # AsyncGRPO pickles reward functions into a spawned process: it must import
    # cleanly there and connect lazily.
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    proc = context.Process(target=_spawned_trl_call, args=(grader_url, queue))
    proc.start()
    try:
        assert queue.get(timeout=120) == [1.0]
    finally:
        proc.join(timeout=60)
    assert proc.exitcode == 0


def test_openrlhf_reward_func_per_sample_threads(grader_url: str) -> None:
    prompt = "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    samples = [
        (prompt + r"\boxed{2}<|im_end|><|endoftext|>", prompt, "2"),
        (prompt + r"\boxed{3}<|im_end|>", prompt, "2"),
    ] * 10

    async def executor() -> list[Any]:
        # SingleTurnRolloutExecutor._fetch_rewards, once per sample:
        #   await asyncio.gather(asyncio.to_thread(self.reward_func, queries, prompts,
        #   labels))
        calls = [
            asyncio.gather(asyncio.to_thread(openrlhf.reward_func, [q], [p], [label]))
            for q, p, label in samples
        ]
        return [payload[0] for payload in await asyncio.gather(*calls)]

    payloads = asyncio.run(executor())
    assert [p["rewards"] for p in payloads] == [[1.0], [0.0]] * 10
    assert all(p["scores"] == p["rewards"] for p in payloads)
    assert payloads[1]["extra_logs"]["status"] == ["wrong"]


def test_nemo_gym_verify(grader_url: str) -> None:
    body = {
        "responses_create_params": {"input": []},
        "response": {
            "output": [
                {
                    "type": "message",
                    "content": [{"type": "output_text", "text": r"\boxed{12}"}],
                }
            ]
        },
        "question": "3*4?",
        "expected_answer": "12",
    }
    answer = asyncio.run(_closing(nemo_gym.verify(body)))
    assert answer["reward"] == 1.0
    assert answer["extracted_answer"] == "12"
    assert {k: answer[k] for k in body} == body


def test_adapters_match_the_fleet_client(grader_url: str, redis_server: str) -> None:
    rollouts = real_rollouts(40)
    expected = [comparable(v) for v in _fleet_verdicts(redis_server, rollouts)]

    async def through_grader() -> list[Any]:
        grader = grader_for()
        try:
            return [comparable(v) for v in await grader.grade(rollouts)]
        finally:
            await grader.aclose()

    assert asyncio.run(through_grader()) == expected


def test_registry_gives_one_grader_per_loop(grader_url: str) -> None:
    async def twice() -> bool:
        return grader_for() is grader_for()

    assert asyncio.run(_closing(twice()))
    first: list[Any] = []

    async def remember() -> None:
        first.append(grader_for())

    asyncio.run(_closing(remember()))
    asyncio.run(_closing(remember()))
    assert first[0] is not first[1]  # each event loop gets its own
