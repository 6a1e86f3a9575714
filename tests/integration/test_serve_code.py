"""Code rollouts through `gradefleet serve` (real uvicorn, real fleet or embedded
pool, real sandboxes): `/v1/grade` with code items beside math ones, math callers
never held by a slow code batch, `/readyz`'s code check (fleet and embedded), NeMo
Gym `code_gen`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from producer.client.fleet import GradingClient
from tests.code_mixed import CODE
from tests.integration.test_serve import comparable, real_rollouts
from tests.serve_procs import ServeProcess, start_serve
from workers.code.item import encode_code_gold
from workers.models import Rollout

pytestmark = pytest.mark.integration

# Sleeps 2.5 s (no CPU: within the default 4 s per test), then answers right.
SLOW_PROGRAM = "```python\nimport time\ntime.sleep(2.5)\nprint(int(input()) + 1)\n```"
SLOW_TESTS = {"tests": {"inputs": ["41\n"], "outputs": ["42\n"]}}


def _jsonl(name: str) -> list[dict[str, Any]]:
    with (CODE / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def mbpp_items(count: int = 4) -> list[dict[str, Any]]:
    """MBPP rows as `/v1/grade` items: the reference program, then a wrong one."""
    items = []
    for row in _jsonl("mbpp_samples.jsonl")[:count]:
        right = f"```python\n{row['canonical_solution']}\n```"
        for response in (right, "```python\ndef nothing():\n    return 0\n```"):
            items.append({"response": response, "test_list": row["test_list"]})
    return items


def test_v1_grade_takes_code_items_beside_math(
    service: ServeProcess, redis_server: str
) -> None:
    math = real_rollouts(8)
    code = mbpp_items()
    items = [*math[:4], *code, *math[4:]]
    reply = httpx.post(service.url + "/v1/grade", json={"items": items}, timeout=120)
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    # The same rollouts through the fleet client: code golds are the rows' tests.
    rollouts = [
        Rollout(item["response"], item.get("gold") or encode_code_gold(item))
        for item in items
    ]
    with GradingClient(redis_server) as client:
        expected = [comparable(v) for v in client.grade(rollouts)]
    assert [comparable(r) for r in results] == expected
    code_results = results[4 : 4 + len(code)]
    assert [r["kind"] for r in code_results] == ["code"] * len(code)
    assert [r["status"] for r in code_results] == ["correct", "wrong"] * 4
    assert all(r["tests_total"] >= 3 for r in code_results)
    assert [r["score"] for r in code_results] == [1.0, 0.0] * 4
    assert all("kind" not in r for r in results[:4] + results[-4:])


def test_v1_grade_code_item_with_unusable_tests_is_a_verdict(
    service: ServeProcess,
) -> None:
    items = [
        {"response": "print(1)", "tests": {"inputs": [], "outputs": []}},
        {"response": r"\boxed{2}", "gold": "2"},
    ]
    reply = httpx.post(service.url + "/v1/grade", json={"items": items}, timeout=60)
    assert reply.status_code == 200, reply.text
    bad, math = reply.json()["results"]
    assert (bad["status"], bad["kind"]) == ("invalid_gold", "code")
    assert math["status"] == "correct"


def test_math_callers_are_not_held_by_a_slow_code_batch(tmp_path: Path) -> None:
    # Given an embedded service whose pool grades one batch at a time (no cache:
    # the slow program must run every time)
    server = start_serve(
        tmp_path, args=["--processes", "1"], env={"GRADEFLEET_NO_CACHE": "1"}
    )
    try:
        url = server.url + "/v1/grade"
        slow = {"items": [{"response": SLOW_PROGRAM, **SLOW_TESTS}]}
        math = {"items": real_rollouts(4)}

        async def scenario() -> tuple[bool, dict[str, Any], dict[str, Any]]:
            async with httpx.AsyncClient(timeout=120) as client:
                await client.post(url, json=math)  # the math pool is warm
                code_call = asyncio.ensure_future(client.post(url, json=slow))
                # Wait until the code item is accepted (the backlog gauge shows it)
                while not code_call.done():
                    metrics = (await client.get(server.url + "/metrics")).text
                    if "gradefleet_service_backlog_rollouts 1.0" in metrics:
                        break
                    await asyncio.sleep(0.02)
                # When a math request comes in while the code batch runs
                math_reply = await client.post(url, json=math)
                code_pending = not code_call.done()
                code_reply = await code_call
                return code_pending, math_reply.json(), code_reply.json()

        code_pending, math_body, code_body = asyncio.run(scenario())
        # Then the math request was answered while the code request was pending
        assert code_pending
        assert all(r["status"] != "timeout" for r in math_body["results"])
        # And the slow program still got its verdict
        (verdict,) = code_body["results"]
        assert (verdict["kind"], verdict["status"]) == ("code", "correct")
    finally:
        server.stop()


def test_readyz_on_a_fleet_says_whether_a_live_worker_takes_code(
    service: ServeProcess,
) -> None:
    reply = httpx.get(service.url + "/readyz", timeout=60)
    assert reply.status_code == 200, reply.text
    code = reply.json()["code"]
    # The module's two workers take both kinds (this machine runs the sandbox).
    assert code["ready"] is True, code
    assert "2 live workers take code" in code["detail"]


def test_readyz_embedded_says_whether_this_node_runs_code_sandboxes(
    tmp_path: Path,
) -> None:
    server = start_serve(tmp_path, args=["--processes", "1"])
    try:
        reply = httpx.get(server.url + "/readyz", timeout=60)
        assert reply.status_code == 200, reply.text
        code = reply.json()["code"]
        # This machine has root and bwrap: the probe program ran in a sandbox.
        assert code["ready"] is True, code
        assert "probe program" in code["detail"]
        again = httpx.get(server.url + "/readyz", timeout=60).json()["code"]
        assert again == code  # cached: the same answer, not a second run
    finally:
        server.stop()


def nemo_code_gen_requests() -> list[tuple[dict[str, Any], float]]:
    """NeMo Gym's example rollouts as `code_gen` verify requests, with the reward
    NeMo Gym gave each (resources_servers/code_gen)."""
    problems = {
        row["responses_create_params"]["input"][0]["content"]: row
        for row in _jsonl("nemo_gym_code_gen_problems.jsonl")
    }
    requests = []
    for rollout in _jsonl("nemo_gym_code_gen_rollouts.jsonl"):
        problem = problems[rollout["responses_create_params"]["input"][0]["content"]]
        body = {
            "responses_create_params": rollout["responses_create_params"],
            "response": rollout["response"],
            "verifier_metadata": problem["verifier_metadata"],
        }
        requests.append((body, float(rollout["reward"])))
    return requests


def test_nemo_gym_code_gen_verify_route(service: ServeProcess) -> None:
    requests = nemo_code_gen_requests()
    assert {reward for _, reward in requests} == {0.0, 1.0}  # both outcomes seen
    for body, reward in requests:
        reply = httpx.post(
            service.url + "/compat/nemo-gym/verify", json=body, timeout=120
        )
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert answer["reward"] == reward  # NeMo Gym's own verdict on this rollout
        assert answer["verifier_metadata"] == body["verifier_metadata"]  # echoed
        assert answer["response"] == body["response"]
        assert answer["extracted_model_code"]
        assert answer["tests_total"] == len(
            body["verifier_metadata"]["unit_tests"]["inputs"]
        )
    # A request with neither a gold nor tests names what is missing.
    bad = httpx.post(
        service.url + "/compat/nemo-gym/verify",
        json={"response": {"output": []}},
        timeout=60,
    )
    assert bad.status_code == 422
    assert "unit_tests" in bad.text


def test_v1_grade_takes_verl_shaped_code_items(service: ServeProcess) -> None:
    spec = {"inputs": ["1\n", "2\n"], "outputs": ["2\n", "3\n"]}
    program = "```python\nprint(int(input()) + 1)\n```"
    items = [
        {"solution_str": program, "ground_truth": spec},  # an object
        {"solution_str": program, "ground_truth": json.dumps(spec)},  # JSON text
        {"response": program, "reward_model": {"ground_truth": json.dumps(spec)}},
    ]
    reply = httpx.post(service.url + "/v1/grade", json={"items": items}, timeout=60)
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [(r["kind"], r["status"], r["tests_passed"]) for r in results] == [
        ("code", "correct", 2)
    ] * 3
    # An object that is no test spec is refused, naming the item and field.
    bad = {"items": [{"response": "x", "ground_truth": {"a": 1}}]}
    reply = httpx.post(service.url + "/v1/grade", json=bad, timeout=60)
    assert reply.status_code == 422
    (error,) = reply.json()["detail"]
    assert error["loc"] == ["body", "items", 0]
    assert "ground_truth" in error["msg"]
