"""Which grader grades a rollout's kind: a registry kind -> grader, where "math" is the
math verifier (`workers.verifier`).

A rollout's kind travels in its gold: `kind_of(gold)` is "code" for a code row's
encoded tests (`workers.code.item`), else `DEFAULT_KIND`. The engine asks this
registry for a kind's grade function and version instead of naming the verifier: the
sandbox's warm-up and its test of an injected grade function, the batch grader's
cache keys, the exact-response layer of the embedded pool and of the CLI, and the
verdict of an item that could not be prepared. The code grader (`workers/code/`,
beside the verifier) registers here as "code" with its own version, which keeps its
cache entries apart from the verifier's; the batch grader sends code items to it.

The per-item path of the math kind (the sandbox child's prepare then decide, inline
grading in a pool process, a failure verdict that keeps the extraction) calls the
verifier's two steps directly: they are the math kind's own split, not every kind's.

Whether this machine can run the code kind's grader at all (root, bubblewrap, and
a program of ours graded in a fresh sandbox) is `code_sandbox_check`: a worker asks
it at start to choose the queues it consumes (`workers.__main__`), the HTTP service
for its `/readyz` (`producer.serve.code_probe`).

Adding a kind: build a `KindGrader` (its name, its version, its whole-item grade
function: text in, `Verdict` out, never an exception for a wrong answer) in the
grader's own package and `register` it here, below the sandbox and the caches.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from workers import verifier
from workers.code.item import grade_code_item, is_code_gold
from workers.code.version import CODE_GRADER_VERSION
from workers.errors import ConfigError, InvalidRequestError
from workers.models import Verdict

__all__ = [
    "CODE_KIND",
    "DEFAULT_KIND",
    "KindGrader",
    "code_sandbox_check",
    "grader_for",
    "kind_of",
    "kinds",
    "register",
]

DEFAULT_KIND = "math"
CODE_KIND = "code"


@dataclass(frozen=True, slots=True)
class KindGrader:
    """One kind's grader.

    Attributes:
        kind: the rollout kind it grades ("math").
        version: the grader's version, in every cache key of its verdicts.
        grade: `(response, gold, *, options=None) -> Verdict` for one whole item.
    """

    kind: str
    version: str
    grade: Callable[..., Verdict]


_GRADERS: dict[str, KindGrader] = {}


def register(grader: KindGrader) -> KindGrader:
    """Add a kind's grader; a kind is registered once (a second is a config error)."""
    if grader.kind in _GRADERS:
        raise ConfigError(f"a grader for kind {grader.kind!r} is registered already")
    _GRADERS[grader.kind] = grader
    return grader


def grader_for(kind: str = DEFAULT_KIND) -> KindGrader:
    """The grader of `kind`; an unknown kind is a bad request, not a crash."""
    try:
        return _GRADERS[kind]
    except KeyError:
        known = ", ".join(sorted(_GRADERS))
        raise InvalidRequestError(
            f"no grader for kind {kind!r} (known: {known})"
        ) from None


def kind_of(gold: str) -> str:
    """The kind of a rollout, from its gold: a code row's gold is its encoded tests
    (`workers.code.item.encode_code_gold`), every other gold is math."""
    return CODE_KIND if is_code_gold(gold) else DEFAULT_KIND


def kinds() -> list[str]:
    """The registered kinds, sorted."""
    return sorted(_GRADERS)


_PROBE_PROGRAM = "```python\nprint(int(input()) + 1)\n```"
_PROBE_TESTS = {"tests": {"inputs": ["41\n"], "outputs": ["42\n"]}}


def code_sandbox_check(*, uid_base: int | None = None) -> tuple[bool, str]:
    """(can run, why): whether code rollouts can be graded on this machine: root,
    bwrap, and one program of ours (never a model's) graded against one stdin test
    in a fresh sandbox, closed at once (some 0.2 s).

    Args:
        uid_base: the sandbox's first slot uid, where it is not the default
            (`GRADEFLEET_CODE_UID_BASE`): the probe must run as the grader will.
    """
    if os.geteuid() != 0:
        return False, "code sandbox unavailable: not root (namespaces and uids)"
    if shutil.which("bwrap") is None:
        return False, "code sandbox unavailable: bubblewrap (bwrap) is not installed"
    # Imported here: a math-only process never loads the sandbox.
    from workers.code.grade import grade_code
    from workers.code.sandbox import CodeSandbox

    started = time.perf_counter()
    box = CodeSandbox() if uid_base is None else CodeSandbox(uid_base=uid_base)
    try:
        verdict = grade_code(_PROBE_PROGRAM, _PROBE_TESTS, sandbox=box)
    finally:
        box.close()
    if not verdict.correct:
        return False, f"code sandbox probe {verdict.status.value}: {verdict.reason}"
    took_ms = (time.perf_counter() - started) * 1000
    return True, f"code sandbox ran a probe program ({took_ms:.0f} ms)"


register(KindGrader(kind="math", version=verifier.GRADER_VERSION, grade=verifier.grade))
register(KindGrader(kind=CODE_KIND, version=CODE_GRADER_VERSION, grade=grade_code_item))
