"""Grade one batch: the sandbox prepares, then decides what the cache and in-batch
de-duplication leave; new answers are stored.

Shared by the Celery task and the embedded local pool, so both give identical verdicts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workers import verifier
from workers.cache import CacheBackend, cache_entry, cache_keyer, verdict_from_entry
from workers.errors import CacheError
from workers.exact_cache import ExactLayer
from workers.models import (
    TRANSIENT_STATUSES,
    GradeOptions,
    OwnFields,
    Verdict,
    build_verdict,
)
from workers.sandbox import ItemPrep, ItemResult, Selector

__all__ = [
    "BatchGrader",
    "BatchObserver",
    "GradeItem",
    "NullObserver",
    "SelectingGrader",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GradeItem:
    """One rollout to grade; `index` is the caller's position, echoed back."""

    index: int
    response: str
    gold: str


class SelectingGrader(Protocol):
    """Prepares items, lets the caller pick which to decide, decides those: the
    fleet's `Sandbox` (a child process) or the pool's `InlineGrader` (in process)."""

    def grade_selected(
        self, pairs: Sequence[tuple[str, str]], options: GradeOptions, select: Selector
    ) -> list[ItemResult]: ...


class BatchObserver(Protocol):
    """Receives what happened while grading (the worker's `runtime.TaskObserver`)."""

    def item_graded(self, verdict: Verdict, duration_s: float) -> None: ...

    def cache_lookup(self, *, hits: int, misses: int) -> None: ...

    def sandbox_restarted(self, reason: str) -> None: ...


class NullObserver:
    """An observer that ignores everything."""

    def item_graded(self, verdict: Verdict, duration_s: float) -> None:
        pass

    def cache_lookup(self, *, hits: int, misses: int) -> None:
        pass

    def sandbox_restarted(self, reason: str) -> None:
        pass


class BatchGrader:
    """Grades batches through a sandbox, with an optional result cache.

    The sandbox child prepares every item (extraction and parsing, once) and reports
    its decision key; items with equal cache keys are decided once per batch
    (in-batch de-duplication) and cached keys not at all. Copies share the
    representative's answer-dependent fields but keep their own extracted /
    extraction_method / format_valid. `cached=True` only on verdicts read from the
    cache: a copy of an item graded in this same batch says `cached=False`, so the
    flag means "no grading work happened for this answer in this run". Everything
    else is identical with the cache on, off, warm or cold.

    With an `exact` layer (the embedded pool), every final verdict is also stored
    whole under its (response, gold), for the CLI to find before it reaches a worker.

    `item_graded` reports the sandbox time for decided items and 0.0 for items that
    needed no decision (cache hits, in-batch copies). `cache_lookup` counts distinct
    keys. A `CacheError` is logged and the batch goes on without the cache.

    With `hold_stores` (a fleet task, which grades its batch in several `grade`
    calls), new cache entries are held, found by the next calls' lookups as if
    stored, and written by `flush_stores` in one call: one round trip per task
    instead of one per chunk.
    """

    def __init__(
        self,
        *,
        sandbox: SelectingGrader,
        cache: CacheBackend | None,
        observer: BatchObserver | None = None,
        exact: ExactLayer | None = None,
        hold_stores: bool = False,
    ) -> None:
        self._sandbox = sandbox
        self._cache = cache
        self._observer: BatchObserver = observer or NullObserver()
        self._exact = exact
        self._held: dict[str, dict[str, Any]] | None = {} if hold_stores else None

    def grade(
        self, items: Sequence[GradeItem], options: GradeOptions
    ) -> list[tuple[int, Verdict]]:
        """Grade `items`; returns (item.index, verdict) in the order of `items`."""
        run = _BatchRun(self._cache, self._observer, items, options, self._held)
        pairs = [(item.response, item.gold) for item in items]
        results = self._sandbox.grade_selected(pairs, options, run.select)
        graded = run.finish(results)
        if self._exact is not None:
            try:
                self._exact.store(pairs, [verdict for _i, verdict in graded], options)
            except CacheError as exc:
                log.warning("exact-response cache store failed: %s", exc)
        return graded

    def flush_stores(self) -> None:
        """Write the held cache entries (`hold_stores`); a failure is logged."""
        if not self._held:
            return
        entries, self._held = self._held, {}
        if self._cache is not None:
            _store_entries(self._cache, entries)


