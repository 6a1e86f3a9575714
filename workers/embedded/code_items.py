"""The code items of a batch: graded in this process by the code kind's grader, with
the result cache (issue 39, section 6).

A code item's gold is its row's encoded tests (`workers.code.item`); the batch grader
(`workers.embedded.batch`) hands this module the code items of a batch and merges
their verdicts back in input order. The model's program never runs here: the code
grader runs it in its sandbox (`workers.code.sandbox`) and bounds it with its own
wall budget (`CodeLimits.wall_s`), so this process needs no killable child for it.

Cache key: sha256 (`cache_keyer`, the code grader's version and the options) over
the worker's code limits, the whole response text and the code gold (tests, prompt,
entry point, the row's limits). Equal keys in a batch are graded once (copies say
`cached=False`). Only final verdicts are stored (`models.is_final`): no `error`,
`timeout` or `memory_limit` status and no verdict whose first failure is a timeout
or memory (they depend on the machine's load).

A grader bug (an exception) is the item's `error` verdict, never the batch's crash.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workers.cache.results import (
    CacheBackend,
    cache_entry,
    cache_keyer,
    code_verdict_from_entry,
)
from workers.code.item import code_row_limits
from workers.errors import CacheError
from workers.kinds import CODE_KIND, grader_for
from workers.models import GradeOptions, Status, Verdict, is_final, ungraded_verdict

__all__ = ["CodeItemGrader", "CodeStepMarker"]

log = logging.getLogger(__name__)


class CodeStepMarker(Protocol):
    """Marks, for a watching parent, that item `position` of the batch is being graded
    as code (the embedded pool's `InlineGrader`: its deadline for that step is the code
    grader's wall budget, not the math item deadline)."""

    def begin_code(self, position: int) -> None: ...


class _Observer(Protocol):
    def item_graded(self, verdict: Verdict, duration_s: float) -> None: ...

    def cache_lookup(self, *, hits: int, misses: int) -> None: ...


@dataclass(slots=True)
class CodeItemGrader:
    """Grades code items with the cache of the batch grader that owns it.

    `held`: the batch grader's held entries (`hold_stores`), looked up first and
    added to instead of storing.
    """

    cache: CacheBackend | None
    observer: _Observer
    held: dict[str, dict[str, Any]] | None = None
    marker: CodeStepMarker | None = None
    version: str = ""  # the code grader's version in the keys ("": the registry's)

    def grade(
        self, items: Sequence[tuple[int, str, str]], options: GradeOptions
    ) -> list[Verdict]:
        """Verdicts of (position, response, gold) code items, in their order
        (`position`: the item's place in the batch, for the `marker`)."""
        keys = self._keys(items, options)
        found = self._lookup(list(dict.fromkeys(k for k in keys if k)))
        verdicts: list[Verdict] = []
        decided: dict[str, Verdict] = {}
        entries: dict[str, dict[str, Any]] = {}
        for (position, response, gold), key in zip(items, keys, strict=True):
            verdict = found.get(key) if key else None
            if verdict is None and key and key in decided:
                verdict = decided[key].replace(cached=False)
            if verdict is not None:
                self.observer.item_graded(verdict, 0.0)
                verdicts.append(verdict)
                continue
            verdict, seconds = self._grade_one(position, response, gold, options)
            self.observer.item_graded(verdict, seconds)
            verdicts.append(verdict)
            if key and is_final(verdict):
                decided[key] = verdict
                entries[key] = cache_entry(verdict)
        self._store(entries)
        return verdicts

    def _keys(
        self, items: Sequence[tuple[int, str, str]], options: GradeOptions
    ) -> list[str]:
        """Each item's cache key ("" without a cache: every item graded)."""
        if self.cache is None:
            return [""] * len(items)
        key_of = cache_keyer(self.version or grader_for(CODE_KIND).version, options)
        limits = json.dumps(repr(code_row_limits()))
        return [
            key_of(f"{limits}\x00{len(response)}\x00{response}{gold}")
            for _position, response, gold in items
        ]

    def _lookup(self, keys: list[str]) -> dict[str, Verdict]:
        if self.cache is None or not keys:
            return {}
        entries: dict[str, dict[str, Any]] = {}
        if self.held:
            entries = {k: self.held[k] for k in keys if k in self.held}
        try:
            missing = [k for k in keys if k not in entries]
            if missing:
                entries.update(self.cache.get_many(missing))
        except CacheError as exc:
            log.warning("code result cache lookup failed: %s", exc)
            return {}
        found = _verdicts(entries)
        self.observer.cache_lookup(hits=len(found), misses=len(keys) - len(found))
        return found

    def _store(self, entries: dict[str, dict[str, Any]]) -> None:
        if self.cache is None or not entries:
            return
        if self.held is not None:
            self.held.update(entries)
            return
        try:
            self.cache.set_many(entries)
        except CacheError as exc:
            log.warning("code result cache store failed: %s", exc)

    def _grade_one(
        self, position: int, response: str, gold: str, options: GradeOptions
    ) -> tuple[Verdict, float]:
        if self.marker is not None:
            self.marker.begin_code(position)
        grade: Callable[..., Verdict] = grader_for(CODE_KIND).grade
        started = time.perf_counter()
        try:
            verdict = grade(response, gold, options=options)
        except Exception as exc:  # a grader bug: this item's verdict, not a crash
            log.exception("code grader raised")
            verdict = ungraded_verdict(
                Status.ERROR,
                f"code grader raised {type(exc).__name__}",
                grader_for(CODE_KIND).version,
            ).replace(kind=CODE_KIND)
        return verdict, time.perf_counter() - started


def _verdicts(entries: Mapping[str, dict[str, Any]]) -> dict[str, Verdict]:
    """The code verdicts of cache entries (a math entry under a code key: a miss)."""
    found: dict[str, Verdict] = {}
    for key, entry in entries.items():
        verdict = code_verdict_from_entry(entry, True)
        if verdict is not None and is_final(verdict):
            found[key] = verdict
    return found
