"""Native asyncio grading with coalescing, and a blocking facade, for any backend.

`CoalescingGrader(url)` grades rollouts on the backend the URL names (no URL: the
embedded pool; `redis://`: a fleet; `http://`: a `gradefleet serve`), merging
concurrent calls into batches (`producer.client.coalesce`). `grader_for(url)` returns
the one instance of the current process and event loop: adapters call it per sample, and
a forked or spawned process (Ray actors, dataloader workers, TRL's reward process)
gets a fresh one instead of its parent's sockets.

`BlockingGrader` serves sync call sites (verl's `remote` reward manager, OpenRLHF's
reward function run in a thread): every thread's calls go to one background event
loop per process, so concurrent sync callers coalesce too.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from producer.client.backends import Backend, open_backend
from producer.client.coalesce import (
    DEFAULT_MAX_BACKLOG_ITEMS,
    DEFAULT_MAX_BATCH_ITEMS,
    DEFAULT_MAX_DELAY_S,
    Coalescer,
)
from producer.errors import InvalidRolloutError
from workers.models import GradeOptions, Verdict
from workers.wire.contract import text_error
from workers.wire.lanes import INTERACTIVE, Lane
from workers.wire.signing import keyring_from_env

__all__ = [
    "BlockingGrader",
    "CoalescingGrader",
    "close_graders",
    "grader_for",
    "rollout_pairs",
]

T = TypeVar("T")
URL_ENV = "GRADEFLEET_URL"
TOKEN_ENV = "GRADEFLEET_TOKEN"


def rollout_pairs(rollouts: Iterable[object]) -> list[tuple[str, str]]:
    """`(response, gold)` per rollout (a mapping or an object with both attributes).

    Raises:
        InvalidRolloutError: naming the first rollout without string texts.
    """
    pairs = []
    for index, rollout in enumerate(rollouts):
        if isinstance(rollout, Mapping):
            response, gold = rollout.get("response"), rollout.get("gold")
        else:
            response = getattr(rollout, "response", None)
            gold = getattr(rollout, "gold", None)
        if not isinstance(response, str) or not isinstance(gold, str):
            raise InvalidRolloutError(
                f"rollout {index}: response and gold must be strings"
            )
        if (error := text_error(response, gold)) is not None:
            raise InvalidRolloutError(f"rollout {index}: {error}")
        pairs.append((response, gold))
    return pairs


class CoalescingGrader:
    """Grade rollouts on one backend; concurrent calls share batches.

    Args:
        url: grader URL (see module docstring); None: the embedded pool.
        token: bearer token for an `http(s)://` service.
        options: default verdict-changing options.
        backend: use this backend instead of opening one for `url`.
        max_batch_items, max_delay_s, max_backlog_items: see `Coalescer`.
        max_in_flight: batches running at once (None: the backend's own bound).
        on_batch: called with each coalesced batch's size (metrics).
        **backend_kwargs: passed to `open_backend` (embedded pool settings).

    Belongs to the event loop that first calls it; connects on first use.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        options: GradeOptions | None = None,
        backend: Backend | None = None,
        max_batch_items: int = DEFAULT_MAX_BATCH_ITEMS,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        max_backlog_items: int = DEFAULT_MAX_BACKLOG_ITEMS,
        max_in_flight: int | None = None,
        on_batch: Callable[[int], None] | None = None,
        **backend_kwargs: Any,
    ) -> None:
        self.backend = backend or open_backend(url, token=token, **backend_kwargs)
        self.options = options or GradeOptions()
        self.coalescer = Coalescer(
            self.backend.grade_batch,
            max_batch_items=max_batch_items,
            max_delay_s=max_delay_s,
            max_in_flight=max_in_flight or self.backend.max_in_flight,
            max_backlog_items=max_backlog_items,
            on_batch=on_batch,
        )

    async def grade(
        self,
        rollouts: Iterable[object],
        *,
        options: GradeOptions | None = None,
        lane: Lane = INTERACTIVE,
        deadline_s: float | None = None,
    ) -> list[Verdict]:
        """Verdicts in input order; unfinished items at `deadline_s` are `timeout`.
        `lane`: on a fleet, the lane of their batches (`interactive` or `bulk`).

        Raises:
            InvalidRolloutError: a rollout lacks string `response`/`gold`.
            OverloadedError: too many rollouts are waiting (retry later).
        """
        return await self.grade_pairs(
            rollout_pairs(rollouts), options=options, lane=lane, deadline_s=deadline_s
        )

    async def grade_pairs(
        self,
        pairs: list[tuple[str, str]],
        *,
        options: GradeOptions | None = None,
        lane: Lane = INTERACTIVE,
        deadline_s: float | None = None,
    ) -> list[Verdict]:
        """`grade` for already validated `(response, gold)` pairs."""
        return await self.coalescer.grade(
            pairs, options or self.options, lane=lane, deadline_s=deadline_s
        )

    async def ready(self) -> tuple[bool, str]:
        return await self.backend.ready()

    async def code_ready(self) -> tuple[bool, str] | None:
        """Whether the backend grades code (None: on this machine; probe it)."""
        return await self.backend.code_ready()

    async def aclose(self) -> None:
        await self.coalescer.aclose()
        await self.backend.aclose()

    async def __aenter__(self) -> CoalescingGrader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_Registry = weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, str], CoalescingGrader]
]
_registry: _Registry = weakref.WeakKeyDictionary()
_registry_pid = os.getpid()


