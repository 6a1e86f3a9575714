"""Grade one batch: the sandbox prepares, then decides what the cache, the process's
memo of decided answers and in-batch de-duplication leave; new answers are stored.

Shared by the Celery task and the embedded local pool, so both give identical verdicts.
A batch's code items (their gold is encoded tests, `workers.code.item`) are split
off and graded in this process by `workers.embedded.code_items`; a batch without any
costs one scan of its golds and takes the math path unchanged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from workers import verifier
from workers.cache.exact import ExactLayer
from workers.cache.results import (
    CacheBackend,
    cache_entry,
    cache_keyer,
    verdict_from_entry,
)
from workers.code.item import CODE_GOLD_PREFIX
from workers.embedded.code_items import CodeItemGrader, CodeStepMarker
from workers.errors import CacheError
from workers.kinds import DEFAULT_KIND, grader_for
from workers.models import (
    TRANSIENT_STATUSES,
    GradeOptions,
    OwnFields,
    Verdict,
    build_verdict,
)
from workers.sandbox.process import ItemPrep, ItemResult, Selector

__all__ = [
    "BatchGrader",
    "BatchObserver",
    "CodeSteps",
    "DecisionMemo",
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


class CodeSteps(CodeStepMarker, Protocol):
    """A `SelectingGrader` whose parent watches its steps (the pool's `InlineGrader`):
    told where a batch's code items are graded (`begin_code`) and which positions of
    the batch a call of `grade_selected` gets when code items were split off."""

    def narrowed(
        self, positions: Sequence[int]
    ) -> contextlib.AbstractContextManager[None]: ...


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


# A `DecisionMemo` holds at most this many decided answers, or keys and extracted
# texts of this many characters in all, and starts over once full: some 10-20 MB of
# a pool worker's heap at most (each holds a verdict), a small share of what makes
# the pool replace a worker (`RECYCLE_GROWN_SHARE` of the item memory cap).
MEMO_MAX_ENTRIES = 20_000
MEMO_MAX_CHARS = 4_000_000


class DecisionMemo:
    """Answers this process has decided, by options and key: a later batch's copy of
    one is not decided again (copies within a batch never are).

    Samples of one prompt mostly reach the same few answers (in tests/data, 54% of
    the rollouts repeat an earlier one's decision key), while an embedded pool
    worker's batches are 64 rows, in which few of a prompt's samples meet. Deciding
    costs some 9 us a rollout on average (SymPy's cases far more), a hit here one
    dict lookup and a verdict built. Final verdicts only: a timeout or memory kill
    is the load's, and a worker lost to one takes its memo with it anyway. Its hits
    say `cached=False`, so it goes with no answer cache, whose hits say True
    (`workers.embedded.pool` gives it to the graders without one).
    """

    def __init__(
        self, *, max_entries: int = MEMO_MAX_ENTRIES, max_chars: int = MEMO_MAX_CHARS
    ) -> None:
        self._max_entries = max_entries
        self._max_chars = max_chars
        self._by_options: dict[GradeOptions, dict[str, Verdict]] = {}
        self._entries = 0  # answers, and a table per options (a service's requests
        self._chars = 0  # choose options: each new one must count against the bound)

    @property
    def entries(self) -> int:
        """Answers held, and one a table of an options."""
        return self._entries

    def answers(self, options: GradeOptions) -> dict[str, Verdict]:
        """The decided answers under `options`, by key (read-only: `remember` adds)."""
        answers = self._by_options.get(options)
        if answers is None:
            self._make_room(0)
            answers = self._by_options[options] = {}
            self._entries += 1
        return answers

    def remember(self, options: GradeOptions, key: str, verdict: Verdict) -> None:
        chars = len(key) + len(verdict.extracted or "")
        self._make_room(chars)
        answers = self.answers(options)
        if key not in answers:
            self._entries += 1
            self._chars += chars
        answers[key] = verdict

    def _make_room(self, chars: int) -> None:
        """Start over when full: a batch still holding a table it was given finds
        nothing more in it (it is no longer filled), as in an empty memo."""
        if self._entries >= self._max_entries or self._chars + chars > self._max_chars:
            self._by_options = {}
            self._entries = self._chars = 0


class BatchGrader:
    """Grades batches through a sandbox, with an optional result cache.

    The sandbox child prepares every item (extraction and parsing, once) and reports
    its decision key; items with equal cache keys are decided once per batch
    (in-batch de-duplication) and cached keys not at all. Copies share the
    representative's answer-dependent fields but keep their own extracted /
    extraction_method / format_valid. `cached=True` only on verdicts read from the
    cache: a copy of an item graded in this same batch, or in an earlier one that
    the `memo` holds, says `cached=False`, so the flag means "no grading work
    happened for this answer in this run". Everything else is identical with the
    cache on, off, warm or cold, and with or without a memo.

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
        memo: DecisionMemo | None = None,
        code_steps: CodeSteps | None = None,
        code_cache: CacheBackend | None = None,
    ) -> None:
        self._sandbox = sandbox
        self._cache = cache
        self._observer: BatchObserver = observer or NullObserver()
        self._exact = exact
        self._held: dict[str, dict[str, Any]] | None = {} if hold_stores else None
        self._memo = memo
        self._code_steps = code_steps
        # Code items use the answer cache, or `code_cache` where the math items go
        # without one (a line-mode unit's: a code rollout costs a sandbox run).
        self._code = CodeItemGrader(
            cache or code_cache, self._observer, self._held, code_steps
        )

    def grade(
        self, items: Sequence[GradeItem], options: GradeOptions
    ) -> list[tuple[int, Verdict]]:
        """Grade `items`; returns (item.index, verdict) in the order of `items`."""
        prefix = CODE_GOLD_PREFIX
        for item in items:
            if item.gold.startswith(prefix):
                return self._grade_mixed(items, options)
        return self._grade_math(items, options)

    def _grade_mixed(
        self, items: Sequence[GradeItem], options: GradeOptions
    ) -> list[tuple[int, Verdict]]:
        """Math items by the math path, code items by `CodeItemGrader`, merged."""
        is_code = [item.gold.startswith(CODE_GOLD_PREFIX) for item in items]
        verdicts: list[Verdict | None] = [None] * len(items)
        math_at = [i for i, code in enumerate(is_code) if not code]
        if math_at:
            with self._narrowed(math_at):
                graded = self._grade_math([items[i] for i in math_at], options)
            for position, (_index, verdict) in zip(math_at, graded, strict=True):
                verdicts[position] = verdict
        code_at = [i for i, code in enumerate(is_code) if code]
        code_items = [(i, items[i].response, items[i].gold) for i in code_at]
        code_verdicts = self._code.grade(code_items, options)
        for position, verdict in zip(code_at, code_verdicts, strict=True):
            verdicts[position] = verdict
        if self._exact is not None:
            pairs = [(response, gold) for _i, response, gold in code_items]
            try:
                self._exact.store(pairs, code_verdicts, options)
            except CacheError as exc:
                log.warning("exact-response cache store failed: %s", exc)
        return [
            (item.index, verdict)
            for item, verdict in zip(items, verdicts, strict=True)
            if verdict is not None
        ]

    def _narrowed(
        self, positions: Sequence[int]
    ) -> contextlib.AbstractContextManager[None]:
        if self._code_steps is None:
            return contextlib.nullcontext()
        return self._code_steps.narrowed(positions)

    def _grade_math(
        self, items: Sequence[GradeItem], options: GradeOptions
    ) -> list[tuple[int, Verdict]]:
        run = _BatchRun(
            self._cache, self._observer, items, options, self._held, self._memo
        )
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
        # Emptied in place: the code items' grader holds the same dict.
        entries = dict(self._held)
        self._held.clear()
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
        memo: DecisionMemo | None = None,
    ) -> None:
        self._cache = cache
        self._observer = observer
        self._items = items
        self._options = options
        self._held = held  # `BatchGrader.hold_stores`: entries not yet written
        self._memo = memo
        self._decided = memo.answers(options) if memo is not None else {}
        # Without a cache a key only tells duplicates apart within this batch, whose
        # options are one: the decision key itself does, unhashed.
        self._key_of = (
            cache_keyer(grader_for(DEFAULT_KIND).version, options)  # encoded once
            if cache is not None
            else _unhashed
        )
        self._digests: list[str | None] = [None] * len(items)
        self._found: dict[str, dict[str, Any]] = {}  # digest -> its cache entry
        self._recalled: dict[str, Verdict] = {}  # digest -> its decision, memo's
        self._deciding: dict[str, int] = {}  # digest -> the position deciding it

    def select(self, positions: Sequence[int], preps: Sequence[ItemPrep]) -> list[bool]:
        """Called by the sandbox per prepared chunk: which items to decide."""
        key_of, digests = self._key_of, self._digests
        found, deciding, recalled = self._found, self._deciding, self._recalled
        decided = self._decided
        new: dict[str, None] = {}
        for position, prep in zip(positions, preps, strict=True):
            if prep.decision_key is not None:
                digest = key_of(prep.decision_key)
                digests[position] = digest
                if digest in found or digest in deciding or digest in recalled:
                    continue
                if (verdict := decided.get(digest)) is not None:
                    recalled[digest] = verdict
                else:
                    new[digest] = None
        self._lookup(list(new))
        picks = []
        for position in positions:
            known = digests[position]
            if known is None:
                picks.append(True)
            elif known in found or known in deciding or known in recalled:
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
            else:  # a copy of an answer this batch decided, or the memo held
                assert result.prep is not None
                assert digest is not None
                decided = self._recalled.get(digest)
                if decided is None:
                    decided = results[self._deciding[digest]].verdict
                assert decided is not None
                verdict, seconds = _with_own_fields(decided, result.prep, False), 0.0
            item = self._items[position]  # as grade() ends: texts, not answers
            verdict = verifier.identical_never_wrong(verdict, item.response, item.gold)
            verdicts.append(verdict)
            graded.append((verdict, seconds))
        self._store(results)
        self._remember(results)
        for verdict, seconds in graded:
            self._observer.item_graded(verdict, seconds)
        return [(item.index, v) for item, v in zip(self._items, verdicts, strict=True)]

    def _final_decisions(
        self, results: Sequence[ItemResult]
    ) -> Iterator[tuple[str, Verdict]]:
        """(digest, verdict) of each answer this batch decided, timeouts and other
        transient verdicts left out: what the cache and the memo keep."""
        for digest, position in self._deciding.items():
            verdict = results[position].verdict
            if verdict is not None and verdict.status not in TRANSIENT_STATUSES:
                yield digest, verdict

    def _remember(self, results: Sequence[ItemResult]) -> None:
        if self._memo is None:
            return
        for digest, verdict in self._final_decisions(results):
            self._memo.remember(self._options, digest, verdict)

    def _store(self, results: Sequence[ItemResult]) -> None:
        if self._cache is None:  # no entries to build (a verdict's dict each)
            return
        entries = {
            digest: cache_entry(verdict)
            for digest, verdict in self._final_decisions(results)
        }
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
