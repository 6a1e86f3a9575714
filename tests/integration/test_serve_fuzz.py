"""Property-based fuzzing of the service's request schemas against a live server.

Hypothesis generates bodies shaped like the OpenAPI schema's models (right and wrong
types, missing and extra fields, odd text) for every POST route; whatever comes in,
the answer is a 200 with one result per item or a 4xx that names the problem, never
a 5xx. (Schemathesis would derive the same from /openapi.json; these strategies
follow the pydantic models in `producer.serve.schemas` directly and keep pytest's pin.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serve_procs import ServeProcess, start_serve
from workers.models import Status

pytestmark = pytest.mark.integration

TEXT = st.text(max_size=40) | st.sampled_from(
    ["\\boxed{4}", "4", "\\frac{1}{2}", "", "\x00", "\\boxed{", "é" * 3]
)
# Finite floats: httpx (like any strict JSON encoder) cannot send NaN; the raw
# NaN body is tested separately.
FINITE = st.floats(allow_nan=False, allow_infinity=False)
SCALAR = st.none() | st.booleans() | st.integers() | FINITE | TEXT
JSON = st.recursive(
    SCALAR,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = st.sampled_from(
    [
        "response",
        "completion",
        "output",
        "solution_str",
        "gold",
        "ground_truth",
        "answer",
        "solution",
        "expected_answer",
        "reward_model",
        "other",
    ]
)
ITEM = st.dictionaries(FIELDS, SCALAR | JSON, max_size=4) | JSON
GRADE_BODY = st.fixed_dictionaries(
    {"items": st.lists(ITEM, max_size=4)},
    optional={
        "options": st.dictionaries(
            st.sampled_from(["allow_fallback", "rel_tol", "bogus"]), SCALAR, max_size=2
        ),
        "deadline_s": SCALAR,
        "extra": SCALAR,
    },
)
OPENRLHF_BODY = st.fixed_dictionaries(
    {"query": st.lists(TEXT, max_size=3) | JSON},
    optional={"prompts": st.lists(TEXT, max_size=3) | JSON, "labels": JSON},
)
NEMO_BODY = st.fixed_dictionaries(
    {"response": JSON, "expected_answer": SCALAR}, optional={"question": JSON}
)
STATUSES = {s.value for s in Status}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def service(fleet, redis_server: str, tmp_path_factory) -> Iterator[ServeProcess]:
    server = start_serve(
        tmp_path_factory.mktemp("serve"),
        broker=redis_server,
        args=["--deadline-s", "20"],
    )
    try:
        yield server
    finally:
        server.stop()


def _post(service: ServeProcess, path: str, body: Any) -> httpx.Response:
    reply = httpx.post(service.url + path, json=body, timeout=60)
    assert reply.status_code < 500, (body, reply.status_code, reply.text[:500])
    return reply


@FUZZ
@given(body=GRADE_BODY | JSON)
def test_grade_route_never_5xx(service: ServeProcess, body: Any) -> None:
    reply = _post(service, "/v1/grade", body)
    if reply.status_code == 200:
        results = reply.json()["results"]
        assert len(results) == len(body["items"])
        assert {r["status"] for r in results} <= STATUSES
    else:
        assert reply.status_code in (400, 422)
        assert reply.json()["detail"]


@FUZZ
@given(body=OPENRLHF_BODY | JSON)
def test_openrlhf_route_never_5xx(service: ServeProcess, body: Any) -> None:
    reply = _post(service, "/compat/openrlhf/get_reward", body)
    if reply.status_code == 200:
        data = reply.json()
        assert len(data["rewards"]) == len(body["query"])
    else:
        assert reply.status_code == 422


@FUZZ
@given(body=NEMO_BODY | JSON)
def test_nemo_gym_route_never_5xx(service: ServeProcess, body: Any) -> None:
    reply = _post(service, "/compat/nemo-gym/verify", body)
    if reply.status_code == 200:
        assert isinstance(reply.json()["reward"], float)
    else:
        assert reply.status_code == 422


def test_nan_in_an_echoed_body_is_a_422_not_a_500(service: ServeProcess) -> None:
    body = b'{"response": {"output": []}, "expected_answer": "1", "x": NaN}'
    reply = httpx.post(
        service.url + "/compat/nemo-gym/verify",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 422
    assert "NaN" in reply.text
