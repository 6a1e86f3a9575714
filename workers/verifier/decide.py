"""Turn two parsed answers into (status, verify method, reason), never raising."""

from __future__ import annotations

from workers.models import GradeOptions, Status, VerifyMethod
from workers.verifier.compare import compare
from workers.verifier.nodes import Node, Refused
from workers.verifier.outcome import Outcome
from workers.verifier.pipeline import Parsed

__all__ = ["decide_parsed"]

Decision = tuple[Status, VerifyMethod, str]
# What SymPy raises on inputs it cannot handle; anything else is our bug (status error).
_SYMPY_LIMITS = (
    TypeError,
    ValueError,
    ArithmeticError,
    AttributeError,
    NotImplementedError,
)


def decide_parsed(
    *,
    pred: Parsed | None,
    gold: Parsed | None,
    fallback: bool,
    extraction_reason: str,
    options: GradeOptions,
) -> Decision:
    """Decide one pair.

    Args:
        pred: the parsed prediction, None when nothing was extracted.
        gold: the parsed gold.
        fallback: the prediction came from a fallback (phrase or last number).
        extraction_reason: why extraction found nothing (for ``no_answer``).
        options: grading options.

    Returns:
        (status, verify method, reason).
    """
    if gold is None or gold.node is None:
        reason = gold.error if gold is not None else "no gold"
        return Status.INVALID_GOLD, VerifyMethod.NONE, f"gold unreadable: {reason}"
    if pred is None:
        return (
            Status.NO_ANSWER,
            VerifyMethod.NONE,
            extraction_reason or "no answer found",
        )
    if fallback and not options.allow_fallback:
        return Status.NO_ANSWER, VerifyMethod.NONE, "fallback answer not credited"
    if pred.node is None:
        return Status.UNSUPPORTED, VerifyMethod.NONE, f"answer refused: {pred.error}"
    keys = (pred.canonical or "", gold.canonical or "")
    out = _compare_safely(pred.node, gold.node, keys, options)
    if isinstance(out, tuple):
        return out
    if out.same is None:
        return (
            Status.UNSUPPORTED,
            out.method,
            out.reason or "could not decide equivalence",
        )
    status = Status.CORRECT if out.same else Status.WRONG
    return (
        status,
        out.method,
        out.reason or ("equivalent" if out.same else "not equivalent"),
    )


def _compare_safely(
    pred: Node, gold: Node, keys: tuple[str, str], options: GradeOptions
) -> Outcome | Decision:
    try:
        return compare(
            pred,
            gold,
            rel_tol=options.rel_tol,
            approximate=options.approximate,
            keys=keys,
        )
    except Refused as exc:
        return Status.UNSUPPORTED, VerifyMethod.NONE, f"refused: {exc}"
    except RecursionError:
        return Status.UNSUPPORTED, VerifyMethod.NONE, "refused: nesting too deep"
    except _SYMPY_LIMITS as exc:
        name = type(exc).__name__
        return Status.UNSUPPORTED, VerifyMethod.SYMBOLIC, f"undecidable: {name}"
    except Exception as exc:  # a grader bug is a verdict, never a crash
        return Status.ERROR, VerifyMethod.NONE, f"internal error: {type(exc).__name__}"
