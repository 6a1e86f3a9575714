"""asyncio twin of `GradingClient`: blocking work runs in threads, never on the loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any

from producer.client.fleet import GradingClient
from producer.client.job import GradingJob, Progress
from workers.models import Verdict

__all__ = ["AsyncGradingClient", "AsyncGradingJob"]


class AsyncGradingJob:
    """A submitted job; `await job.results()` or `async for index, verdict in job`."""

    def __init__(self, job: GradingJob) -> None:
        self._job = job

    @property
    def progress(self) -> Progress:
        return self._job.progress

    async def results(self, timeout_s: float | None = None) -> list[Verdict]:
        return await asyncio.to_thread(self._job.results, timeout_s)

    async def __aiter__(self) -> AsyncIterator[tuple[int, Verdict]]:
        iterator = self._job.as_completed()
        done = object()
        while True:
            pair = await asyncio.to_thread(next, iterator, done)
            if pair is done:
                return
            assert isinstance(pair, tuple)  # narrows `object` for the type checker
            yield pair


class AsyncGradingClient:
    """Same arguments as `GradingClient`; every method is a coroutine.

    The constructor does not touch the network; the broker ping happens in `connect()`
    (called by `async with` and by the first request).
    """

    def __init__(self, broker_url: str, **kwargs: Any) -> None:
        self._factory = functools.partial(GradingClient, broker_url, **kwargs)
        self._client: GradingClient | None = None

    async def connect(self) -> GradingClient:
        if self._client is None:
            self._client = await asyncio.to_thread(self._factory)
        return self._client

    async def __aenter__(self) -> AsyncGradingClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(client.close)

    async def submit(
        self,
        rollouts: Iterable[object],
        *,
        deadline_s: float | None = None,
        priority: str | None = None,
    ) -> AsyncGradingJob:
        """See `GradingClient.submit` (`priority`: this job's lane)."""
        client = await self.connect()
        items = list(rollouts)
        job = await asyncio.to_thread(
            client.submit, items, deadline_s=deadline_s, priority=priority
        )
        return AsyncGradingJob(job)

    async def grade(
        self, rollouts: Iterable[object], *, priority: str | None = None
    ) -> list[Verdict]:
        """Verdicts in input order (see `GradingClient.grade`)."""
        job = await self.submit(rollouts, priority=priority)
        return await job.results()
