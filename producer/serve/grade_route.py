"""The hot path of `POST /v1/grade`: a well-formed request graded without FastAPI.

Reward hooks send one rollout per request, thousands at once, so the service's own
cost per request is what limits them (tests/bench/bench_serve.py). FastAPI's
routing, dependency solving and pydantic validation cost several times the grading
of a cached item; here a request is parsed once with orjson, checked against the
same rules as `producer.serve.schemas.GradeRequest` (the CLI's field rules through
`pick_row`, the options through `OptionsIn`) and answered with orjson bytes.

Anything this path does not accept as plainly valid (bad JSON, an unknown field, a
wrong type, a bad deadline header) is handed to the FastAPI route unchanged, body
included, so every error is the documented 4xx that route gives, word for word.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from pydantic import ValidationError

from producer.adapters.reward import RewardConfig
from producer.client.coalesce import Coalescer, OverloadedError, wait_for_items
from producer.serve.schemas import ITEM_FIELD_TYPES, MAX_ITEMS, OptionsIn, pick_row
from workers.models import GradeOptions, Verdict
from workers.wire.contract import text_error
from workers.wire.lanes import INTERACTIVE, Lane

__all__ = [
    "DEADLINE_HEADER",
    "GRADE_PATH",
    "FastGrade",
    "GradeCall",
    "encode_results",
    "header_deadline_s",
    "overloaded_headers",
    "parse_grade_body",
    "too_large_detail",
    "unless_disconnected",
]

GRADE_PATH: Final = "/v1/grade"
DEADLINE_HEADER: Final = "X-Gradefleet-Deadline-S"
_DEADLINE_HEADER_RAW: Final = DEADLINE_HEADER.lower().encode()
_TOP_FIELDS: Final = frozenset({"items", "options", "deadline_s"})
_MAX_DEADLINE_S: Final = 86_400.0
_JSON_HEADERS: Final = [(b"content-type", b"application/json")]
_BIG_FLOAT: Final = float(2**63)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class GradeCall:
    """A validated `/v1/grade` request."""

    pairs: list[tuple[str, str]]
    options: GradeOptions
    lane: Lane
    deadline_s: float | None


def _holds_big_float(value: object) -> bool:
    """Whether a float of magnitude 2**63 or more sits anywhere in `value`.

    orjson reads an integer beyond 64 bits as a float (-2**63 - 1 as -2**63, as a
    float): such a gold would become the float's text here, while the FastAPI
    route, which parses with the stdlib, keeps the integer's exact digits.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is float and abs(item) >= _BIG_FLOAT:
            return True
        if type(item) is dict:
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
    return False


def _fast_pair(item: object) -> tuple[str, str] | None:
    """The item's pair when its declared fields have their JSON types and the CLI's
    rules accept it (then `RolloutIn` accepts it too); None otherwise."""
    if type(item) is not dict:
        return None
    if len(item) == 2:
        # The usual item, exactly a text `response` and a text `gold`: the first
        # alias of each table, and no other alias to look at, so `pick_row` would
        # read them as they are (a tenth of a one-item request's CPU to find out).
        response, gold = item.get("response"), item.get("gold")
        if type(response) is str and type(gold) is str:
            return None if text_error(response, gold) else (response, gold)
    if _holds_big_float(item):
        return None
    for name, kinds in ITEM_FIELD_TYPES.items():
        value = item.get(name)
        if value is not None and type(value) not in kinds:
            return None
    try:
        row = pick_row(item)
    except ValueError:
        return None
    return row.response, row.gold


_DEFAULT_OPTIONS: Final = (GradeOptions(), INTERACTIVE)


def _fast_options(value: object) -> tuple[GradeOptions, Lane] | None:
    if value is None:
        return _DEFAULT_OPTIONS
    try:
        options = OptionsIn.model_validate(value)
    except ValidationError:
        return None
    return options.to_options(), options.priority


