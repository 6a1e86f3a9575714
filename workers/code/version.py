"""The code grader's version: what a cached code verdict was graded by.

Bump `_REVISION` whenever a change can alter a verdict (the sandbox's limits or
classification, the harness, the comparison, test parsing); the interpreter's version
is part of it because a program's behaviour depends on it.
"""

from __future__ import annotations

import sys

__all__ = ["CODE_GRADER_VERSION"]

# r2: `failure["later"]` names a later test's timeout or memory failure (not cached).
_REVISION = "code-r2"
CODE_GRADER_VERSION = f"{_REVISION}+py{sys.version_info.major}.{sys.version_info.minor}"
