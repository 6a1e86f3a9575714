"""The `/v1/grade` fast path accepts only what the documented schema accepts, and
reads it the same way (hypothesis against `producer.serve.schemas.GradeRequest`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from producer.adapters.reward import RewardConfig
from producer.serve.grade_route import (
    BadHeaderError,
    encode_results,
    header_deadline_s,
    parse_grade_body,
)
from producer.serve.schemas import GradeRequest, GradeResponse
from workers.models import ExtractionMethod, GradeOptions, Status, Verdict
from workers.wire.contract import MAX_TEXT_CHARS

TEXT = st.text(max_size=20) | st.sampled_from(["\\boxed{4}", "4", "", "\x00", "é"])
NUMBER = st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
SCALAR = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(
    SCALAR,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = st.sampled_from(
    [
        "response",
        "completion",
        "responses",
        "output",
        "solution_str",
        "gold",
        "ground_truth",
        "answer",
        "solution",
        "expected_answer",
        "reward_model",
        "label",
        "other",
    ]
)
ITEM = st.dictionaries(FIELDS, SCALAR | JSON, max_size=4) | st.fixed_dictionaries(
    {"response": TEXT, "gold": TEXT | NUMBER}
)
BODY = st.fixed_dictionaries(
    {"items": st.lists(ITEM, max_size=4)},
    optional={
        "options": st.dictionaries(
            st.sampled_from(["allow_fallback", "rel_tol", "priority", "bogus"]),
            SCALAR | st.sampled_from(["bulk", "interactive"]),
            max_size=2,
        ),
        "deadline_s": SCALAR,
        "extra": SCALAR,
    },
)


@settings(max_examples=400, deadline=None)
@given(body=BODY | JSON)
def test_fast_path_accepts_only_what_the_schema_accepts_and_reads_it_alike(
    body: Any,
) -> None:
    raw = json.dumps(body).encode()
    call = parse_grade_body(raw)
    if call is None:
        return  # the FastAPI route validates it (and names any error)
    model = GradeRequest.model_validate(json.loads(raw))
    assert call.pairs == [item.pair for item in model.items]
    assert call.options == model.options.to_options()
    assert call.lane == model.options.priority
    assert call.deadline_s == model.deadline_s


@pytest.mark.parametrize(
    "body",
    [
        b'{"items": [{"response": "1", "gold": "1"}], "prio": 1}',
        b'{"items": [{"response": 3, "gold": "1"}]}',
        b'{"items": [{"response": "1", "gold": true}]}',
        b'{"items": [{"response": "1"}]}',
        b'{"items": [{"response": "%s", "gold": "1"}]}' % (b"x" * (MAX_TEXT_CHARS + 1)),
        b'{"items": [{"response": "1", "responses": ["2"]}]}',
        b'{"items": [{"response": "1", "gold": 18446744073709551616}]}',
        b'{"items": [{"response": "1", "gold": -9223372036854775809}]}',
        b'{"items": [{"response": "1", "gold": ["1", 1e300]}]}',
        b'{"items": [], "deadline_s": 0}',
        b'{"items": [], "deadline_s": NaN}',
        b'{"items": [], "options": {"priority": "urgent"}}',
        b"{not json",
    ],
    ids=[
        "unknown",
        "int-text",
        "bool-gold",
        "no-gold",
        "too-long",
        "two-responses",
        "int-over-64-bits",
        "int-under-64-bits",
        "huge-float",
        "zero",
        "nan",
        "lane",
        "json",
    ],
)
def test_doubtful_bodies_go_to_the_validating_route(body: bytes) -> None:
    assert parse_grade_body(body) is None


def test_plain_request_is_read_with_lane_and_deadline() -> None:
    body = {
        "items": [{"response": "\\boxed{4}", "gold": 4}],
        "options": {"priority": "bulk", "allow_fallback": False},
        "deadline_s": 2,
    }
    call = parse_grade_body(orjson.dumps(body))
    assert call is not None
    assert call.pairs == [("\\boxed{4}", "4")]
    assert call.options == GradeOptions(allow_fallback=False)
    assert (call.lane, call.deadline_s) == ("bulk", 2.0)


def test_plain_item_is_read_as_is() -> None:
    call = parse_grade_body(b'{"items": [{"response": "\\\\boxed{4}", "gold": " 4"}]}')
    assert call is not None
    assert call.pairs == [("\\boxed{4}", " 4")]
    assert (call.options, call.lane, call.deadline_s) == (
        GradeOptions(),
        "interactive",
        None,
    )


def test_header_deadline_is_checked() -> None:
    assert header_deadline_s(None) is None
    assert header_deadline_s(b"0.5") == 0.5
    for bad in (b"soon", b"0", b"nan", b"-1", b"1e9"):
        with pytest.raises(BadHeaderError):
            header_deadline_s(bad)


def _boxed_four(grader_version: str) -> Verdict:
    return Verdict(
        correct=True,
        status=Status.CORRECT,
        format_valid=True,
        extracted="4",
        extraction_method=ExtractionMethod.BOXED,
        grader_version=grader_version,
    )


def test_encoded_reply_matches_the_documented_schema() -> None:
    verdict = _boxed_four("v1")
    reply = orjson.loads(encode_results([verdict], RewardConfig(), "v1"))
    assert reply["results"][0] == {**verdict.to_dict(), "score": 1.0}
    GradeResponse.model_validate(reply)
    with pytest.raises(ValidationError):
        GradeResponse.model_validate({"results": [{}], "grader_version": "v1"})


class _EchoBackend:
    """Grades every item correct at once (the route's own work is under test)."""

    max_in_flight = 1

    async def grade_batch(
        self, pairs: list[tuple[str, str]], options: GradeOptions, lane: str
    ) -> list[Verdict]:
        return [_boxed_four("test")] * len(pairs)

    async def ready(self) -> tuple[bool, str]:
        return True, ""

    async def code_ready(self) -> tuple[bool, str] | None:
        return None

    async def aclose(self) -> None:
        pass


def _post(chunks: list[bytes], *, length: bool, limit: int) -> int:
    """The status of one POST /v1/grade through the whole ASGI app, its body sent
    in `chunks` (with or without a Content-Length)."""
    from producer.client.grading import CoalescingGrader
    from producer.serve.service import create_app

    async def run() -> int:
        app = create_app(
            CoalescingGrader(backend=_EchoBackend(), max_delay_s=0.0),
            max_body_bytes=limit,
        )
        headers = [(b"content-type", b"application/json")]
        if length:
            headers.append((b"content-length", str(sum(map(len, chunks))).encode()))
        scope = {"type": "http", "method": "POST", "path": "/v1/grade"}
        scope |= {"headers": headers, "query_string": b"", "root_path": ""}
        messages = [
            {"type": "http.request", "body": c, "more_body": k < len(chunks) - 1}
            for k, c in enumerate(chunks)
        ]
        gone = asyncio.Event()
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        gone.set()
        return int(sent[0]["status"])

    return asyncio.run(run())


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
def test_body_limit_holds_on_the_fast_path(length: bool) -> None:
    body = orjson.dumps({"items": [{"response": "\\boxed{4}", "gold": "4"}]})
    assert _post([body], length=length, limit=len(body)) == 200
    assert _post([body], length=length, limit=len(body) - 1) == 413
    halves = [body[:10], body[10:]]
    assert _post(halves, length=length, limit=len(body)) == 200
    assert _post(halves, length=length, limit=len(body) - 1) == 413
