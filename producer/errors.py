"""Errors raised by the producer side; each carries the CLI exit code it maps to.

    ProducerError                          exit 1  anything else the producer refuses
    ├── MissingExtraError                  exit 2  a feature needs an optional extra
    │                                              (`producer.extras`) not installed
    ├── InvalidRolloutError (ValueError)   exit 4  a rollout without response/gold text
    │   ├── MalformedInputError            exit 3  some input lines were malformed (the
    │   │                                          others were graded and written)
    │   └── InputFormatError               exit 4  a file cannot be read (or written) in
    │                                              the format it has (Parquet, .eval)
    ├── BrokerUnavailableError             exit 5  the broker (Redis) cannot be reached
    └── JobCutShortError                           a job ended without every result
        ├── DeadlinePassedError            exit 6  results did not all arrive in time
        │   (TimeoutError)
        └── BrokerRefusedError             exit 8  the broker answers but refuses writes
                                                   (out of memory, read-only replica)

Exit code 2 is also click's own "usage error" (bad option, missing file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from workers.models import Verdict


class ProducerError(Exception):
    """Base class of every error raised by the `producer` package."""

    exit_code: ClassVar[int] = 1


class InvalidRolloutError(ProducerError, ValueError):
    """A rollout has no usable `response` / `gold` string."""

    exit_code: ClassVar[int] = 4


class MalformedInputError(InvalidRolloutError):
    """Some input lines could not be read; every other line was graded."""

    exit_code: ClassVar[int] = 3


class BrokerUnavailableError(ProducerError):
    """The broker (Redis) could not be reached."""

    exit_code: ClassVar[int] = 5


class JobCutShortError(ProducerError):
    """A job ended before every result arrived; `partial` holds what did."""

    def __init__(self, message: str, *, partial: list[Verdict | None] | None = None):
        super().__init__(message)
        # What did arrive, by input index (None: missing), when the grader knows.
        self.partial = partial


class DeadlinePassedError(JobCutShortError, TimeoutError):
    """The job's deadline passed before every result arrived."""

    exit_code: ClassVar[int] = 6


class BrokerRefusedError(JobCutShortError):
    """The broker answers but refuses writes (`maxmemory` reached under noeviction,
    a read-only replica) at a job's start, or for longer than the client waits."""

    exit_code: ClassVar[int] = 8


class InputFormatError(InvalidRolloutError):
    """A file is not readable (or writable) as the format it looks like."""

    exit_code: ClassVar[int] = 4


class MissingExtraError(ProducerError):
    """A command or feature needs an optional extra that is not installed; the message
    names the `pip install 'gradefleet[EXTRA]'` line (`producer.extras.require`)."""

    exit_code: ClassVar[int] = 2
