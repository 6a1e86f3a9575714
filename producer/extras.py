"""The optional extras: which feature needs which, and the one check that a feature's
packages are installed (`require`), failing with the exact `pip install` line.

The core install (grading, the fleet, the embedded pool, the client, `grade`,
`worker`, `status`, text and JSON reports) needs none of these; each entry point of a
feature below calls `require` before it imports its packages:

    serve    `gradefleet serve`; http(s):// grader URLs (CLI, library, adapters)
    parquet  Parquet input and output
    html     `gradefleet report --html`
    inspect  reading Inspect `.eval` logs; the Inspect scorer
    report   `report`, `grade --report` (NumPy: in the core install, but not in the
             worker image, which grades and serves and leaves reports to the caller)

Adding an extra: its packages in pyproject.toml's `[project.optional-dependencies]`
(and in `all`), its name here, `require` at each entry of the feature.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from producer.errors import MissingExtraError

__all__ = ["EXTRAS", "install_line", "require"]

# Extra -> what it makes possible (for the message).
EXTRAS = {
    "serve": "`gradefleet serve` and http(s):// grader URLs",
    "parquet": "Parquet input and output",
    "html": "`report --html`",
    "inspect": "reading Inspect .eval logs",
    "report": "`gradefleet report` and `grade --report`",
}


def install_line(extra: str) -> str:
    """The command that installs `extra` (quoted: brackets are shell globs)."""
    return f"pip install 'gradefleet[{extra}]'"


def require(extra: str, *modules: str) -> list[ModuleType]:
    """`modules` imported, in order; if one is not installed, MissingExtraError
    (exit 2) naming `extra`'s pip line. Only a missing module counts (also one
    the package itself needs): any other import failure is raised as it is."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r} (known: {', '.join(EXTRAS)})")
    loaded = []
    for module in modules:
        try:
            loaded.append(importlib.import_module(module))
        except ModuleNotFoundError as exc:
            raise MissingExtraError(
                f"the `{extra}` extra (for {EXTRAS[extra]}) is not installed (no "
                f"module {exc.name or module!r}): {install_line(extra)}"
            ) from exc
    return loaded