def parse_grade_body(body: bytes) -> GradeCall | None:
    """`body` as a GradeCall when it is plainly valid; None: let the FastAPI route
    validate it (and name the error)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:  # also NaN, lone surrogates, huge integers
        return None
    if type(data) is not dict or not data.keys() <= _TOP_FIELDS:
        return None
    items = data.get("items")
    if type(items) is not list or len(items) > MAX_ITEMS:
        return None
    deadline_s = data.get("deadline_s")
    if deadline_s is not None and (
        type(deadline_s) not in (int, float) or not 0 < deadline_s <= _MAX_DEADLINE_S
    ):
        return None
    chosen = _fast_options(data.get("options"))
    if chosen is None:
        return None
    pairs = []
    for item in items:
        pair = _fast_pair(item)
        if pair is None:
            return None
        pairs.append(pair)
    deadline = None if deadline_s is None else float(deadline_s)
    return GradeCall(pairs, chosen[0], chosen[1], deadline)


class BadHeaderError(Exception):
    """A request header the service cannot use (answered with 400)."""


def header_deadline_s(value: bytes | str | None) -> float | None:
    """The deadline header's seconds (None when absent).

    Raises:
        BadHeaderError: not a number of seconds in (0, 86400].
    """
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= _MAX_DEADLINE_S:  # also refuses nan
        raise BadHeaderError(f"{DEADLINE_HEADER} must be a number of seconds > 0")
    return seconds


def encode_results(
    verdicts: Sequence[Verdict], reward: RewardConfig, grader_version: str
) -> bytes:
    """The `/v1/grade` reply (`GradeResponse`'s shape) as JSON bytes."""
    results = []
    for verdict in verdicts:
        result = verdict.to_dict()
        result["score"] = reward.score(verdict)
        results.append(result)
    return orjson.dumps({"results": results, "grader_version": grader_version})


def overloaded_headers(exc: OverloadedError) -> dict[str, str]:
    """The headers of a 503 for a full backlog (OpenRLHF and verl retry on it)."""
    return {"Retry-After": f"{max(1, round(exc.retry_after_s))}"}


async def _until_disconnect(receive: Receive) -> None:
    """Returns when the client goes away (the body has been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(
    receive: Receive, work: Awaitable[list[Verdict]]
) -> list[Verdict] | None:
    """`work`'s verdicts, or None (work cancelled) if the client left first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(receive))
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


def too_large_detail(limit: int) -> str:
    """The `detail` of a 413 (every route's)."""
    return f"request body larger than {limit} bytes"


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or its first part once over `limit` bytes; None if the
    client left while sending it."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False) or size > limit:
            return b"".join(chunks)


class FastGrade:
    """ASGI layer: `POST /v1/grade` with a plainly valid body is graded here; every
    other request (and every doubtful body, replayed) goes to `app`.

    The items go straight into the coalescer (`Coalescer.submit`) and the request
    waits on their futures, its deadline and a watch for the client's disconnect
    together (`wait_for_items`): no task per call beyond that watch.

    A body over `max_body_bytes` (by its Content-Length, or once that much has
    arrived) is refused here with a 413, as the service's body-limit layer, which
    sits under this one, refuses it on the other routes: a request graded here
    pays for no such layer.

    Args:
        app: the FastAPI application (documents the route and answers its errors).
        coalescer: where the items are graded (the grader's, shared with `app`).
        deadline_s: a call's deadline in seconds, given the deadline header's
            seconds (or None).
        reward: the reward mapping for `score`.
        max_body_bytes: the largest body graded here.
    """

    def __init__(
        self,
        app: ASGIApp,
        coalescer: Coalescer,
        deadline_s: Callable[[GradeCall, float | None], float],
        reward: RewardConfig,
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self._coalescer = coalescer
        self._deadline_s = deadline_s
        self._reward = reward
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != GRADE_PATH
            or scope["method"] != "POST"
        ):
            await self.app(scope, receive, send)
            return
        header, json_body, length = None, False, None
        for name, value in scope["headers"]:
            if name == _DEADLINE_HEADER_RAW:
                header = value
            elif name == b"content-type":
                json_body = _is_json(value)
            elif name == b"content-length":
                length = value
        limit = self._max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            await _send(send, 413, orjson.dumps({"detail": too_large_detail(limit)}))
            return
        body = await _read_body(receive, limit)
        if body is None:
            return  # the client is gone: nobody to answer
        if len(body) > limit:
            await _send(send, 413, orjson.dumps({"detail": too_large_detail(limit)}))
            return
        # FastAPI refuses a body not labelled JSON (a browser page cannot send JSON
        # cross-site without a preflight); the route gives that 422 too.
        call = parse_grade_body(body) if json_body else None
        try:
            header_s = header_deadline_s(header)
        except BadHeaderError:
            call = None
        if call is None:
            await self.app(scope, _replay(body, receive), send)
            return
        verdicts = await self._grade(call, header_s, receive, send)
        if verdicts is not None:
            version = self._coalescer.grader_version
            await _send(send, 200, encode_results(verdicts, self._reward, version))

    async def _grade(
        self, call: GradeCall, header_s: float | None, receive: Receive, send: Send
    ) -> list[Verdict] | None:
        """The call's verdicts; None when it was answered otherwise (503 for a
        full backlog, 499 for a client that left first)."""
        coalescer = self._coalescer
        try:
            futures = coalescer.submit(call.pairs, call.options, lane=call.lane)
        except OverloadedError as exc:
            detail = orjson.dumps({"detail": str(exc)})
            await _send(send, 503, detail, overloaded_headers(exc))
            return None
        deadline_s = self._deadline_s(call, header_s)
        watch = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await wait_for_items(futures, deadline_s, unless=watch)
        finally:
            # Not awaited (a loop turn per request): the watch only reads
            # `receive`, and the loop delivers the cancellation at its next turn.
            watch.cancel()
            gone = not all(future.done() for future in futures) and watch.done()
            verdicts = coalescer.collect(futures, deadline_s)
        if gone:
            await _send(send, 499, b"")  # nobody reads it; the metrics count it
            return None
        return verdicts


async def _send(
    send: Send, status: int, body: bytes, headers: dict[str, str] | None = None
) -> None:
    """A whole JSON response."""
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                *_JSON_HEADERS,
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _is_json(content_type: bytes) -> bool:
    """`application/json` or `application/*+json`, parameters aside (FastAPI's rule)."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the already-read body first, then the client's own."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
