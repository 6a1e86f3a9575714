"""The errors of the code grader; a wrong program is a verdict, never one of these.

CodeGraderError (a `workers.errors.GraderError`)
├── InvalidTestsError (ValueError)   a row's tests are missing, empty or malformed
│                                    (the row's verdict is `invalid_gold`)
└── PlainDataError (ValueError)      a value that is not plain data, or bytes that are
                                     not a valid plain-data encoding (the test fails as
                                     "returned a non-plain value")

Stdlib only at import time (`workers.errors` imports nothing of ours at runtime), so the
sandbox can import the channel codec that raises `PlainDataError`.
"""

from __future__ import annotations

from workers.errors import GraderError

__all__ = ["CodeGraderError", "InvalidTestsError", "PlainDataError"]


class CodeGraderError(GraderError):
    """Base class of every error raised by `workers.code`."""


class InvalidTestsError(CodeGraderError, ValueError):
    """A row's tests cannot be used: none, malformed, or of a shape we do not read.

    The message is the reason, written for the person who owns the data set.
    """


class PlainDataError(CodeGraderError, ValueError):
    """A value outside the plain-data types, or an invalid plain-data encoding."""
