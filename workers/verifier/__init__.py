"""The pure math verifier: extract, canonicalize, compare, grade (stdlib + SymPy only).

SymPy is imported lazily, only for answers that exact rational arithmetic and structure
cannot decide; integers, decimals and fractions never touch it.

Pipeline: `extract` (find the answer span) -> `pipeline` (bounds, `normalize`,
`tokens`, `parse`; prose through `sentences`) -> `decide` -> `compare` (with
`relations`, `structures`, `rounding`, `values`, `symbolic`).

Answer precedence (r6), one order wherever an answer is looked for (`extract`):
0. Clean-up first: text after an end token (`<|im_end|>`, `</s>`, `<|endoftext|>`,
   `<|eot_id|>`) or a run-on turn (`User:` after `</answer>`) is cut; stray closers
   trailing the response (`</think>`, an `</answer>` with no `<answer>`, a lone `<`)
   are dropped; `<think>` reasoning is skipped when text follows its close.
1. Explicit markers, read wherever they stand on a line: the last `\\boxed{}`,
   `<answer>` tags, `####` (GSM8K's marker: never a label like `#3`), `Answer:` /
   `Final answer:` / `the answer:` lines and headings (a heading whose sentence ends
   in a colon is answered by the display math below it), then "the answer is X".
   A later marker beats an earlier box; a phrase after a tag or line restates it.
2. Sentence reading of an unmarked ending (`sentences`: one value, one value said
   twice, a true chain's final side, the value after the last `=`/copula); for a
   program-aided output, the last ```` ```output ```` block when the closing
   sentence asserts no single value.
3. The last number (never a label, never glued to a word). A text that stops
   mid-sentence (cut at the token limit) or trails off into number-free prose has
   committed to nothing: 2 and 3 give no answer there.
A marker's own span is read by the same sentence policy when it is prose.
`grade_answer` (an already-extracted answer) and golds get step 0 too, and an
extracted answer still wrapped in `\\boxed{}` is opened.

Adding an answer type (a new `Node` kind):
1. Add the kind to `nodes.NodeKind` (mypy then checks every `Node(...)` and every
   `node.kind == ...`; `test_node_kinds` checks the sets compared against `.kind`).
2. Tokens and grammar: whitelist its commands in `tokens.py`, build it in
   `parse_atoms.py` (an atom) or `parse.py` (an operator level), with its bounds.
3. Canonical form: `nodes.render` must stay injective (a distinct head or text).
4. Value and comparison: exact value in `values.exact_value` (or None), SymPy form in
   `symbolic.to_sympy` if it can reach SymPy, and its place in `compare._Comparer.node`
   (structure, relation, scalar) with its policy written in that module's docstring.
5. Tests: equivalent and non-equivalent forms (`test_compare.py`), near misses in the
   red-team table, hostile inputs (`test_hostile.py`), and bump
   `version.VERIFIER_REVISION` (verdicts change, cached results must not be reused).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction

from workers.jsontext import json_text
from workers.models import (
    ExtractionMethod,
    GradeOptions,
    Status,
    Verdict,
    VerifyMethod,
    exact_gold_text,
)
from workers.verifier.decide import decide_parsed
from workers.verifier.extract import bare_answer_text, extract_answer
from workers.verifier.pipeline import Parsed, parse_answer, parse_gold
from workers.verifier.version import GRADER_VERSION

__all__ = [
    "GRADER_VERSION",
    "Prepared",
    "decide",
    "grade",
    "grade_answer",
    "identical_never_wrong",
    "prepare",
    "verdict_from",
]

_FALLBACK_METHODS = frozenset(
    {ExtractionMethod.FINAL_ANSWER_PHRASE, ExtractionMethod.LAST_NUMBER}
)
_DEFAULT_OPTIONS = GradeOptions()


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """Extraction and canonical forms of one (response, gold) pair, before deciding.

    `decision_key` fully determines every answer-dependent verdict field (all but
    `extracted`, `extraction_method`, `format_valid`, `cached`): two pairs with equal
    keys get equal decisions. None means "do not cache". The remaining fields carry
    the parsed trees from `prepare` to `decide` within one process (never serialized).
    """

    extracted: str | None
    extraction_method: ExtractionMethod
    format_valid: bool
    canonical_pred: str | None
    canonical_gold: str | None
    decision_key: str | None
    extraction_reason: str = ""
    gold_text: str | None = None
    internal_error: str = ""
    pred_parsed: Parsed | None = field(default=None, repr=False, compare=False)
    gold_parsed: Parsed | None = field(default=None, repr=False, compare=False)


def prepare(
    response: str, gold: str, *, options: GradeOptions | None = None
) -> Prepared:
    """Extract the answer and parse both sides (pure string work, bounded, no SymPy).

    Args:
        response: the model's whole response.
        gold: the gold answer (bare, LaTeX, worked solution or ``#### 18``).
        options: grading options (defaults to `GradeOptions()`).

    Returns:
        The prepared pair; never raises for str inputs (an internal bug is recorded
        and `decide` turns it into an ``error`` verdict, never cached).
    """
    try:
        found = extract_answer(response)
        return _prepared(
            found.answer, found.method, found.format_valid, found.reason, gold
        )
    except Exception as exc:  # a grader bug becomes an `error` verdict, never a crash
        return _broken(exc)


def _broken(exc: Exception) -> Prepared:
    return Prepared(
        extracted=None,
        extraction_method=ExtractionMethod.NONE,
        format_valid=False,
        canonical_pred=None,
        canonical_gold=None,
        decision_key=None,
        internal_error=type(exc).__name__,
    )


def _prepared(
    answer: str | None,
    method: ExtractionMethod,
    format_valid: bool,
    reason: str,
    gold: str,
) -> Prepared:
    gold_text, gold_parsed = parse_gold(gold)
    pred_parsed = parse_answer(answer) if answer else None
    key = None
    if answer:
        pred_key = (
            pred_parsed.canonical if pred_parsed and pred_parsed.canonical else None
        )
        gold_key = gold_parsed.canonical or f"raw:{gold_text}"
        fallback = method in _FALLBACK_METHODS
        # json_text: orjson, 0.15 us against the stdlib's 1.6, for every rollout
        # prepared (issue 11); a lone surrogate by the stdlib, escaped.
        key = json_text([pred_key or f"raw:{answer}", gold_key, fallback])
    return Prepared(
        extracted=answer,
        extraction_method=method,
        format_valid=format_valid,
        canonical_pred=pred_parsed.canonical if pred_parsed else None,
        canonical_gold=gold_parsed.canonical,
        decision_key=key,
        extraction_reason=reason,
        gold_text=gold_text,
        pred_parsed=pred_parsed,
        gold_parsed=gold_parsed,
    )


def decide(prepared: Prepared, *, options: GradeOptions | None = None) -> Verdict:
    """Compare the prepared answer with the gold and build the verdict.

    With ``options.allow_fallback=False``, an answer found only by a fallback (a
    "the result is 4" phrase or the last number) is not credited: the verdict is
    ``no_answer`` (correct=False) with the fallback text kept in `extracted`.

    Args:
        prepared: output of `prepare`.
        options: grading options (defaults to `GradeOptions()`).

    Returns:
        The verdict; never raises (our own bugs become ``status=error``).
    """
    opts = options or _DEFAULT_OPTIONS
    if prepared.internal_error:
        status, method = Status.ERROR, VerifyMethod.NONE
        reason = f"internal error: {prepared.internal_error}"
    else:
        status, method, reason = decide_parsed(
            pred=prepared.pred_parsed,
            gold=prepared.gold_parsed,
            fallback=prepared.extraction_method in _FALLBACK_METHODS,
            extraction_reason=prepared.extraction_reason,
            options=opts,
        )
    return verdict_from(prepared, status=status, verify_method=method, reason=reason)


def verdict_from(
    prepared: Prepared,
    *,
    status: Status,
    verify_method: VerifyMethod = VerifyMethod.NONE,
    reason: str,
) -> Verdict:
    """The verdict for `prepared` with a decided status (also used by the sandbox to
    report a timeout, memory kill or crash with the response's own extraction)."""
    return Verdict(
        correct=status is Status.CORRECT,
        status=status,
        format_valid=prepared.format_valid,
        extracted=prepared.extracted,
        extraction_method=prepared.extraction_method,
        canonical_pred=prepared.canonical_pred,
        canonical_gold=prepared.canonical_gold,
        verify_method=verify_method,
        reason=reason,
        grader_version=GRADER_VERSION,
    )


def grade(
    response: str,
    gold: str | int | float | Decimal | Fraction,
    *,
    options: GradeOptions | None = None,
) -> Verdict:
    """Grade a model's whole response against a gold answer.

    Deterministic, thread-safe and bounded: it never raises for str inputs, and
    oversized or pathological answers come back as ``unsupported`` in milliseconds.

    Args:
        response: the model's response (free text with a final answer somewhere).
        gold: the gold answer; an int, float, Decimal or Fraction counts as its
            exact text (`5` is "5", `0.1` is "0.1").
        options: grading options (defaults to `GradeOptions()`).

    Returns:
        The verdict.

    Raises:
        TypeError: `response` is not a str, or `gold` is neither a str nor a finite
            number: a caller's mistake, never an ``error`` verdict (a silent zero).

    Example:
        >>> v = grade("So the answer is $\\\\boxed{\\\\frac{1}{2}}$.", "0.5")
        >>> (v.correct, v.status.value, v.verify_method.value, v.format_valid)
        (True, 'correct', 'numeric', True)
    """
    if not isinstance(response, str):
        raise TypeError(f"response must be str, not {type(response).__name__}")
    gold_text = exact_gold_text(gold)
    verdict = decide(prepare(response, gold_text, options=options), options=options)
    return identical_never_wrong(verdict, response, gold_text)


def identical_never_wrong(verdict: Verdict, answer: str, gold: str) -> Verdict:
    """The same text, read once as an answer (markers, fallbacks) and once as a gold
    (its own extraction), can give two answers: identical text is then a refusal,
    never `wrong`. Part of `grade()`; a caller that decides through `prepare` and
    `decide` (the sandbox, the cache) applies it per item, with the item's texts."""
    if verdict.status is not Status.WRONG or answer.strip() != gold.strip():
        return verdict
    return dataclasses.replace(
        verdict,
        status=Status.UNSUPPORTED,
        reason=f"identical text read as two answers ({verdict.reason})",
    )


def grade_answer(
    answer: str, gold: str, *, options: GradeOptions | None = None
) -> Verdict:
    """Grade an already-extracted answer (no extraction; treated as a boxed answer).

    Args:
        answer: the final answer text (for example ``"\\\\frac{1}{2}"``).
        gold: the gold answer.
        options: grading options (defaults to `GradeOptions()`).

    Returns:
        The verdict; an empty answer is ``no_answer``.
    """
    text = bare_answer_text(answer) if answer.strip() else ""
    reason = "" if text else "empty answer"
    method = ExtractionMethod.BOXED if text else ExtractionMethod.NONE
    try:
        prepared = _prepared(text or None, method, bool(text), reason, gold)
    except Exception as exc:  # a grader bug becomes an `error` verdict, never a crash
        prepared = _broken(exc)
    return identical_never_wrong(decide(prepared, options=options), answer, gold)
