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

Adding a kind: build a `KindGrader` (its name, its version, its whole-item grade
function: text in, `Verdict` out, never an exception for a wrong answer) in the
grader's own package and `register` it here, below the sandbox and the caches.
"""

from __future__ import annotations

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


register(KindGrader(kind="math", version=verifier.GRADER_VERSION, grade=verifier.grade))
register(KindGrader(kind=CODE_KIND, version=CODE_GRADER_VERSION, grade=grade_code_item))
