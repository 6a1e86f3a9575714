"""Grade one batch: prepare, de-duplicate, cache lookup, sandbox for misses, store.

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
from workers.models import (
    TRANSIENT_STATUSES,
    ExtractionMethod,
    GradeOptions,
    Status,
    Verdict,
)
from workers.sandbox import Sandbox

__all__ = ["BatchGrader", "BatchObserver", "GradeItem", "NullObserver"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GradeItem:
    """One rollout to grade; `index` is the caller's position, echoed back."""

    index: int
    response: str
    gold: str


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


@dataclass(slots=True)
class _Group:
    """Items sharing one cache key (or a lone uncacheable item): graded once."""

    key: str | None
    positions: list[int]
    verdict: Verdict | None = None
    cached: bool = False
    duration_s: float = 0.0


class BatchGrader:
    """Grades batches through a sandbox, with an optional result cache.

    Items with equal cache keys are graded once per batch (in-batch de-duplication);
    their copies share the representative's answer-dependent fields but keep their
    own extracted / extraction_method / format_valid. `cached=True` only on verdicts
    read from the cache: a copy of an item graded in this same batch says
    `cached=False`, so the flag means "no grading work happened for this answer in
    this run". Everything else is identical with the cache on, off, warm or cold.

    `item_graded` reports the sandbox time for graded items and 0.0 for items that
    needed no grading (cache hits, in-batch copies). `cache_lookup` counts distinct
    keys. A `CacheError` is logged and the batch goes on without the cache.
    """

    def __init__(
        self,
        *,
        sandbox: Sandbox,
        cache: CacheBackend | None,
        observer: BatchObserver | None = None,
    ) -> None:
        self._sandbox = sandbox
        self._cache = cache
        self._observer: BatchObserver = observer or NullObserver()

    def grade(
        self, items: Sequence[GradeItem], options: GradeOptions
    ) -> list[tuple[int, Verdict]]:
        """Grade `items`; returns (item.index, verdict) in the order of `items`."""
        prepared = [
            verifier.prepare(it.response, it.gold, options=options) for it in items
        ]
        groups = _group(prepared, options)
        cache = self._lookup(groups)
        fresh = [group for group in groups if group.verdict is None]
        # Streamed: one frame per chunk to the child (`sizing.SANDBOX_FRAME_ITEMS`).
        pairs = [
            (items[g.positions[0]].response, items[g.positions[0]].gold) for g in fresh
        ]
        graded = self._sandbox.grade_many_timed(pairs, options)
        for group, (verdict, duration_s) in zip(fresh, graded, strict=True):
            group.verdict, group.duration_s = verdict, duration_s
        self._store(cache, fresh)
        return self._assemble(items, prepared, groups)

    def _lookup(self, groups: list[_Group]) -> CacheBackend | None:
        """Fill the groups found in the cache; returns the cache to store into
        (None after a failure: the rest of this batch goes without cache)."""
        keys = [group.key for group in groups if group.key is not None]
        if self._cache is None or not keys:
            return self._cache
        try:
            found = self._cache.get_many(keys)
        except CacheError as exc:
            log.warning("result cache lookup failed, grading without cache: %s", exc)
            return None
        for group in groups:
            entry = None if group.key is None else found.get(group.key)
            if entry is not None:
                group.verdict = _entry_verdict(entry)
                group.cached = True
        self._observer.cache_lookup(hits=len(found), misses=len(keys) - len(found))
        return self._cache

    def _store(self, cache: CacheBackend | None, fresh: list[_Group]) -> None:
        entries = {
            group.key: cache_entry(group.verdict)
            for group in fresh
            if group.key is not None
            and group.verdict is not None
            and group.verdict.status not in TRANSIENT_STATUSES
        }
        if cache is None or not entries:
            return
        try:
            cache.set_many(entries)
        except CacheError as exc:
            log.warning("result cache store failed, results not cached: %s", exc)

    def _assemble(
        self,
        items: Sequence[GradeItem],
        prepared: Sequence[verifier.Prepared],
        groups: list[_Group],
    ) -> list[tuple[int, Verdict]]:
        by_position: dict[int, Verdict] = {}
        for group in groups:
            assert group.verdict is not None
            for n, position in enumerate(group.positions):
                verdict = _with_own_fields(
                    group.verdict, prepared[position], group.cached
                )
                by_position[position] = verdict
                graded_here = n == 0 and not group.cached
                self._observer.item_graded(
                    verdict, group.duration_s if graded_here else 0.0
                )
        verdicts = [by_position[position] for position in range(len(items))]
        return [(item.index, v) for item, v in zip(items, verdicts, strict=True)]


def _with_own_fields(verdict: Verdict, own: verifier.Prepared, cached: bool) -> Verdict:
    """`verdict` with this response's own per-response fields (and `cached`).

    Same as `verdict.replace(...)`, spelled out: `dataclasses.replace` costs several
    times a direct construction, once per item of every batch (cache hits included).
    """
    return Verdict(
        correct=verdict.correct,
        status=verdict.status,
        format_valid=own.format_valid,
        extracted=own.extracted,
        extraction_method=own.extraction_method,
        canonical_pred=verdict.canonical_pred,
        canonical_gold=verdict.canonical_gold,
        verify_method=verdict.verify_method,
        reason=verdict.reason,
        grader_version=verdict.grader_version,
        cached=cached,
    )


def _group(
    prepared: Sequence[verifier.Prepared], options: GradeOptions
) -> list[_Group]:
    """One group per distinct cache key, one per uncacheable item (first-seen order)."""
    key_of = cache_keyer(verifier.GRADER_VERSION, options)  # options encoded once
    groups: list[_Group] = []
    by_key: dict[str, _Group] = {}
    for position, prep in enumerate(prepared):
        if prep.decision_key is None:
            groups.append(_Group(key=None, positions=[position]))
            continue
        key = key_of(prep.decision_key)
        group = by_key.get(key)
        if group is None:
            group = by_key[key] = _Group(key=key, positions=[])
            groups.append(group)
        group.positions.append(position)
    return groups


def _entry_verdict(entry: dict[str, Any]) -> Verdict:
    """A verdict from a cache entry; per-response fields are filled in later."""
    blank = Verdict(
        correct=False,
        status=Status.ERROR,
        format_valid=False,
        extracted=None,
        extraction_method=ExtractionMethod.NONE,
    )
    return verdict_from_entry(entry, blank)
