"""The one seam every front end grades through: `open_grader(url)` -> a `Grader`.

The URL picks where rollouts are graded, and the verdicts are the same everywhere:

    None                  the embedded pool of local processes (`workers.embedded.pool`)
    redis:// rediss://    a Celery fleet (`producer.client.fleet.GradingClient`)
    sentinel://           the same, its Redis found through Sentinel
                          (`workers.wire.urls`)
    http:// https://      a running `gradefleet serve` (`producer.client.http_client`;
                          needs httpx, the `serve` extra)

A new transport registers its URL schemes with `register_scheme`; the factory is
named by "module:function" so that nothing is imported until a URL needs it (the
embedded pool pulls in SymPy, the fleet client Celery).
"""

from __future__ import annotations

import abc
import importlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self
from urllib.parse import urlsplit

from producer.client.rollouts import validate_rollouts
from producer.errors import DeadlinePassedError, JobCutShortError, ProducerError
from producer.settings import ProducerSettings
from workers.models import GradeOptions, Rollout, RolloutLike, Verdict
from workers.wire.lanes import INTERACTIVE

if TYPE_CHECKING:
    from workers.embedded.pool import LocalPool

__all__ = [
    "Grader",
    "GraderBase",
    "GraderFactory",
    "ProgressFn",
    "line_runner",
    "open_grader",
    "register_scheme",
]

log = logging.getLogger(__name__)

# Stored units a re-grade renders on a replay pool rather than in this process
# (fewer: forking its processes costs more than it saves).
_PARALLEL_REPLAY_UNITS = 16

ProgressFn = Callable[[int], None]
"""Called with the number of rollouts graded since the previous call."""


class Grader(Protocol):
    """Grades rollouts somewhere; the same verdicts whichever `open_grader` URL."""

    def grade(
        self,
        rollouts: Sequence[RolloutLike],
        *,
        on_progress: ProgressFn | None = None,
        deadline_s: float | None = None,
        options: GradeOptions | None = None,
    ) -> list[Verdict]:
        """Verdict i belongs to rollouts[i].

        Args:
            rollouts: anything with `response` and `gold` strings.
            on_progress: called as rollouts finish, with how many more are done.
            deadline_s: seconds from now; None: wait as long as it takes.
            options: verdict-changing options for these rollouts; None: those the
                grader was opened with (a service grades each request with its own).

        Raises:
            InvalidRolloutError: a rollout's text is not a string or too long.
            DeadlinePassedError: `deadline_s` passed before every verdict arrived.
            BrokerUnavailableError: a remote grader cannot be reached.
        """
        ...

    def close(self) -> None:
        """Release processes and connections (idempotent)."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


GraderFactory = Callable[[str | None, GradeOptions, ProducerSettings], Grader]
"""Builds a grader from (url, options, settings)."""

_EMBEDDED = ""  # the "scheme" of no URL
_FACTORIES: dict[str, str | GraderFactory] = {
    _EMBEDDED: "producer.client.grader:_open_embedded",
    "redis": "producer.client.grader:_open_fleet",
    "rediss": "producer.client.grader:_open_fleet",
    "sentinel": "producer.client.grader:_open_fleet",
    "http": "producer.client.http_client:open_http_grader",
    "https": "producer.client.http_client:open_http_grader",
}


def register_scheme(scheme: str, factory: str | GraderFactory) -> None:
    """Make `open_grader` build `scheme://` URLs with `factory` (a callable, or its
    "module:function" name, imported on first use)."""
    _FACTORIES[scheme.lower()] = factory


def open_grader(
    url: str | None = None,
    *,
    options: GradeOptions | None = None,
    settings: ProducerSettings | None = None,
) -> Grader:
    """The grader for `url` (None: the embedded pool on this machine).

    Args:
        url: where to grade (see the module docstring).
        options: verdict-changing options for every rollout graded.
        settings: batch size, item limits, processes, cache directory, lane. None:
            the defaults, but in the interactive lane (a program waits on its jobs;
            the CLI passes its own settings, bulk unless told otherwise).

    Raises:
        ProducerError: no grader is registered for the URL's scheme.
        BrokerUnavailableError: a fleet URL whose broker does not answer.
    """
    scheme = _EMBEDDED if not url else urlsplit(url).scheme.lower()
    factory = _FACTORIES.get(scheme)
    if factory is None:
        known = ", ".join(sorted(f"{s}://" for s in _FACTORIES if s))
        raise ProducerError(f"no grader for {scheme or url!r} URLs (known: {known})")
    if isinstance(factory, str):
        module, _, name = factory.partition(":")
        factory = getattr(importlib.import_module(module), name)
        assert callable(factory)
    options = options or GradeOptions()
    if settings is None:
        settings = ProducerSettings(priority=INTERACTIVE)
    return factory(url or None, options, settings)


class GraderBase(abc.ABC):
    """A base for `Grader` implementations: the context-manager plumbing around
    `grade` and `close` (subclassing it is optional; the protocol is what counts)."""

    @abc.abstractmethod
    def grade(
        self,
        rollouts: Sequence[RolloutLike],
        *,
        on_progress: ProgressFn | None = None,
        deadline_s: float | None = None,
        options: GradeOptions | None = None,
    ) -> list[Verdict]:
        """See `Grader.grade`."""

    @abc.abstractmethod
    def close(self) -> None:
        """See `Grader.close`."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _deadline_at(deadline_s: float | None) -> float | None:
    return None if deadline_s is None else time.monotonic() + deadline_s


