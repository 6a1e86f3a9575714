"""The result of one comparison (shared by the comparison modules)."""

from __future__ import annotations

from dataclasses import dataclass

from workers.models import VerifyMethod

__all__ = ["Outcome"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """Result of one comparison: True, False, or None (undecidable), and how."""

    same: bool | None
    method: VerifyMethod
    reason: str = ""
