"""The worker's metrics of rollouts by kind and of the code sandbox: rollouts graded
per kind, code tests passed and failed, code rollouts by their first failure
(timeouts, memory kills, output-limit hits), sandbox errors by reason, and the
sandbox's zygote starts with their latency (issue 40, section 5).

Everything but the starts is read from the verdicts a task stores (`code_tally`):
the code grader reports its outcome in the verdict (`kind`, `tests_passed`,
`tests_total`, `failure`, an `error` status with its reason), so no count depends on
which process graded the item, and a unit of lines carries its tally in its
`GradedSummary`. Starts are told by the sandbox itself
(`workers.code.sandbox.SandboxObserver`) in the process that starts it; a process
forked from the one that built the metrics (the line pool's grading process, whose
fork hygiene closed the metrics' files) keeps them for its unit's summary
(`take_foreign_starts`), and the task counts them with the unit.

Every label is a bounded set, pre-set to 0: an unknown failure kind or error reason
is counted as "other", never as a new series.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram

from workers.models import Status, Verdict

__all__ = [
    "CODE_FAILURES",
    "KINDS",
    "SANDBOX_ERRORS",
    "SANDBOX_ROLES",
    "SANDBOX_START_BUCKETS_S",
    "TEST_RESULTS",
    "CodeMetrics",
    "CodeTally",
    "code_tally",
    "sandbox_error_reason",
    "take_foreign_starts",
]

KINDS = ("math", "code")
TEST_RESULTS = ("passed", "failed")
# A code rollout's first failing test (`workers.code.grade`), or its whole-item
# `timeout` / `memory_limit` verdict from the engine's deadline.
CODE_FAILURES = (
    "wrong_answer",
    "runtime_error",
    "timeout",
    "memory",
    "output_limit",
    "other",
)
# Why a code rollout is `error`: the sandbox cannot run here (no_privileges,
# no_bwrap, no_slot), a zygote did not start, the sandbox failed mid-run, the grader
# raised, or anything else (a poison batch, a failed item of the pool).
SANDBOX_ERRORS = (
    "no_privileges",
    "no_bwrap",
    "no_slot",
    "start_failed",
    "run_failed",
    "grader_raised",
    "other",
)
SANDBOX_ROLES = ("model", "harness")
# A zygote is bwrap + an interpreter importing our package: ~30-80 ms on an idle
# machine, seconds on an overloaded one (its own start timeout is 20 s).
SANDBOX_START_BUCKETS_S = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 20.0),
)

# What a batch of verdicts adds to the counters: "kind:<kind>", "tests:<result>",
# "failure:<kind>", "error:<reason>" -> count (JSON, in a `GradedSummary`).
CodeTally = dict[str, int]

# Starts in a process forked from the metrics' own, not yet in a summary (bounded:
# a unit's process starts two zygotes, again only after one died).
_FOREIGN_STARTS: list[tuple[str, float]] = []
_FOREIGN_STARTS_MAX = 1_000


def take_foreign_starts() -> list[tuple[str, float]]:
    """The (role, seconds) of starts kept in this process since the last call."""
    taken = list(_FOREIGN_STARTS)
    _FOREIGN_STARTS.clear()
    return taken


_WHOLE_ITEM_FAILURES = {Status.TIMEOUT: "timeout", Status.MEMORY_LIMIT: "memory"}
# (a substring of the verdict's reason, the label): first match wins.
_ERROR_REASONS = (
    ("needs root", "no_privileges"),
    ("capabilit", "no_privileges"),
    ("bwrap) is not installed", "no_bwrap"),
    ("slots are in use", "no_slot"),
    ("did not start", "start_failed"),
    ("sandbox error:", "run_failed"),
    ("code grader raised", "grader_raised"),
)


def sandbox_error_reason(reason: str) -> str:
    """The `SANDBOX_ERRORS` label of a code `error` verdict's reason."""
    for needle, label in _ERROR_REASONS:
        if needle in reason:
            return label
    return "other"


