"""The one builder of failure verdicts (error, timeout) for items that were not graded.

Used by the sandbox (an item over its deadline or memory cap, a crashed child), the
fleet task (a poison batch, the batch backstop) and the local pool (a batch whose
worker keeps dying), so a failure reads the same wherever it happened.
"""

from __future__ import annotations

from workers import verifier
from workers.kinds import CODE_KIND, DEFAULT_KIND, grader_for, kind_of
from workers.models import GradeOptions, Status, Verdict, ungraded_verdict

__all__ = [
    "MEMORY_ERROR_REASON",
    "code_failure_verdict",
    "culprit_verdict",
    "deadline_reason",
    "failure_verdict",
    "grader_raised_reason",
    "memory_cap_reason",
    "poison_reason",
    "poison_verdict",
    "unprepared_failure_verdict",
]


# How a failure reads, wherever the item failed (a fleet's sandbox child, an embedded
# pool's worker): worded once, so both backends give the same verdict.
MEMORY_ERROR_REASON = "grader raised MemoryError (RLIMIT_AS)"


def grader_raised_reason(exception_name: str) -> str:
    return f"grader raised {exception_name}"


def deadline_reason(item_timeout_s: float) -> str:
    return f"exceeded the {item_timeout_s:g} s item deadline"


def memory_cap_reason(item_memory_bytes: int) -> str:
    return f"exceeded the {item_memory_bytes / 2**20:g} MiB item memory cap"


def failure_verdict(
    status: Status, reason: str, response: str, gold: str, options: GradeOptions
) -> Verdict:
    """A failure verdict that still carries the (cheap, bounded) extraction; a code
    item's (its gold is encoded tests) is of kind "code", with no extraction."""
    if kind_of(gold) == CODE_KIND:
        return code_failure_verdict(status, reason)
    prepared = verifier.prepare(response, gold, options=options)
    return verifier.verdict_from(prepared, status=status, reason=reason)


def unprepared_failure_verdict(status: Status, reason: str) -> Verdict:
    """A failure verdict without the response's extraction: for an item that failed
    while it was being prepared (preparing it again could fail the same way)."""
    return ungraded_verdict(status, reason, grader_for(DEFAULT_KIND).version)


def code_failure_verdict(status: Status, reason: str) -> Verdict:
    """The failure verdict of a code item that was not graded."""
    verdict = ungraded_verdict(status, reason, grader_for(CODE_KIND).version)
    return verdict.replace(kind=CODE_KIND)


def culprit_verdict(
    status: Status,
    reason: str,
    pair: tuple[str, str],
    options: GradeOptions,
    *,
    prepared: bool,
) -> Verdict:
    """The verdict of an item that failed: with its extraction when it had been
    prepared, without when preparing it failed (preparing it again could fail the
    same way, or hang)."""
    if prepared or kind_of(pair[1]) == CODE_KIND:
        return failure_verdict(status, reason, *pair, options)
    return unprepared_failure_verdict(status, reason)


def poison_verdict(
    response: str, gold: str, options: GradeOptions, lost: int
) -> Verdict:
    """The `error` verdict of an item whose batch lost its worker `lost` times."""
    return failure_verdict(Status.ERROR, poison_reason(lost), response, gold, options)


def poison_reason(lost: int) -> str:
    return f"poison batch: its worker was lost {lost} times"