def _as_steps(on_progress: ProgressFn | None) -> Callable[[int], None] | None:
    """`on_progress` (counts since the last call) for the pool's running totals."""
    if on_progress is None:
        return None
    done = 0

    def advance(done_in_call: int) -> None:
        nonlocal done
        on_progress(done_in_call - done)
        done = done_in_call

    return advance


class _EmbeddedGrader(GraderBase):
    """The local pool: worker processes on this machine, each with its own sandbox.

    With the cache on, rollouts graded before are answered here, from the cache's
    exact-response layer (`workers.cache.exact`); only the others go to the pool,
    whose processes start on the first rollout that needs them.
    """

    def __init__(self, options: GradeOptions, settings: ProducerSettings) -> None:
        # Imported here: the cache needs the grader version (not SymPy), the pool
        # (on the first miss) the sandbox and the verifier's warm-up.
        from workers.cache.exact import ExactLayer
        from workers.cache.results import SqliteResultCache
        from workers.kinds import DEFAULT_KIND, grader_for

        if settings.cache_dir is not None:
            settings.cache_dir.mkdir(parents=True, exist_ok=True)
        self._options = options
        self._settings = settings
        self._pool: LocalPool | None = None
        self._replay_pool: LocalPool | None = None  # see `_replay`
        # Line mode: the pool's workers look each unit up themselves (see
        # `run_line_units`), once a call found one the cache did not hold.
        self._workers_look_up = False
        self._cache = None
        self._exact = None
        if settings.cache_path is not None:
            self._cache = SqliteResultCache(settings.cache_path)
            self._exact = ExactLayer(self._cache, grader_for(DEFAULT_KIND).version)

    def _processes(self) -> int:
        return self._settings.processes or os.cpu_count() or 1

    def _new_pool(self, **kw: Any) -> LocalPool:
        """A pool with this grader's process count and item limits."""
        from workers.embedded.pool import LocalPool
        from workers.sizing import LOCAL_BATCH_SIZE

        settings = self._settings
        return LocalPool(
            processes=self._processes(),
            item_timeout_s=settings.item_timeout_s,
            item_memory_bytes=settings.item_memory_mb * 1024 * 1024,
            batch_size=settings.batch_size or LOCAL_BATCH_SIZE,
            **kw,
        )

    def _started_pool(self) -> LocalPool:
        if self._pool is None:
            from workers.lines.units import grade_line_unit

            self._pool = self._new_pool(
                cache_path=self._settings.cache_path, unit_fn=grade_line_unit
            )
        return self._pool

    def run_line_units(
        self,
        units: Sequence[Any],
        weights: Sequence[int],
        *,
        on_progress: ProgressFn | None = None,
        deadline_s: float | None = None,
    ) -> list[Any]:
        """Line mode (`workers.lines.units`): each unit run whole by a pool worker, or
        rendered here from its rows' verdicts kept in the cache (a re-graded file
        starts no pool at all). None where a unit has no result:
        the deadline passed first, or its worker was lost too often with no item to
        blame (grade its rows with `grade`).

        The units are looked up here while every call's were all found (a file
        graded before); after a call with one the cache did not hold (a new
        file), the pool's workers look up theirs: hashing a 20,000-line chunk's
        units and looking them up here held up the pool's cores for ~10 ms
        between chunks (issue 11). A worker renders a unit it finds as this
        process would."""
        from workers.errors import DeadlineError

        results: list[Any] = [None] * len(units)
        keys = None
        if not self._workers_look_up:
            keys = self._stored_units(units, results)
        todo = [i for i, result in enumerate(results) if result is None]
        look_up = self._workers_look_up
        if todo and self._exact is not None:
            self._workers_look_up = True  # from the next call on
        if on_progress is not None and len(todo) < len(units):
            on_progress(sum(weights) - sum(weights[i] for i in todo))
        if not todo:
            return results
        ran: list[Any]
        try:
            ran = self._started_pool().run_units(
                [units[i] for i in todo],
                [weights[i] for i in todo],
                on_progress=_as_steps(on_progress),
                deadline_at=_deadline_at(deadline_s),
                keys=None if keys is None else [keys[i] for i in todo],
                look_up=look_up,
            )
        except DeadlineError as exc:
            ran = list(exc.partial or [None] * len(todo))
        for index, result in zip(todo, ran, strict=True):
            results[index] = result
        return results

    def _stored_units(
        self, units: Sequence[Any], results: list[Any]
    ) -> list[str] | None:
        """Fill `results` with the units the cache holds whole; their keys (None
        without a cache)."""
        from workers.errors import CacheError

        if self._exact is None:
            return None
        assert self._cache is not None
        keys = self._exact.unit_keys(units)
        try:
            stored = self._exact.lookup_units(keys)
        except CacheError as exc:  # the pool grades them all, as without a cache
            log.warning("unit cache lookup failed: %s", exc)
            return keys
        finally:
            self._cache.close()  # before the pool forks (see `_known`)
        found = [index for index, key in enumerate(keys) if key in stored]
        replayed = self._replay([(*units[i], stored[keys[i]]) for i in found])
        for index, result in zip(found, replayed, strict=True):
            results[index] = result
        return keys

    def _replay(self, jobs: list[tuple[Any, bytes, str]]) -> list[Any]:
        """`replay_line_unit` of each (unit, body, stored text): in this process for
        a few, else on a replay pool (forked here, no verifier warm-up: it renders,
        never grades), since a re-graded file's work is all rendering and one core
        did it alone (issue 11). A unit the pool lost is rendered here."""
        from workers.lines.units import (
            replay_body,
            replay_line_unit,
            replay_stored_unit,
        )

        if self._processes() < 2 or len(jobs) < _PARALLEL_REPLAY_UNITS:
            return [replay_line_unit(*job) for job in jobs]
        if self._replay_pool is None:
            self._replay_pool = self._new_pool(
                cache_path=None, unit_fn=replay_stored_unit, warm_up=False
            )
        ran = self._replay_pool.run_units(
            [(unit, replay_body(body, stored)) for unit, body, stored in jobs],
            [len(unit["numbers"]) for unit, _body, _stored in jobs],
        )
        results: list[Any] = []
        for job, result in zip(jobs, ran, strict=True):
            if result is None:
                results.append(replay_line_unit(*job))
            else:
                results.append(None if result[0].get("unfit") else result)
        return results

    def grade(
        self,
        rollouts: Sequence[RolloutLike],
        *,
        on_progress: ProgressFn | None = None,
        deadline_s: float | None = None,
        options: GradeOptions | None = None,
    ) -> list[Verdict]:
        options = options or self._options
        triples = validate_rollouts(rollouts)
        if not all(isinstance(getattr(r, "gold", None), str) for r in rollouts):
            # Numeric golds (and mappings) become text rollouts, as on the fleet.
            rollouts = [Rollout(response=r, gold=g) for _, r, g in triples]
        known = self._known([(r, g) for _, r, g in triples], options)
        todo = [i for i, verdict in enumerate(known) if verdict is None]
        if on_progress is not None and len(todo) < len(known):
            on_progress(len(known) - len(todo))
        if not todo:
            return [verdict for verdict in known if verdict is not None]
        try:
            graded = self._grade_in_pool(
                [rollouts[i] for i in todo], options, on_progress, deadline_s
            )
        except DeadlinePassedError as exc:  # what did arrive, at its own index
            for index, verdict in zip(todo, exc.partial or [], strict=False):
                known[index] = verdict
            exc.partial = known
            raise
        for index, verdict in zip(todo, graded, strict=True):
            known[index] = verdict
        return [verdict for verdict in known if verdict is not None]

    def _known(
        self, pairs: list[tuple[str, str]], options: GradeOptions
    ) -> list[Verdict | None]:
        """Verdicts stored whole for these very texts (None: grade it)."""
        from workers.errors import CacheError

        if self._exact is None:
            return [None] * len(pairs)
        assert self._cache is not None
        try:
            return self._exact.lookup(pairs, options)
        except CacheError as exc:  # the pool grades them all, as without a cache
            log.warning("exact-response cache lookup failed: %s", exc)
            return [None] * len(pairs)
        finally:
            # The pool forks its workers from this process, and an SQLite connection
            # open across a fork breaks the child's own (SQLite keeps per-process
            # lock state per file): measured, a worker then waits "locked" forever.
            self._cache.close()

    def _grade_in_pool(
        self,
        rollouts: Sequence[RolloutLike],
        options: GradeOptions,
        on_progress: ProgressFn | None,
        deadline_s: float | None,
    ) -> list[Verdict]:
        from workers.errors import DeadlineError

        try:
            return self._started_pool().grade(
                rollouts,
                options,
                on_progress=_as_steps(on_progress),
                deadline_at=_deadline_at(deadline_s),
            )
        except DeadlineError as exc:
            raise DeadlinePassedError(str(exc), partial=exc.partial) from exc

    def close(self) -> None:
        for pool in (self._pool, self._replay_pool):
            if pool is not None:
                pool.close()
        if self._cache is not None:
            self._cache.close()


