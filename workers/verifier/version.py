"""The grader version string: our verifier revision plus the SymPy version.

SymPy's version is read from package metadata so that importing this module never
imports SymPy.
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["GRADER_VERSION", "VERIFIER_REVISION"]

# Bump whenever a change can alter any verdict (it invalidates every cached result).
VERIFIER_REVISION = "6"


def _version(package: str, default: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return default


GRADER_VERSION = (
    f"gradefleet-{_version('gradefleet', '0.1.0')}.r{VERIFIER_REVISION}"
    f"+sympy-{_version('sympy', 'unknown')}"
)