def grader_for(url: str | None = None, *, token: str | None = None) -> CoalescingGrader:
    """The shared grader of this process and running loop for `url`.

    `url` None reads `GRADEFLEET_URL` (then `GRADEFLEET_BROKER_URL`; neither: the
    embedded pool), `token` None reads `GRADEFLEET_TOKEN`.
    """
    global _registry, _registry_pid
    if os.getpid() != _registry_pid:  # forked: the parent's sockets are not ours
        _registry, _registry_pid = weakref.WeakKeyDictionary(), os.getpid()
    if url is None:
        url = os.environ.get(URL_ENV) or os.environ.get("GRADEFLEET_BROKER_URL") or ""
    if token is None:
        token = os.environ.get(TOKEN_ENV) or ""
    loop = asyncio.get_running_loop()
    graders = _registry.setdefault(loop, {})
    grader = graders.get((url, token))
    if grader is None:
        # A fleet's signing key is read with its URL (the workers read the same).
        extra: dict[str, Any] = {}
        if url.split(":", 1)[0].lower() in ("redis", "rediss"):
            extra["keyring"] = keyring_from_env(os.environ)
        grader = graders[(url, token)] = CoalescingGrader(
            url or None, token=token or None, **extra
        )
    return grader


async def close_graders() -> None:
    """Close the shared graders of the running loop (before the loop ends)."""
    graders = _registry.pop(asyncio.get_running_loop(), {})
    for grader in graders.values():
        await grader.aclose()


class _LoopThread:
    """One daemon thread running an event loop, per process."""

    _lock = threading.Lock()
    _instance: _LoopThread | None = None

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="gradefleet-loop", daemon=True
        )
        self.thread.start()

    @classmethod
    def get(cls) -> _LoopThread:
        with cls._lock:
            if cls._instance is None or cls._instance.pid != os.getpid():
                cls._instance = cls()
            return cls._instance

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


class BlockingGrader:
    """Blocking twin of `grader_for(url)`: `grade()` from any thread, coalesced."""

    def __init__(self, url: str | None = None, *, token: str | None = None) -> None:
        self.url = url
        self.token = token

    def grade(
        self,
        rollouts: Iterable[object],
        *,
        options: GradeOptions | None = None,
        deadline_s: float | None = None,
    ) -> list[Verdict]:
        pairs = rollout_pairs(rollouts)
        return self.grade_pairs(pairs, options=options, deadline_s=deadline_s)

    def grade_pairs(
        self,
        pairs: list[tuple[str, str]],
        *,
        options: GradeOptions | None = None,
        deadline_s: float | None = None,
    ) -> list[Verdict]:
        async def call() -> list[Verdict]:
            grader = grader_for(self.url, token=self.token)
            return await grader.grade_pairs(
                pairs, options=options, deadline_s=deadline_s
            )

        return _LoopThread.get().run(call())
