"""Errors raised by the worker side (a wrong answer is a Verdict, never an exception).

    GraderError
    ├── InvalidRequestError (ValueError)  a batch or item that does not match the wire schema
    ├── SandboxError                       the grading child could not be started or talked to
    └── CacheError                         the result cache could not be reached
"""

from __future__ import annotations


class GraderError(Exception):
    """Base class of every error raised by the `workers` package."""


class InvalidRequestError(GraderError, ValueError):
    """A batch or item does not match the wire schema."""


class SandboxError(GraderError):
    """The sandbox child could not be started or talked to."""


class CacheError(GraderError):
    """The result cache could not be reached or returned malformed data."""