class _BatchRun:
    """One `BatchGrader.grade` call: the keys seen so far and what each maps to."""

    def __init__(
        self,
        cache: CacheBackend | None,
        observer: BatchObserver,
        items: Sequence[GradeItem],
        options: GradeOptions,
        held: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self._cache = cache
        self._observer = observer
        self._items = items
        self._held = held  # `BatchGrader.hold_stores`: entries not yet written
        # Without a cache a key only tells duplicates apart within this batch, whose
        # options are one: the decision key itself does, unhashed.
        self._key_of = (
            cache_keyer(verifier.GRADER_VERSION, options)  # options encoded once
            if cache is not None
            else _unhashed
        )
        self._digests: list[str | None] = [None] * len(items)
        self._found: dict[str, dict[str, Any]] = {}  # digest -> its cache entry
        self._deciding: dict[str, int] = {}  # digest -> the position deciding it

    def select(self, positions: Sequence[int], preps: Sequence[ItemPrep]) -> list[bool]:
        """Called by the sandbox per prepared chunk: which items to decide."""
        key_of, digests = self._key_of, self._digests
        new: dict[str, None] = {}
        for position, prep in zip(positions, preps, strict=True):
            if prep.decision_key is not None:
                digest = key_of(prep.decision_key)
                digests[position] = digest
                if digest not in self._found and digest not in self._deciding:
                    new[digest] = None
        self._lookup(list(new))
        picks = []
        for position in positions:
            known = digests[position]
            if known is None:
                picks.append(True)
            elif known in self._found or known in self._deciding:
                picks.append(False)
            else:
                self._deciding[known] = position
                picks.append(True)
        return picks

    def _lookup(self, digests: list[str]) -> None:
        """Fill `_found` from the cache (after a failure, the rest of this batch
        goes without cache)."""
        if self._cache is None or not digests:
            return
        found: dict[str, dict[str, Any]] = {}
        if self._held:
            found = {d: self._held[d] for d in digests if d in self._held}
        try:
            if len(found) < len(digests):
                found.update(
                    self._cache.get_many([d for d in digests if d not in found])
                )
        except CacheError as exc:
            log.warning("result cache lookup failed, grading without cache: %s", exc)
            self._cache = None
            return
        self._found.update(found)
        self._observer.cache_lookup(hits=len(found), misses=len(digests) - len(found))

    def finish(self, results: Sequence[ItemResult]) -> list[tuple[int, Verdict]]:
        """Every item's verdict; stores the batch's new answers in the cache."""
        verdicts: list[Verdict] = []
        graded: list[tuple[Verdict, float]] = []
        for position, result in enumerate(results):
            digest = self._digests[position]
            if result.verdict is not None:
                verdict, seconds = result.verdict, result.duration_s
            elif digest in self._found:
                assert result.prep is not None
                verdict = verdict_from_entry(self._found[digest], result.prep, True)
                seconds = 0.0
            else:
                assert result.prep is not None
                assert digest is not None
                decided = results[self._deciding[digest]].verdict
                assert decided is not None
                verdict, seconds = _with_own_fields(decided, result.prep, False), 0.0
            item = self._items[position]  # as grade() ends: texts, not answers
            verdict = verifier.identical_never_wrong(verdict, item.response, item.gold)
            verdicts.append(verdict)
            graded.append((verdict, seconds))
        self._store(results)
        for verdict, seconds in graded:
            self._observer.item_graded(verdict, seconds)
        return [(item.index, v) for item, v in zip(self._items, verdicts, strict=True)]

    def _store(self, results: Sequence[ItemResult]) -> None:
        if self._cache is None:  # no entries to build (a verdict's dict each)
            return
        entries = {}
        for digest, position in self._deciding.items():
            verdict = results[position].verdict
            if verdict is not None and verdict.status not in TRANSIENT_STATUSES:
                entries[digest] = cache_entry(verdict)
        if not entries:
            return
        if self._held is not None:
            self._held.update(entries)
            return
        _store_entries(self._cache, entries)


def _unhashed(decision_key: str) -> str:
    return decision_key


def _store_entries(cache: CacheBackend, entries: dict[str, dict[str, Any]]) -> None:
    """Write cache entries; a failure is logged (the verdicts stand without it)."""
    try:
        cache.set_many(entries)
    except CacheError as exc:
        log.warning("result cache store failed, results not cached: %s", exc)


def _with_own_fields(verdict: Verdict, own: OwnFields, cached: bool) -> Verdict:
    """`verdict` with this response's own per-response fields (and `cached`).

    Same as `verdict.replace(...)`, built in one go (`build_verdict`):
    `dataclasses.replace` costs several times that, once per in-batch copy.
    """
    return build_verdict(
        verdict.correct,
        verdict.status,
        own.format_valid,
        own.extracted,
        own.extraction_method,
        verdict.canonical_pred,
        verdict.canonical_gold,
        verdict.verify_method,
        verdict.reason,
        verdict.grader_version,
        cached,
    )
