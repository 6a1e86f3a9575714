"""Asynchronous batch graders behind the coalescer, chosen by URL.

- no URL: `PoolBackend`, the embedded pool on this machine (`workers.embedded.pool`);
- `redis://`, `rediss://`, `sentinel://`: `FleetBackend`, a Celery fleet;
- `http://`, `https://`: `HttpBackend`, a running `gradefleet serve`.

Each grades one list of `(response, gold)` pairs per call and never blocks the event
loop. Blocking libraries (kombu's publisher, the pool's pipes) run on ONE thread per
backend, not a thread per call: the coalescer hands them whole batches. The fleet's
results are awaited natively: one `redis.asyncio` BLPOP on the done lists of every
job in flight wakes the backend as soon as any batch finishes.

Nothing connects in a constructor (safe to build before a fork); a backend belongs to
the event loop that first uses it (`producer.client.grading` keeps one per process and
loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from producer.errors import ProducerError
from producer.extras import require
from producer.settings import CACHE_FILE_NAME, ProducerSettings, redact_url
from workers.code.item import is_code_gold
from workers.models import GradeOptions, Rollout, Verdict
from workers.sizing import COALESCED_BATCH_SIZE
from workers.wire.lanes import Lane

if TYPE_CHECKING:
    import httpx
    import redis.asyncio as aioredis

    from producer.client.fleet import GradingClient
    from producer.client.grader import Grader
    from producer.client.job import GradingJob
    from workers.wire.signing import Keyring

__all__ = [
    "Backend",
    "BackendError",
    "FleetBackend",
    "HttpBackend",
    "PoolBackend",
    "open_backend",
]

T = TypeVar("T")

# A fleet job not finished after this long is given up (its callers get `error`
# verdicts); GradingJob re-sends lost batches long before.
DEFAULT_FLEET_JOB_LIMIT_S = 3600.0
# How long one BLPOP waits: bounds how late a failure (Celery stores it and pushes no
# id) or a re-send check is seen.
_WAKE_WAIT_S = 0.25
_READY_CACHE_S = 2.0
# An HTTP batch refused with 503 is retried after the server's Retry-After this often.
_HTTP_RETRIES = 5
_HTTP_GRADE_PATH = "/v1/grade"


class BackendError(ProducerError):
    """The grading backend failed for a whole batch (becomes `error` verdicts)."""


class Backend(Protocol):
    """What the coalescer and the service need from a backend."""

    @property
    def max_in_flight(self) -> int: ...

    async def grade_batch(
        self, pairs: list[tuple[str, str]], options: GradeOptions, lane: Lane
    ) -> list[Verdict]:
        """Verdicts for `pairs` in order; `lane`: the fleet lane (a backend without
        lanes ignores it)."""
        ...

    async def ready(self) -> tuple[bool, str]: ...

    async def code_ready(self) -> tuple[bool, str] | None:
        """Whether code rollouts can be graded behind it, and why; None: not known
        here (the embedded pool grades on this machine, whose sandbox the caller
        probes itself)."""
        ...

    async def aclose(self) -> None: ...


class _OneThread:
    """A single worker thread for a backend's blocking calls."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class PoolBackend:
    """The embedded pool through the `Grader` seam (`open_grader(None)`: the same
    grader as `gradefleet grade`, exact-response cache included), one batch at a
    time, each with its request's options.

    The pool grades one call at a time over its processes, so the coalescer runs one
    batch of a kind here at once and lets the next one grow meanwhile. Code batches
    (their golds are encoded tests) go to a second pool with its own thread, opened
    on the first of them: a batch of slow programs never holds up a math batch.
    """

    max_in_flight = 1

    def __init__(
        self,
        *,
        processes: int,
        item_timeout_s: float = 5.0,
        item_memory_mb: int = 1024,
        cache_path: Path | None = None,
        batch_size: int = 64,
    ) -> None:
        self._settings = ProducerSettings(
            processes=processes,
            item_timeout_s=item_timeout_s,
            item_memory_mb=item_memory_mb,
            cache_dir=None if cache_path is None else cache_path.parent,
            batch_size=batch_size,
        )
        if cache_path is not None and self._settings.cache_path != cache_path:
            raise ValueError(f"the embedded cache file is named {CACHE_FILE_NAME}")
        self._grader: Grader | None = None
        self._thread = _OneThread("gradefleet-pool")
        self._code_grader: Grader | None = None
        self._code_thread: _OneThread | None = None

    def _open(self) -> Grader:
        if self._grader is None:
            # Imported here: grading pulls in the sandbox and the verifier (SymPy).
            from producer.client.grader import open_grader
            from workers.sandbox.process import warm_up_verifier

            self._grader = open_grader(None, settings=self._settings)
            warm_up_verifier()
        return self._grader

    def _open_code(self) -> Grader:
        if self._code_grader is None:
            from producer.client.grader import open_grader

            self._code_grader = open_grader(None, settings=self._settings)
        return self._code_grader

    def _grade(
        self, pairs: list[tuple[str, str]], options: GradeOptions, code: bool = False
    ) -> list[Verdict]:
        rollouts = [Rollout(response, gold) for response, gold in pairs]
        grader = self._open_code() if code else self._open()
        return grader.grade(rollouts, options=options)

    async def start(self) -> None:
        """Import the verifier now rather than on the first request."""
        await self._thread.run(self._open)

    async def grade_batch(
        self, pairs: list[tuple[str, str]], options: GradeOptions, lane: Lane
    ) -> list[Verdict]:
        if pairs and is_code_gold(pairs[0][1]):  # the coalescer's batches: one kind
            if self._code_thread is None:
                self._code_thread = _OneThread("gradefleet-code-pool")
            return await self._code_thread.run(self._grade, pairs, options, True)
        return await self._thread.run(self._grade, pairs, options)

    async def ready(self) -> tuple[bool, str]:
        if self._grader is None:
            return False, "embedded pool not started"
        settings = self._settings
        return True, (
            f"embedded pool of {settings.processes} processes; per item "
            f"{settings.item_timeout_s:g} s and {settings.item_memory_mb} MiB; "
            f"cache {settings.cache_path or 'off'}"
        )

    async def code_ready(self) -> tuple[bool, str] | None:
        return None  # this machine's sandbox: the caller probes it

    async def aclose(self) -> None:
        grader, self._grader = self._grader, None
        if grader is not None:
            await self._thread.run(grader.close)
        self._thread.shutdown()
        code_grader, self._code_grader = self._code_grader, None
        if self._code_thread is not None:
            if code_grader is not None:
                await self._code_thread.run(code_grader.close)
            self._code_thread.shutdown()


