"""gradefleet producer side: client library and the `gradefleet` CLI (no SymPy here)."""

from __future__ import annotations
