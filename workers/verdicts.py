"""The one builder of failure verdicts (error, timeout) for items that were not graded.

Used by the sandbox (an item over its deadline or memory cap, a crashed child), the
fleet task (a poison batch, the batch backstop) and the local pool (a batch whose
worker keeps dying), so a failure reads the same wherever it happened.
"""

from __future__ import annotations

from workers import verifier
from workers.models import GradeOptions, Status, Verdict, ungraded_verdict

__all__ = [
    "failure_verdict",
    "poison_reason",
    "poison_verdict",
    "unprepared_failure_verdict",
]


def failure_verdict(
    status: Status, reason: str, response: str, gold: str, options: GradeOptions
) -> Verdict:
    """A failure verdict that still carries the (cheap, bounded) extraction."""
    prepared = verifier.prepare(response, gold, options=options)
    return verifier.verdict_from(prepared, status=status, reason=reason)


def unprepared_failure_verdict(status: Status, reason: str) -> Verdict:
    """A failure verdict without the response's extraction: for an item that failed
    while it was being prepared (preparing it again could fail the same way)."""
    return ungraded_verdict(status, reason, verifier.GRADER_VERSION)


def poison_verdict(
    response: str, gold: str, options: GradeOptions, lost: int
) -> Verdict:
    """The `error` verdict of an item whose batch lost its worker `lost` times."""
    return failure_verdict(Status.ERROR, poison_reason(lost), response, gold, options)


def poison_reason(lost: int) -> str:
    return f"poison batch: its worker was lost {lost} times"
