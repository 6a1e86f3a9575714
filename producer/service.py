"""`gradefleet serve`: the grading service (FastAPI on uvicorn).

Routes: `POST /v1/grade`, `POST /compat/openrlhf/get_reward`,
`POST /compat/nemo-gym/verify`, `GET /healthz`, `GET /readyz`, `GET /metrics`, and
the OpenAPI page (`/docs`, `/openapi.json`). All grading goes through one
`CoalescingGrader`, so concurrent small requests share batches.

Rules every route keeps: a failed item is a verdict (never a 5xx); a malformed request
is a 4xx naming the item and field; past a request's deadline the unfinished items are
`timeout` verdicts; a full backlog is a 503 with `Retry-After`; with a token, every
route but the health checks needs `Authorization: Bearer <token>`; the token is never
logged; a client that goes away cancels its own wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from producer.adapters.reward import RewardConfig
from producer.coalesce import OverloadedError
from producer.compat import (
    label_text,
    nemo_gym_fields,
    nemo_gym_text,
    openrlhf_payload,
    strip_query,
)
from producer.grading import CoalescingGrader
from producer.schemas import (
    GradeRequest,
    GradeResponse,
    NemoGymVerifyRequest,
    OpenRLHFRequest,
    OpenRLHFResponse,
)
from workers.contract import MAX_TEXT_CHARS
from workers.models import Verdict

__all__ = ["DEADLINE_HEADER", "ServiceMetrics", "create_app"]

DEADLINE_HEADER = "X-Gradefleet-Deadline-S"
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_DEADLINE_S = 300.0
_PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
_ROUTES = frozenset(
    {
        "/v1/grade",
        "/compat/openrlhf/get_reward",
        "/compat/nemo-gym/verify",
        "/healthz",
        "/readyz",
        "/metrics",
        "/docs",
        "/openapi.json",
    }
)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ServiceMetrics:
    """The service's Prometheus metrics, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "gradefleet_http_requests",
            "HTTP requests answered, by route and status code.",
            ["route", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gradefleet_http_request_duration_seconds",
            "Time to answer an HTTP request, by route.",
            ["route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "gradefleet_http_requests_in_flight",
            "HTTP requests being answered.",
            registry=self.registry,
        )
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


class _MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

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

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(route, str(code)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)


class _AuthMiddleware:
    """Bearer token on every route but the health checks (constant-time compare)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in _PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
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
        length = dict(scope.get("headers") or []).get(b"content-length")
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
            {"detail": f"request body larger than {self.limit} bytes"},
            status_code=413,
        )
        await reply(scope, receive, send)


def _deadline_s(request: Request, field_s: float | None, default_s: float) -> float:
    limits = [default_s]
    if field_s is not None:
        limits.append(field_s)
    header = request.headers.get(DEADLINE_HEADER)
    if header is not None:
        try:
            value = float(header)
        except ValueError:
            value = float("nan")
        if not 0 < value <= 86_400:  # also refuses nan
            raise _BadHeaderError(f"{DEADLINE_HEADER} must be a number of seconds > 0")
        limits.append(value)
    return min(limits)


class _BadHeaderError(Exception):
    pass


async def _until_disconnect(request: Request) -> None:
    """Returns when the client goes away (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(
    request: Request, work: Awaitable[list[Verdict]]
) -> list[Verdict] | None:
    """`work`'s verdicts, or None (work cancelled) if the client left first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        if not task.done():
            task.cancel()  # the client left (or we are cancelled): stop waiting
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return None
    return task.result()


def create_app(
    grader: CoalescingGrader,
    *,
    token: str | None = None,
    reward: RewardConfig | None = None,
    metrics: ServiceMetrics | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    default_deadline_s: float = DEFAULT_DEADLINE_S,
    extra_collectors: tuple[Any, ...] = (),
) -> ASGIApp:
    """The ASGI application (FastAPI wrapped in metrics, auth and body-limit layers).

    The grader is started in the app's lifespan (pool warmed or broker pinged) and
    closed when the server stops.
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
    app.add_exception_handler(_BadHeaderError, _bad_header)
    routes = _Routes(grader, reward or RewardConfig(), metrics, default_deadline_s)
    app.post("/v1/grade", response_model=GradeResponse)(routes.grade)
    app.post("/compat/openrlhf/get_reward", response_model=OpenRLHFResponse)(
        routes.openrlhf_get_reward
    )
    app.post("/compat/nemo-gym/verify")(routes.nemo_gym_verify)
    app.get("/healthz")(routes.healthz)
    app.get("/readyz")(routes.readyz)
    app.get("/metrics")(routes.metrics)
    wrapped: ASGIApp = _BodyLimitMiddleware(app, max_body_bytes)
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
        {"detail": str(exc)},
        status_code=503,
        headers={"Retry-After": f"{max(1, round(exc.retry_after_s))}"},
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

    async def _grade_or_gone(
        self,
        request: Request,
        pairs: list[tuple[str, str]],
        field_deadline_s: float | None = None,
        **kwargs: Any,
    ) -> list[Verdict] | None:
        deadline_s = _deadline_s(request, field_deadline_s, self.default_deadline_s)
        return await _unless_disconnected(
            request, self.grader.grade_pairs(pairs, deadline_s=deadline_s, **kwargs)
        )

    async def grade(self, request: Request, body: GradeRequest) -> Response:
        """Grade every item; results in input order, each with its `score`."""
        pairs = [item.pair for item in body.items]
        verdicts = await self._grade_or_gone(
            request, pairs, body.deadline_s, options=body.options.to_options()
        )
        if verdicts is None:
            return Response(status_code=499)
        results = []
        for verdict in verdicts:
            result = verdict.to_dict()
            result["score"] = self.reward.score(verdict)
            results.append(result)
        version = self.grader.coalescer.grader_version
        return JSONResponse({"results": results, "grader_version": version})

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
            (strip_query(q, p)[:MAX_TEXT_CHARS], label_text(label)[:MAX_TEXT_CHARS])
            for q, p, label in zip(body.query, prompts, labels, strict=True)
        ]
        verdicts = await self._grade_or_gone(request, pairs)
        if verdicts is None:
            return Response(status_code=499)
        return JSONResponse(openrlhf_payload(verdicts, self.reward))

    async def nemo_gym_verify(
        self, request: Request, body: NemoGymVerifyRequest
    ) -> Response:
        """NeMo Gym's math `verify`: the request echoed plus `reward`,
        `extracted_answer` and `library_reward`."""
        text = nemo_gym_text(body.response)[:MAX_TEXT_CHARS]
        gold = label_text(body.expected_answer)[:MAX_TEXT_CHARS]
        verdicts = await self._grade_or_gone(request, [(text, gold)])
        if verdicts is None:
            return Response(status_code=499)
        answer = body.model_dump(mode="json")
        answer.update(nemo_gym_fields(verdicts[0], self.reward))
        return JSONResponse(answer)

    async def healthz(self) -> dict[str, str]:
        """The process is up (no backend check)."""
        return {"status": "ok"}

    async def readyz(self) -> Response:
        """The backend can grade: broker reachable with a live worker, or the
        embedded pool up."""
        ok, detail = await self.grader.ready()
        return JSONResponse(
            {"ready": ok, "detail": detail}, status_code=200 if ok else 503
        )

    async def metrics(self) -> Response:
        """Prometheus metrics of the service (and the queue depth on a fleet)."""
        self._metrics.backlog.set(self.grader.coalescer.backlog_items)
        data = await asyncio.to_thread(generate_latest, self._metrics.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)
