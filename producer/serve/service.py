"""`gradefleet serve`: the grading service (FastAPI on uvicorn).

Routes: `POST /v1/grade`, `POST /compat/openrlhf/get_reward`,
`POST /compat/nemo-gym/verify`, `GET /healthz`, `GET /readyz`, `GET /metrics`, and
the OpenAPI page (`/docs`, `/openapi.json`). All grading goes through one
`CoalescingGrader`, so concurrent small requests share batches. A well-formed
`/v1/grade` request is answered by `producer.serve.grade_route.FastGrade` without
FastAPI's per-request machinery; the FastAPI route documents it and answers the rest.

Rules every route keeps: a failed item is a verdict (never a 5xx); a malformed request
is a 4xx naming the item and field; past a request's deadline the unfinished items are
`timeout` verdicts; a full backlog is a 503 with `Retry-After`; with a token, every
route but the health checks needs `Authorization: Bearer <token>`; the token is never
logged; a client that goes away cancels its own wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    Histogram,
    generate_latest,
)

from producer.adapters.compat import (
    label_gold,
    label_text,
    nemo_gym_code_fields,
    nemo_gym_code_gold,
    nemo_gym_fields,
    nemo_gym_text,
    openrlhf_payload,
    strip_query,
)
from producer.adapters.reward import RewardConfig
from producer.client.coalesce import OverloadedError
from producer.client.grading import CoalescingGrader
from producer.serve.code_probe import CodeProbe
from producer.serve.grade_route import (
    DEADLINE_HEADER,
    GRADE_PATH,
    ASGIApp,
    BadHeaderError,
    FastGrade,
    GradeCall,
    Message,
    Receive,
    Scope,
    Send,
    encode_results,
    header_deadline_s,
    overloaded_headers,
    too_large_detail,
    unless_disconnected,
)
from producer.serve.http_metrics import RequestStats
from producer.serve.schemas import (
    GradeRequest,
    GradeResponse,
    NemoGymVerifyRequest,
    OpenRLHFRequest,
    OpenRLHFResponse,
)
from workers.models import Verdict
from workers.wire.contract import MAX_TEXT_CHARS, text_error

__all__ = ["DEADLINE_HEADER", "ServiceMetrics", "create_app"]

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_DEADLINE_S = 300.0
_PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
_ROUTES = frozenset(
    {
        GRADE_PATH,
        "/compat/openrlhf/get_reward",
        "/compat/nemo-gym/verify",
        "/healthz",
        "/readyz",
        "/metrics",
        "/docs",
        "/openapi.json",
    }
)
_JSON = "application/json"
# Container allocations between young-generation collections (Python's default:
# 700). A request allocates a few hundred (futures, coroutines, dicts) that nearly
# all die by reference counting; collecting less often walks fewer of them.
_GC_YOUNG_THRESHOLD = 20_000


class ServiceMetrics:
    """The service's Prometheus metrics, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # Requests by route and code, latency, in flight (`RequestStats`).
        self.http = RequestStats()
        self.registry.register(self.http)
        self.batch_size = Histogram(
            "gradefleet_coalesced_batch_size",
            "Rollouts per batch the service sends to its backend (coalesced calls).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=self.registry,
        )
        self.backlog = Gauge(
            "gradefleet_service_backlog_rollouts",
            "Rollouts accepted and not yet graded.",
            registry=self.registry,
        )


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The last value of header `name` (lower case), without building a dict."""
    found = None
    for key, value in scope.get("headers") or ():
        if key == name:
            found = value
    return found


class _MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.stats = metrics.http

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in _ROUTES else "other"
        code = 500
        started = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = int(message["status"])
            await send(message)

        stats = self.stats
        stats.in_flight += 1
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            stats.in_flight -= 1
            stats.observe(route, code, time.perf_counter() - started)


class _AuthMiddleware:
    """Bearer token on every route but the health checks (constant-time compare)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in _PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"authorization") or b""
        if hmac.compare_digest(given, self._expected):
            await self.app(scope, receive, send)
            return
        reply = JSONResponse(
            {"detail": "missing or wrong bearer token"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
        await reply(scope, receive, send)


class _BodyTooLargeError(Exception):
    pass


class _BodyLimitMiddleware:
    """413 for a body over `limit` bytes, checked before and while it is read."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLargeError
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLargeError:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        reply = JSONResponse(
            {"detail": too_large_detail(self.limit)},
            status_code=413,
        )
        await reply(scope, receive, send)


def create_app(
    grader: CoalescingGrader,
    *,
    token: str | None = None,
    reward: RewardConfig | None = None,
    metrics: ServiceMetrics | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    default_deadline_s: float = DEFAULT_DEADLINE_S,
    extra_collectors: tuple[Any, ...] = (),
    freeze_gc: bool = False,
) -> ASGIApp:
    """The ASGI application (FastAPI wrapped in metrics, auth and body-limit layers).

    The grader is started in the app's lifespan (pool warmed or broker pinged) and
    closed when the server stops. `freeze_gc`: once it is started, move every object
    alive into the collector's permanent generation (`gc.freeze`) and collect the
    young generation less often; for a process that runs only this app
    (`gradefleet serve`).
    """
    metrics = metrics or ServiceMetrics()
    for collector in extra_collectors:
        metrics.registry.register(collector)
    grader.coalescer.on_batch = metrics.batch_size.observe

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        start = getattr(grader.backend, "start", None)
        if start is not None:
            await start()
        if freeze_gc:
            # The modules, the app and the backend's connections live as long as
            # the process: without this, every full collection walks them all
            # again, some 15 us of CPU per one-item request at a few thousand
            # requests a second (tests/bench/bench_serve.py).
            gc.freeze()
            gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        try:
            yield
        finally:
            await grader.aclose()

    app = FastAPI(
        title="gradefleet",
        summary="Grade LLM math rollouts: correct or not, why, and the reward.",
        lifespan=lifespan,
    )
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(OverloadedError, _overloaded)
    app.add_exception_handler(BadHeaderError, _bad_header)
    reward = reward or RewardConfig()
    routes = _Routes(grader, reward, metrics, default_deadline_s)
    # The reply is encoded straight to JSON bytes; its schema is documented here.
    documented: dict[int | str, dict[str, Any]] = {200: {"model": GradeResponse}}
    app.post(GRADE_PATH, response_model=None, responses=documented)(routes.grade)
    app.post("/compat/openrlhf/get_reward", response_model=OpenRLHFResponse)(
        routes.openrlhf_get_reward
    )
    app.post("/compat/nemo-gym/verify")(routes.nemo_gym_verify)
    app.get("/healthz")(routes.healthz)
    app.get("/readyz")(routes.readyz)
    app.get("/metrics")(routes.metrics)
    limited = _BodyLimitMiddleware(app, max_body_bytes)
    wrapped: ASGIApp = FastGrade(
        limited, grader.coalescer, routes.call_deadline_s, reward, max_body_bytes
    )
    if token:
        wrapped = _AuthMiddleware(wrapped, token)
    return _MetricsMiddleware(wrapped, metrics)


async def _invalid(_request: Request, exc: Exception) -> Response:
    """422 naming where and what, without echoing the input: it may be megabytes of
    text, or hold NaN, which a JSON reply cannot carry."""
    assert isinstance(exc, RequestValidationError)
    detail = [
        {"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": e.get("msg")}
        for e in exc.errors()
    ]
    return JSONResponse({"detail": detail}, status_code=422)


async def _overloaded(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, OverloadedError)
    return JSONResponse(
        {"detail": str(exc)}, status_code=503, headers=overloaded_headers(exc)
    )


async def _bad_header(_request: Request, exc: Exception) -> Response:
    return JSONResponse({"detail": str(exc)}, status_code=400)


class _Routes:
    """The route handlers, sharing one grader, reward mapping and metrics."""

    def __init__(
        self,
        grader: CoalescingGrader,
        reward: RewardConfig,
        metrics: ServiceMetrics,
        default_deadline_s: float,
    ) -> None:
        self.grader = grader
        self.reward = reward
        self._metrics = metrics
        self.default_deadline_s = default_deadline_s
        self.code_probe = CodeProbe()

    def _deadline_s(self, *limits_s: float | None) -> float:
        return min([self.default_deadline_s, *(s for s in limits_s if s is not None)])

    async def _grade_or_gone(
        self, request: Request, pairs: list[tuple[str, str]]
    ) -> list[Verdict] | None:
        header_s = header_deadline_s(request.headers.get(DEADLINE_HEADER))
        work = self.grader.grade_pairs(pairs, deadline_s=self._deadline_s(header_s))
        return await unless_disconnected(request.receive, work)

    def call_deadline_s(self, call: GradeCall, header_s: float | None) -> float:
        """A validated `/v1/grade` call's deadline (both paths use it)."""
        return self._deadline_s(call.deadline_s, header_s)

    def grade_call(
        self, call: GradeCall, header_s: float | None
    ) -> Awaitable[list[Verdict]]:
        """Grade a validated `/v1/grade` call on the FastAPI route."""
        return self.grader.grade_pairs(
            call.pairs,
            options=call.options,
            lane=call.lane,
            deadline_s=self.call_deadline_s(call, header_s),
        )

    async def grade(self, request: Request, body: GradeRequest) -> Response:
        """Grade every item; results in input order, each with its `score`."""
        header_s = header_deadline_s(request.headers.get(DEADLINE_HEADER))
        call = GradeCall(
            [item.pair for item in body.items],
            body.options.to_options(),
            body.options.priority,
            body.deadline_s,
        )
        verdicts = await unless_disconnected(
            request.receive, self.grade_call(call, header_s)
        )
        if verdicts is None:
            return Response(status_code=499)
        version = self.grader.coalescer.grader_version
        reply = encode_results(verdicts, self.reward, version)
        return Response(reply, media_type=_JSON)

    async def openrlhf_get_reward(
        self, request: Request, body: OpenRLHFRequest
    ) -> Response:
        """OpenRLHF's remote reward protocol; per-item failures score 0 with their
        status in `extra_logs` (a non-2xx makes OpenRLHF retry, then drop the
        reward)."""
        labels = body.labels or []
        prompts: list[str | None] = (
            list(body.prompts) if body.prompts else [None] * len(body.query)
        )
        pairs = [
            (strip_query(q, p)[:MAX_TEXT_CHARS], label_gold(label)[:MAX_TEXT_CHARS])
            for q, p, label in zip(body.query, prompts, labels, strict=True)
        ]
        verdicts = await self._grade_or_gone(request, pairs)
        if verdicts is None:
            return Response(status_code=499)
        return JSONResponse(openrlhf_payload(verdicts, self.reward))

    async def nemo_gym_verify(
        self, request: Request, body: NemoGymVerifyRequest
    ) -> Response:
        """NeMo Gym's `verify`: the request echoed plus, for math, `reward`,
        `extracted_answer` and `library_reward`; for `code_gen` (its
        `verifier_metadata.unit_tests`), `reward` (1 when every test passed),
        `extracted_model_output`, `extracted_model_code`, tests passed/total."""
        text = nemo_gym_text(body.response)[:MAX_TEXT_CHARS]
        tests = (body.verifier_metadata or {}).get("unit_tests")
        if tests is not None:
            gold = nemo_gym_code_gold(tests)
            if (error := text_error("", gold)) is not None:
                detail = [{"loc": ["body", "verifier_metadata"], "msg": error}]
                return JSONResponse({"detail": detail}, status_code=422)
        else:
            gold = label_text(body.expected_answer)[:MAX_TEXT_CHARS]
        verdicts = await self._grade_or_gone(request, [(text, gold)])
        if verdicts is None:
            return Response(status_code=499)
        answer = body.model_dump(mode="json")
        if body.verifier_metadata is None:
            del answer["verifier_metadata"]  # a math request is echoed as it came
        if tests is not None:
            answer.update(nemo_gym_code_fields(verdicts[0], self.reward, text))
        else:
            answer.update(nemo_gym_fields(verdicts[0], self.reward))
        return JSONResponse(answer)

    async def healthz(self) -> dict[str, str]:
        """The process is up (no backend check)."""
        return {"status": "ok"}

    async def readyz(self) -> Response:
        """The backend can grade: broker reachable with a live worker, or the
        embedded pool up (the status code says this). `code`: whether code rollouts
        can be graded: on a fleet, whether a live worker takes code (`--kinds`);
        embedded, whether this node runs code sandboxes (a cached probe). Math does
        not need them, so neither fails the check."""
        ok, detail = await self.grader.ready()
        code = await self.grader.code_ready()
        code_ok, code_detail = code or await self.code_probe.check()
        body = {
            "ready": ok,
            "detail": detail,
            "code": {"ready": code_ok, "detail": code_detail},
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    async def metrics(self) -> Response:
        """Prometheus metrics of the service (and the queue depth on a fleet)."""
        self._metrics.backlog.set(self.grader.coalescer.backlog_items)
        data = await asyncio.to_thread(generate_latest, self._metrics.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)