class _FleetGrader(GraderBase):
    """A Celery fleet through Redis (`GradingClient`)."""

    def __init__(
        self, url: str, options: GradeOptions, settings: ProducerSettings
    ) -> None:
        from producer.client.fleet import GradingClient

        self._client = GradingClient(
            url,
            batch_size=settings.batch_size,
            options=options,
            item_timeout_s=settings.item_timeout_s,
            priority=settings.priority,
            keyring=settings.keyring,
            refused_limit_s=settings.refused_limit_s,
        )

    def grade(
        self,
        rollouts: Sequence[RolloutLike],
        *,
        on_progress: ProgressFn | None = None,
        deadline_s: float | None = None,
        options: GradeOptions | None = None,
    ) -> list[Verdict]:
        job = self._client.submit(rollouts, deadline_s=deadline_s, options=options)
        verdicts: list[Verdict | None] = [None] * len(rollouts)
        try:
            for arrived in job.arrivals():
                for index, verdict in arrived:
                    verdicts[index] = verdict
                if on_progress is not None:
                    on_progress(len(arrived))
        except JobCutShortError as exc:  # deadline, or a broker refusing writes
            exc.partial = verdicts  # the caller may keep what did arrive
            raise
        # arrivals() ends only once every index has a verdict (else it raises).
        return [v for v in verdicts if v is not None]

    def run_line_units(
        self,
        units: Sequence[Any],
        weights: Sequence[int],
        *,
        on_progress: ProgressFn | None = None,
        deadline_s: float | None = None,
    ) -> list[Any]:
        """Line mode on the fleet (`workers.fleet.line_batch`): each unit one task, its
        lines read, graded and rendered by a worker. None where a unit has no
        result (a worker found it unfit: grade its rows with `grade`).

        Raises:
            JobCutShortError: the deadline passed or the broker refused writes;
                `partial` holds the results that arrived (None for the others).
        """
        from workers.lines.units import fleet_unit_payload, fleet_unit_result

        job = self._client.submit_units(
            [fleet_unit_payload(unit, body) for unit, body in units],
            weights,
            deadline_s=deadline_s,
        )
        results: list[Any] = [None] * len(units)
        try:
            for arrived in job.arrivals():
                for index, lines in arrived:
                    results[index] = fleet_unit_result(lines)
                    if on_progress is not None:
                        on_progress(weights[index])
        except JobCutShortError as exc:
            exc.partial = results
            raise
        return results

    def close(self) -> None:
        self._client.close()


def line_runner(grader: Grader) -> Callable[..., list[Any]] | None:
    """Line mode (`workers.lines.units`) of the embedded pool or of a fleet
    (`run_line_units`); None for any other grader, which grades rows only."""
    if isinstance(grader, _EmbeddedGrader | _FleetGrader):
        return grader.run_line_units
    return None


def _open_embedded(
    url: str | None, options: GradeOptions, settings: ProducerSettings
) -> Grader:
    return _EmbeddedGrader(options, settings)


def _open_fleet(
    url: str | None, options: GradeOptions, settings: ProducerSettings
) -> Grader:
    assert url is not None
    return _FleetGrader(url, options, settings)
