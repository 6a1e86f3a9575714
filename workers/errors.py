"""Errors raised by the worker side (a wrong answer is a Verdict, never an exception).

GraderError
├── InvalidRequestError (ValueError)  a batch or item off the wire schema
├── ConfigError (ValueError)          worker settings that cannot be used
├── SandboxError                      the grading child cannot be run
├── CacheError                        the result cache cannot be reached
├── DeadlineError (TimeoutError)      a grading call's deadline passed
└── MetricsSetupError                 the metrics directory or server failed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.models import Verdict


class GraderError(Exception):
    """Base class of every error raised by the `workers` package."""


class InvalidRequestError(GraderError, ValueError):
    """A batch or item does not match the wire schema."""


class ConfigError(GraderError, ValueError):
    """A worker setting (flag or GRADEFLEET_* variable) has an unusable value."""


class SandboxError(GraderError):
    """The sandbox child could not be started or talked to."""


class CacheError(GraderError):
    """The result cache could not be reached or returned malformed data."""


class DeadlineError(GraderError, TimeoutError):
    """A grading call's deadline passed before every item had a verdict."""

    def __init__(
        self, message: str, *, partial: list[Verdict | None] | None = None
    ) -> None:
        super().__init__(message)
        # The verdicts that were ready, by item index (None: not graded in time).
        self.partial = partial


class MetricsSetupError(GraderError):
    """The multiprocess metrics directory or the metrics server could not be set up."""