def _code_failure(verdict: Verdict) -> str | None:
    if verdict.status in _WHOLE_ITEM_FAILURES:
        return _WHOLE_ITEM_FAILURES[verdict.status]
    if verdict.status is not Status.WRONG or not verdict.failure:
        return None
    kind = verdict.failure.get("kind")
    return kind if kind in CODE_FAILURES else "other"


def code_tally(verdicts: Iterable[Verdict]) -> CodeTally:
    """The kind and code counts of `verdicts` (see `CodeTally`)."""
    tally: collections.Counter[str] = collections.Counter()
    other = 0  # math (and any kind not in KINDS): the common case, kept cheap
    for verdict in verdicts:
        if verdict.kind != "code":
            other += 1
            continue
        tally["kind:code"] += 1
        if verdict.tests_total:
            passed = verdict.tests_passed or 0
            tally["tests:passed"] += passed
            tally["tests:failed"] += verdict.tests_total - passed
        failure = _code_failure(verdict)
        if failure is not None:
            tally[f"failure:{failure}"] += 1
        if verdict.status is Status.ERROR:
            tally[f"error:{sandbox_error_reason(verdict.reason or '')}"] += 1
    if other:
        tally["kind:math"] += other
    return dict(tally)


class CodeMetrics:
    """The metrics of this module on `registry`; a `SandboxObserver`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._pid = os.getpid()
        families = {
            "kind": Counter(
                "gradefleet_kind_rollouts_graded",
                "Rollouts graded, by kind (math, code).",
                ["kind"],
                registry=registry,
            ).labels,
            "tests": Counter(
                "gradefleet_code_tests",
                "Unit tests of graded code rollouts, by result (a test not run after "
                "a timeout counts as failed).",
                ["result"],
                registry=registry,
            ).labels,
            "failure": Counter(
                "gradefleet_code_failures",
                "Code rollouts that failed, by their first failing test's kind "
                "(timeout, memory, output_limit, ...).",
                ["failure"],
                registry=registry,
            ).labels,
            "error": Counter(
                "gradefleet_code_sandbox_errors",
                "Code rollouts answered `error`, by reason (no_privileges, no_bwrap, "
                "no_slot: the sandbox cannot run on this node).",
                ["reason"],
                registry=registry,
            ).labels,
        }
        labels = {
            "kind": KINDS,
            "tests": TEST_RESULTS,
            "failure": CODE_FAILURES,
            "error": SANDBOX_ERRORS,
        }
        self._counters: dict[str, Counter] = {
            f"{family}:{value}": families[family](value)
            for family, values in labels.items()
            for value in values
        }
        starts = Counter(
            "gradefleet_code_sandbox_starts",
            "Code sandbox zygotes started (bwrap + a warm interpreter), by role.",
            ["role"],
            registry=registry,
        )
        start_seconds = Histogram(
            "gradefleet_code_sandbox_start_duration_seconds",
            "Wall time to start one code sandbox zygote, by role.",
            ["role"],
            buckets=SANDBOX_START_BUCKETS_S,
            registry=registry,
        )
        self._starts = {role: starts.labels(role) for role in SANDBOX_ROLES}
        self._start_seconds = {
            role: start_seconds.labels(role) for role in SANDBOX_ROLES
        }

    def count(self, tally: Mapping[str, int]) -> None:
        """Add a `code_tally` (keys outside the label sets are dropped)."""
        for key, count in tally.items():
            counter = self._counters.get(key)
            if counter is not None and count:
                counter.inc(count)

    def sandbox_started(self, role: str, seconds: float) -> None:
        """One zygote started in `seconds` (an unknown role counts as the model's);
        kept for the unit's summary in a forked process (see the module docstring)."""
        key = role if role in self._starts else "model"
        if os.getpid() != self._pid:
            if len(_FOREIGN_STARTS) < _FOREIGN_STARTS_MAX:
                _FOREIGN_STARTS.append((key, seconds))
            return
        self._starts[key].inc()
        self._start_seconds[key].observe(max(seconds, 0.0))