@dataclass(slots=True)
class _FleetJob:
    job: GradingJob
    future: asyncio.Future[list[Verdict]]
    started_at: float


class FleetBackend:
    """A Celery fleet: each coalesced batch is one `GradingClient` job.

    Few batches in flight (`max_in_flight`): while they run, new calls pile up and
    leave as one bigger batch, so per-sample callers cost the fleet about what one
    batched caller costs. Each job is split into tasks of `COALESCED_BATCH_SIZE`
    (a 256-item job: 4), so a larger fleet needs more batches in flight.

    Publishing and result bookkeeping (`GradingJob.poll`, which also re-sends lost
    batches) run on the backend's thread; waiting is a `redis.asyncio` BLPOP on the
    done lists of all jobs in flight, so a thousand waiting callers cost no threads.
    """

    # Two, not more: every job costs its publishing and bookkeeping on the backend's
    # one thread, and a job of a few items costs a worker a whole task; with 8 slots
    # a 5 ms window at a few hundred calls/s sent ~200 jobs of 1-2 items a second,
    # which saturated a 2-worker fleet at half its batch rate. In A/B runs of
    # bench_serve's loads on the shared 2-core machine, 2 slots gave 1.2-1.4x the HTTP
    # rollouts/s of 8 and a third to a half of the half-load p50 (HTTP and the
    # in-process client), the in-process full-load rate within noise. A 256-item job
    # is 4 tasks, so 2 in flight feed 8 workers; serve a larger fleet with
    # `--coalesce-max-in-flight` (and `--coalesce-max-items`).
    max_in_flight = 2

    def __init__(
        self,
        broker_url: str,
        *,
        item_timeout_s: float = 5.0,
        job_limit_s: float = DEFAULT_FLEET_JOB_LIMIT_S,
        keyring: Keyring | None = None,
    ) -> None:
        self.broker_url = broker_url
        self._keyring = keyring  # the fleet key (`workers.wire.signing`), if it has one
        self._item_timeout_s = item_timeout_s
        self._job_limit_s = job_limit_s
        self._clients: dict[GradeOptions, GradingClient] = {}
        self._thread = _OneThread("gradefleet-fleet")
        self._jobs: dict[str, _FleetJob] = {}
        self._wake: asyncio.Event | None = None
        self._collector: asyncio.Task[None] | None = None
        self._aredis: aioredis.Redis[bytes] | None = None
        # When the fleet was last read, and its answers: ready, and code ready.
        self._ready: tuple[float, tuple[bool, str], tuple[bool, str]] | None = None

    def _client(self, options: GradeOptions) -> GradingClient:
        client = self._clients.get(options)
        if client is None:
            from producer.client.fleet import GradingClient

            # One client per options value (the options travel per client); the
            # set of values in use is tiny.
            client = GradingClient(
                self.broker_url,
                batch_size=COALESCED_BATCH_SIZE,
                options=options,
                item_timeout_s=self._item_timeout_s,
                keyring=self._keyring,
            )
            self._clients[options] = client
        return client

    def _submit(
        self, pairs: list[tuple[str, str]], options: GradeOptions, lane: Lane
    ) -> GradingJob:
        rollouts = [{"response": r, "gold": g} for r, g in pairs]
        return self._client(options).submit(rollouts, priority=lane)

    async def start(self) -> None:
        """Connect now (ping the broker) rather than on the first request."""
        await self._thread.run(self._client, GradeOptions())

    async def grade_batch(
        self, pairs: list[tuple[str, str]], options: GradeOptions, lane: Lane
    ) -> list[Verdict]:
        job = await self._thread.run(self._submit, pairs, options, lane)
        future: asyncio.Future[list[Verdict]] = (
            asyncio.get_running_loop().create_future()
        )
        self._jobs[job.job_id] = _FleetJob(job, future, time.monotonic())
        self._kick()
        try:
            return await future
        finally:
            self._jobs.pop(job.job_id, None)

    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._collector is None or self._collector.done():
            self._collector = asyncio.get_running_loop().create_task(self._collect())

    def _poll(self, jobs: list[_FleetJob]) -> list[tuple[_FleetJob, Any]]:
        """Runs on the backend thread: finished jobs with their verdicts or error."""
        finished: list[tuple[_FleetJob, Any]] = []
        now = time.monotonic()
        for entry in jobs:
            try:
                progress = entry.job.poll()
                if progress.done >= progress.total:
                    finished.append((entry, entry.job.results()))
                elif now - entry.started_at > self._job_limit_s:
                    raise BackendError(f"fleet job not done in {self._job_limit_s:g} s")
            except ProducerError as exc:
                finished.append((entry, exc))
        return finished

    async def _collect(self) -> None:
        """Wake on any job's done list, poll the jobs, resolve the finished ones.

        A popped done list names its job: only that one is polled then (the others
        had no news; polling them cost a round trip each), and a new job only
        joins the wait (it has no news yet). Every job is polled after a wait with
        no news and at least every `_WAKE_WAIT_S` (failures and heartbeats push
        nothing).
        """
        from workers.wire.connections import async_redis_client

        assert self._wake is not None
        if self._aredis is None:
            self._aredis = async_redis_client(self.broker_url)
        news_of: str | None = None  # the job to poll ("": none); None: all of them
        all_polled_at = 0.0
        while self._jobs:
            self._wake.clear()
            now = time.monotonic()
            if news_of is None or now - all_polled_at >= _WAKE_WAIT_S:
                entries, all_polled_at = [*self._jobs.values()], now
            else:
                entries = [e for e in (self._jobs.get(news_of),) if e is not None]
            if entries:
                for entry, outcome in await self._thread.run(self._poll, entries):
                    if entry.future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        entry.future.set_exception(outcome)
                    else:
                        entry.future.set_result(outcome)
                    self._jobs.pop(entry.job.job_id, None)
            if not self._jobs:
                return
            news_of = await self._wait(self._aredis, self._done_keys())

    def _done_keys(self) -> dict[str, str]:
        """The done list of every job in flight, to its job id."""
        from workers.wire.protocol import job_done_key

        return {job_done_key(job_id): job_id for job_id in self._jobs}

    async def _wait(
        self, client: aioredis.Redis[bytes], keys: dict[str, str]
    ) -> str | None:
        """Until a done list of `keys` gets an id (returns its job id), a new job
        arrives (returns ""), or `_WAKE_WAIT_S` passes (returns None)."""
        assert self._wake is not None
        pop = asyncio.ensure_future(client.blpop(list(keys), timeout=_WAKE_WAIT_S))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({pop, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pop, woken):
                task.cancel()
                # A cancelled BLPOP drops its connection (redis-py cannot tell
                # whether the reply was read): it only costs a reconnect, and a
                # popped id is only a wake-up (a finished batch stays in Redis
                # until its job's poll, which every job gets within _WAKE_WAIT_S).
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if not pop.done() or pop.cancelled():
            return ""  # woken by a new job
        if pop.exception() is not None:
            await asyncio.sleep(_WAKE_WAIT_S)  # Redis restarting: polls cover it
            return None
        reply = pop.result()
        if reply is None:
            return None
        key = reply[0]
        return keys.get(key.decode() if isinstance(key, bytes) else str(key))

    async def ready(self) -> tuple[bool, str]:
        """Broker answers and at least one worker replies to a ping (cached 2 s)."""
        return (await self._read_fleet())[0]

    async def code_ready(self) -> tuple[bool, str]:
        """At least one live worker consumes the code queues (`--kinds`), whatever
        this machine could run (cached 2 s, read with `ready`)."""
        return (await self._read_fleet())[1]

    async def _read_fleet(self) -> tuple[tuple[bool, str], tuple[bool, str]]:
        now = time.monotonic()
        if self._ready is not None and now - self._ready[0] < _READY_CACHE_S:
            return self._ready[1], self._ready[2]
        ready, code = await asyncio.to_thread(self._check_ready)
        self._ready = (now, ready, code)
        return ready, code

    def _check_ready(self) -> tuple[tuple[bool, str], tuple[bool, str]]:
        from producer.client.status import read_fleet_status

        try:
            fleet = read_fleet_status(self.broker_url, timeout_s=1.0, window_s=0.0)
        except (ProducerError, OSError) as exc:
            down = False, f"broker {redact_url(self.broker_url)}: {exc}"
            return down, down
        workers = len(fleet.workers)
        if workers == 0:
            return (False, "no live worker answered"), (False, "no live worker")
        code = [w.name for w in fleet.workers if w.grades_code]
        if not code:
            none = f"none of the {workers} live workers takes code (--kinds code)"
            return (True, f"{workers} live workers"), (False, none)
        takes = f"{len(code)} live workers take code: {', '.join(code[:8])}"
        return (True, f"{workers} live workers"), (True, takes)

    async def aclose(self) -> None:
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._collector
        for entry in self._jobs.values():
            if not entry.future.done():
                entry.future.cancel()
        if self._aredis is not None:
            await self._aredis.aclose()  # type: ignore[attr-defined]
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await self._thread.run(client.close)
        self._thread.shutdown()


class HttpBackend:
    """A running `gradefleet serve` (POST /v1/grade with httpx's async client)."""

    max_in_flight = 64

    def __init__(
        self, url: str, *, token: str | None = None, request_timeout_s: float = 300.0
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._timeout_s = request_timeout_s
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx

            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
            self._client = httpx.AsyncClient(
                base_url=self.url,
                headers=headers,
                timeout=httpx.Timeout(self._timeout_s, connect=10.0),
                limits=httpx.Limits(max_connections=self.max_in_flight * 2),
            )
        return self._client

    async def grade_batch(
        self, pairs: list[tuple[str, str]], options: GradeOptions, lane: Lane
    ) -> list[Verdict]:
        import httpx

        from producer.client.http_client import request_options

        body = {
            "items": [{"response": r, "gold": g} for r, g in pairs],
            "options": request_options(options, lane),
        }
        for _ in range(_HTTP_RETRIES):
            try:
                reply = await self._http().post(_HTTP_GRADE_PATH, json=body)
            except httpx.HTTPError as exc:
                raise BackendError(f"{redact_url(self.url)}: {exc}") from exc
            if reply.status_code == 503:
                await asyncio.sleep(_retry_after_s(reply.headers.get("Retry-After")))
                continue
            if reply.status_code != 200:
                raise BackendError(
                    f"{redact_url(self.url)} answered {reply.status_code}: "
                    f"{reply.text[:300]}"
                )
            results = reply.json()["results"]
            return [Verdict.from_dict(result) for result in results]
        raise BackendError(f"{redact_url(self.url)} stayed overloaded (503)")

    async def ready(self) -> tuple[bool, str]:
        import httpx

        try:
            reply = await self._http().get("/readyz")
        except httpx.HTTPError as exc:
            return False, f"{redact_url(self.url)}: {exc}"
        return reply.status_code == 200, reply.text[:300]

    async def code_ready(self) -> tuple[bool, str] | None:
        return None  # the service's own `/readyz` says (see `ready`)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _retry_after_s(value: str | None) -> float:
    try:
        return min(max(float(value or 1.0), 0.05), 30.0)
    except ValueError:
        return 1.0


def open_backend(
    url: str | None,
    *,
    token: str | None = None,
    processes: int | None = None,
    item_timeout_s: float = 5.0,
    item_memory_mb: int = 1024,
    cache_path: Path | None = None,
    keyring: Keyring | None = None,
) -> Backend:
    """The backend for `url` (see the module docstring); connects lazily.
    `keyring`: a fleet's signing keys (redis:// URLs only)."""
    if not url:
        import os

        return PoolBackend(
            processes=processes or os.cpu_count() or 1,
            item_timeout_s=item_timeout_s,
            item_memory_mb=item_memory_mb,
            cache_path=cache_path,
        )
    scheme = url.split(":", 1)[0].lower()
    if scheme in ("redis", "rediss", "sentinel"):
        return FleetBackend(url, item_timeout_s=item_timeout_s, keyring=keyring)
    if scheme in ("http", "https"):
        require("serve", "httpx")  # the client half of the serve extra
        return HttpBackend(url, token=token)
    raise ValueError(
        f"unsupported grader URL {redact_url(url)!r}: use redis://, rediss://, "
        "sentinel://, http:// or https:// (or none for the embedded pool)"
    )
