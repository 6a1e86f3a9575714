"""`gradefleet serve` end to end: real uvicorn, real redis-server and workers, httpx."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from click.testing import CliRunner

from producer.cli import cli
from producer.client.fleet import GradingClient
from producer.client.grading import CoalescingGrader
from producer.client.http_client import HttpGrader
from producer.errors import DeadlinePassedError
from tests.helpers import qwen_groups
from tests.hooks import HANG
from tests.serve_procs import ServeProcess, post_json_many, start_serve
from workers import verifier
from workers.models import GradeOptions, Verdict
from workers.wire.lanes import BULK, INTERACTIVE, queue_for

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token-for-tests"


def real_rollouts(limit: int) -> list[dict[str, str]]:
    rollouts = [r for group in qwen_groups() for r in group][:limit]
    return [{"response": r.response, "gold": r.gold} for r in rollouts]


def comparable(verdict: Verdict | dict[str, object]) -> dict[str, object]:
    """A verdict's fields except `cached` (the fleet's cache may answer twice)."""
    data = verdict.to_dict() if isinstance(verdict, Verdict) else dict(verdict)
    data.pop("cached", None)
    data.pop("score", None)
    return data


@pytest.fixture(scope="module")
def secured(fleet, redis_server: str, tmp_path_factory) -> Iterator[ServeProcess]:
    """The same with a token from the environment."""
    server = start_serve(
        tmp_path_factory.mktemp("serve-token"),
        broker=redis_server,
        env={"GRADEFLEET_SERVE_TOKEN": TOKEN},
    )
    try:
        yield server
    finally:
        server.stop()


def test_http_fleet_and_embedded_give_identical_verdicts(
    service: ServeProcess, redis_server: str
) -> None:
    rollouts = real_rollouts(120)
    with GradingClient(redis_server) as client:
        fleet = [comparable(v) for v in client.grade(rollouts)]
    reply = httpx.post(service.url + "/v1/grade", json={"items": rollouts}, timeout=120)
    assert reply.status_code == 200
    body = reply.json()
    assert [comparable(r) for r in body["results"]] == fleet
    assert all(r["score"] == (1.0 if r["correct"] else 0.0) for r in body["results"])
    assert body["grader_version"] == body["results"][0]["grader_version"]

    async def through(url: str | None) -> list[dict[str, object]]:
        async with CoalescingGrader(url, processes=1) as grader:
            return [comparable(v) for v in await grader.grade(rollouts)]

    assert asyncio.run(through(service.url)) == fleet  # the HTTP backend
    assert asyncio.run(through(redis_server)) == fleet  # the native fleet backend
    assert asyncio.run(through(None)) == fleet  # the embedded pool


def test_every_cli_alias_is_accepted(service: ServeProcess) -> None:
    items = [
        {"completion": r"so \boxed{4}", "answer": 4},
        {"output": r"\boxed{5}", "solution": "5"},
        {"solution_str": r"\boxed{6}", "reward_model": {"ground_truth": "6"}},
        {"response": r"\boxed{7}", "expected_answer": "7", "extra": [1, 2]},
        {"response": r"\boxed{8}", "ground_truth": 8.0},
    ]
    reply = httpx.post(service.url + "/v1/grade", json={"items": items}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert [r["status"] for r in reply.json()["results"]] == ["correct"] * 5


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ({"response": "x"}, "no gold field"),
        ({"gold": "1"}, "no response field"),
        ({"response": 3, "gold": "1"}, "'response' must be a string"),
        ({"response": "x", "gold": [1]}, "'gold' must be a string or number"),
        ({"response": "x" * 1_000_001, "gold": "1"}, "characters (limit"),
    ],
)
def test_malformed_items_get_422_naming_index_and_field(
    service: ServeProcess, item: dict[str, object], words: str
) -> None:
    items = [{"response": "1", "gold": "1"}, item]
    reply = httpx.post(service.url + "/v1/grade", json={"items": items}, timeout=60)
    assert reply.status_code == 422
    (error,) = reply.json()["detail"]
    assert error["loc"] == ["body", "items", 1]
    assert words in error["msg"]


def test_unknown_fields_and_bad_options_are_refused(service: ServeProcess) -> None:
    url = service.url + "/v1/grade"
    one = [{"response": "1", "gold": "1"}]
    assert httpx.post(url, json={"items": one, "prio": 1}).status_code == 422
    assert httpx.post(url, json={"items": one, "options": {"x": 1}}).status_code == 422
    assert httpx.post(url, content=b"{not json").status_code == 422
    bad_header = {"X-Gradefleet-Deadline-S": "soon"}
    assert httpx.post(url, json={"items": one}, headers=bad_header).status_code == 400


def test_a_body_not_labelled_json_is_refused(service: ServeProcess) -> None:
    # A browser page may POST text/plain cross-site without a preflight.
    body = json.dumps({"items": [{"response": "1", "gold": "1"}]}).encode()
    url = service.url + "/v1/grade"
    for refused in ("text/plain", "application/x-www-form-urlencoded"):
        reply = httpx.post(url, content=body, headers={"Content-Type": refused})
        assert reply.status_code == 422, refused
    labelled = {"Content-Type": "application/json; charset=utf-8"}
    assert httpx.post(url, content=body, headers=labelled).status_code == 200


def test_failed_items_are_verdicts_and_the_deadline_answers_in_time(
    service: ServeProcess,
) -> None:
    items = [{"response": HANG, "gold": "1"}, {"response": r"\boxed{2}", "gold": "2"}]
    # The workers' item deadline is 1 s: the hang comes back as a `timeout` verdict.
    reply = httpx.post(service.url + "/v1/grade", json={"items": items}, timeout=60)
    assert reply.status_code == 200
    statuses = [r["status"] for r in reply.json()["results"]]
    assert statuses == ["timeout", "correct"]
    # A request deadline shorter than that: the service answers `timeout` itself.
    headers = {"X-Gradefleet-Deadline-S": "0.2"}
    reply = httpx.post(
        service.url + "/v1/grade",
        json={"items": [{"response": HANG + " again", "gold": "1"}]},
        headers=headers,
        timeout=60,
    )
    assert reply.status_code == 200
    (result,) = reply.json()["results"]
    assert result["status"] == "timeout"
    assert "request's deadline of 0.2 s" in result["reason"]


def test_openrlhf_route_cuts_prompt_and_special_tokens(service: ServeProcess) -> None:
    prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    body = {
        "query": [
            prompt + r"It is \boxed{4}.<|im_end|><|endoftext|><|endoftext|>",
            prompt + r"It is \boxed{5}.<|im_end|>",
            prompt + "no answer",
        ],
        "prompts": [prompt, prompt, prompt],
        "labels": ["4", "4", ""],
    }
    reply = httpx.post(service.url + "/compat/openrlhf/get_reward", json=body)
    assert reply.status_code == 200
    data = reply.json()
    assert data["rewards"] == data["scores"] == [1.0, 0.0, 0.0]
    assert data["extra_logs"]["status"][:2] == ["correct", "wrong"]
    assert data["extra_logs"]["status"][2] != "correct"
    assert all(len(v) == 3 for v in data["extra_logs"].values())
    misaligned = {"query": ["a", "b"], "prompts": ["a"], "labels": ["1", "2"]}
    reply = httpx.post(service.url + "/compat/openrlhf/get_reward", json=misaligned)
    assert reply.status_code == 422
    assert "prompts has 1 entries" in reply.text


def test_nemo_gym_verify_echoes_the_request(service: ServeProcess) -> None:
    body = {
        "responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]},
        "response": {
            "id": "resp_1",
            "output": [
                {"type": "reasoning", "summary": []},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": "It is "},
                        {"type": "output_text", "text": r"\boxed{4}"},
                    ],
                },
            ],
        },
        "question": "What is 2+2?",
        "expected_answer": "4",
        "_ng_task_index": 3,
    }
    reply = httpx.post(service.url + "/compat/nemo-gym/verify", json=body)
    assert reply.status_code == 200
    data = reply.json()
    assert data["reward"] == 1.0
    assert data["extracted_answer"] == "4"
    assert data["library_reward"] == 1.0
    assert {k: data[k] for k in body} == body


def test_health_ready_metrics_and_openapi(service: ServeProcess) -> None:
    assert httpx.get(service.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(service.url + "/readyz", timeout=30)
    assert ready.status_code == 200, ready.text
    assert "live workers" in ready.json()["detail"]
    schema = httpx.get(service.url + "/openapi.json").json()
    assert {"/v1/grade", "/compat/openrlhf/get_reward"} <= set(schema["paths"])
    assert httpx.get(service.url + "/docs").status_code == 200
    httpx.post(
        service.url + "/v1/grade", json={"items": [{"response": "1", "gold": "1"}]}
    )
    text = httpx.get(service.url + "/metrics").text
    assert 'gradefleet_http_requests_total{code="200",route="/v1/grade"}' in text
    assert "gradefleet_http_request_duration_seconds_bucket" in text
    assert "gradefleet_http_requests_in_flight" in text
    assert "gradefleet_coalesced_batch_size_count" in text
    assert "gradefleet_queue_depth" in text


def test_priority_option_picks_the_fleet_lane(
    start_redis_server, tmp_path: Path
) -> None:
    # Given a fleet with no worker: whatever the service publishes stays queued (and
    # each job keeps its batch slot, so there are slots for the four below).
    lonely = start_redis_server()
    queues = redis.Redis.from_url(lonely)
    server = start_serve(
        tmp_path, broker=lonely, args=["--coalesce-max-in-flight", "4"]
    )
    one = [{"response": r"\boxed{1}", "gold": "1"}]
    short = {"X-Gradefleet-Deadline-S": "0.3"}
    try:
        # When a request asks for the bulk lane, then for the default one,
        for options in ({"priority": "bulk"}, {}):
            body = {"items": one, "options": options}
            reply = httpx.post(server.url + "/v1/grade", json=body, headers=short)
            assert reply.json()["results"][0]["status"] == "timeout"
        # then each lane holds one batch.
        assert queues.llen(queue_for(BULK)) == 1
        assert queues.llen(queue_for(INTERACTIVE)) == 1
        # And the seam's HTTP grader sends its lane along.
        with (
            HttpGrader(server.url, GradeOptions(), priority=BULK) as grader,
            pytest.raises(DeadlinePassedError),
        ):
            grader.grade([{"response": "2", "gold": "2"}], deadline_s=0.3)
        assert queues.llen(queue_for(BULK)) == 2

        # And so does the async client's HTTP backend.
        async def bulk_call() -> list[Verdict]:
            async with CoalescingGrader(server.url) as grader:
                rollout = {"response": "3", "gold": "3"}
                return await grader.grade([rollout], lane=BULK, deadline_s=0.3)

        assert asyncio.run(bulk_call())[0].status.value == "timeout"
        assert queues.llen(queue_for(BULK)) == 3
        assert queues.llen(queue_for(INTERACTIVE)) == 1
    finally:
        server.stop()
        queues.close()


def test_embedded_serve_takes_the_embedded_options_of_grade(tmp_path: Path) -> None:
    # Given serve without a broker, with `grade`'s embedded flags and one env var
    server = start_serve(
        tmp_path,
        args=["--processes", "1", "--item-memory-mb", "96", "--item-timeout-s", "2"],
        env={"GRADEFLEET_NO_CACHE": "1"},
    )
    try:
        # Then its pool runs with those limits and no cache, and grades.
        ready = httpx.get(server.url + "/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        assert ready.json()["detail"] == (
            "embedded pool of 1 processes; per item 2 s and 96 MiB; cache off"
        )
        one = {"items": [{"response": r"\boxed{4}", "gold": "4"}]}
        reply = httpx.post(server.url + "/v1/grade", json=one, timeout=60)
        assert reply.json()["results"][0]["status"] == "correct"
        # And each request is graded with its own options (through the embedded
        # `Grader`, options per call), as in-process `grade()` grades with them
        loose = {"response": "so the result is 4", "gold": "4"}
        for options in (GradeOptions(), GradeOptions(allow_fallback=False)):
            body = {"items": [loose], "options": options.to_dict()}
            reply = httpx.post(server.url + "/v1/grade", json=body, timeout=60)
            (got,) = reply.json()["results"]
            want = verifier.grade(loose["response"], loose["gold"], options=options)
            assert (got["status"], got["correct"]) == (want.status.value, want.correct)
        assert want.status.value != "correct"  # the options did change the verdict
    finally:
        server.stop()


def test_readyz_fails_without_workers(start_redis_server, tmp_path: Path) -> None:
    lonely = start_redis_server()
    server = start_serve(tmp_path, broker=lonely)
    try:
        reply = httpx.get(server.url + "/readyz", timeout=30)
        assert reply.status_code == 503
        assert reply.json()["ready"] is False
    finally:
        server.stop()


def test_token_guards_every_route_but_health(secured: ServeProcess) -> None:
    one = {"items": [{"response": "1", "gold": "1"}]}
    url = secured.url
    assert httpx.post(url + "/v1/grade", json=one).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(url + "/v1/grade", json=one, headers=wrong).status_code == 401
    for path in ("/metrics", "/openapi.json", "/docs"):
        assert httpx.get(url + path).status_code == 401, path
    right = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(url + "/v1/grade", json=one, headers=right).status_code == 200
    assert httpx.get(url + "/healthz").status_code == 200
    assert httpx.get(url + "/readyz", timeout=30).status_code == 200
    assert TOKEN not in secured.log()


def test_non_loopback_bind_needs_a_token_or_an_explicit_flag() -> None:
    result = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "refusing to bind 0.0.0.0 without a token" in result.output


def test_body_limit_and_backpressure(fleet, redis_server: str, tmp_path: Path) -> None:
    server = start_serve(
        tmp_path,
        broker=redis_server,
        args=["--max-body-mb", "0.01", "--max-backlog", "3"],
    )
    try:
        big = {"items": [{"response": "x" * 20_000, "gold": "1"}]}
        assert httpx.post(server.url + "/v1/grade", json=big).status_code == 413
        four = {"items": [{"response": str(i), "gold": "1"} for i in range(4)]}
        reply = httpx.post(server.url + "/v1/grade", json=four)
        assert reply.status_code == 503
        assert int(reply.headers["Retry-After"]) >= 1
        three = {"items": four["items"][:3]}
        assert httpx.post(server.url + "/v1/grade", json=three).status_code == 200
    finally:
        server.stop()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in metrics")


def test_client_disconnect_mid_request_leaks_nothing(
    service: ServeProcess, wait_until
) -> None:
    body = json.dumps({"items": [{"response": HANG + " gone", "gold": "1"}]}).encode()
    head = (
        "POST /v1/grade HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    port = int(service.url.rsplit(":", 1)[1])
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(head + body)
            time.sleep(0.02)  # the request reaches the handler, then we hang up

    def settled() -> bool:
        text = httpx.get(service.url + "/metrics").text
        # Only the scrape itself is in flight; every item is finished or dropped.
        return (
            _metric(text, "gradefleet_http_requests_in_flight") == 1.0
            and _metric(text, "gradefleet_service_backlog_rollouts") == 0.0
        )

    wait_until(settled, timeout_s=60, what="in-flight requests and backlog to drain")
    assert 'code="499"' in httpx.get(service.url + "/metrics").text


def test_sigterm_drains_in_flight_requests_then_exits_0(
    fleet, redis_server: str, tmp_path: Path
) -> None:
    server = start_serve(tmp_path, broker=redis_server)
    try:

        async def scenario() -> tuple[httpx.Response, int]:
            async with httpx.AsyncClient(timeout=60) as client:
                slow = {"items": [{"response": HANG + " drain", "gold": "1"}]}
                request = asyncio.ensure_future(
                    client.post(server.url + "/v1/grade", json=slow)
                )
                await asyncio.sleep(0.3)  # in flight: the worker holds the hang item
                code = await asyncio.to_thread(server.terminate)
                return await request, code

        reply, code = asyncio.run(scenario())
        assert reply.status_code == 200
        assert reply.json()["results"][0]["status"] == "timeout"
        assert code == 0
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)  # two bursts of 10,000 connections on a shared machine
def test_ten_thousand_concurrent_requests_keep_memory_bounded(
    service: ServeProcess,
) -> None:
    rollouts = real_rollouts(800)
    bodies = [
        json.dumps({"items": [rollouts[i % len(rollouts)]]}).encode()
        for i in range(10_000)
    ]

    def burst() -> set[int]:
        replies = asyncio.run(post_json_many(service.url, "/v1/grade", bodies))
        return {status for status, _, _ in replies}

    assert burst() == {200}  # the first burst sizes the server's buffers
    first = service.rss_bytes()
    assert burst() == {200}
    second = service.rss_bytes()
    # 10,000 connections at once cost memory while they are open; a second burst
    # of the same size must reuse it (a leak would keep every request's share).
    assert second - first < 64 * 1024 * 1024, (first, second)
    text = httpx.get(service.url + "/metrics").text
    assert _metric(text, "gradefleet_service_backlog_rollouts") == 0.0
    assert _metric(text, "gradefleet_http_requests_in_flight") == 1.0


def test_one_seam_three_transports_identical_verdicts(
    service: ServeProcess, redis_server: str, tmp_path: Path
) -> None:
    from producer.client.grader import open_grader
    from producer.settings import ProducerSettings
    from workers.models import Rollout

    rollouts = [Rollout(r["response"], r["gold"]) for r in real_rollouts(150)]
    # and answers only a fallback finds (no final-answer marker)
    rollouts += [Rollout(f"so the result is {n}", str(n)) for n in (4, 17, 250)]
    settings = ProducerSettings(processes=1, cache_dir=None)
    strict = GradeOptions(allow_fallback=False)
    seen, seen_strict = {}, {}
    for url in (None, redis_server, service.url):
        progress: list[int] = []
        with open_grader(url, settings=settings) as grader:
            verdicts = grader.grade(rollouts, on_progress=progress.append)
            # the same grader, other options for one call
            strict_verdicts = grader.grade(rollouts, options=strict)
        assert sum(progress) == len(rollouts)
        seen[url] = [comparable(v) for v in verdicts]
        seen_strict[url] = [comparable(v) for v in strict_verdicts]
    assert seen[None] == seen[redis_server] == seen[service.url]
    assert seen_strict[None] == seen_strict[redis_server] == seen_strict[service.url]
    in_process = [verifier.grade(r.response, r.gold, options=strict) for r in rollouts]
    assert seen_strict[None] == [comparable(v) for v in in_process]
    assert seen_strict[None] != seen[None]  # the options did change some verdicts
