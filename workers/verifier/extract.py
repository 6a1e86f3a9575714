"""Find the final answer in a model's response, and the answer in a gold string.

Pure stdlib string work, linear in the input (see `spans` and `prose`). Policy:

1. Text after an end-of-turn token (`<|im_end|>`, `<|im_start|>`...) is dropped, and
   so is a run-on into a new turn (``User:`` after an ``</answer>``; then
   ``format_valid`` is false). Stray closers trailing the response (``</think>``
   or ``</answer>`` closing nothing, end tokens, a lone ``<``) are dropped before
   any search (`spans.strip_stray_closers`). More than `MAX_RUN_ON_CHARS` of text
   after the final box or tag also makes ``format_valid`` false (the answer stands).
   ``<think>``: only the text after the last ``</think>`` is searched. If nothing
   follows it, or the ``<think>`` is never closed, the whole text is searched and
   ``format_valid`` is false (the answer sits inside the reasoning).
2. Explicit markers (a tag, then a line, beats a box only when it comes after it):
   - the last ``\\boxed{...}`` / ``\\fbox{...}`` (brace-depth aware; ``\\boxed 5``
     takes the next token). Earlier boxes count only when joined to the last one
     by connectors alone (`\\boxed{1} and \\boxed{2}` is the list `1, 2`; any
     other word breaks the chain, see `boxchain`). An empty last box
     gives no answer (no fallback). A truncated last box (``\\boxed{4`` at the end)
     is not a box: the search falls through and ``format_valid`` is false;
   - ``<answer>...</answer>`` (up to the first ``</answer>`` after the last
     ``<answer>``): its content is searched with these same rules; a box inside it
     is reported as ``boxed``, anything else as ``answer_tag``;
   - an ``Answer: x`` line (``ANSWER:``, ``**Answer:**``, ``Final Answer:``, a
     ``Final Answer`` heading over the answer, ``Final Answer:`` or ``the answer:``
     mid-line; a heading or line whose sentence ends in a colon is answered by the
     display math right below it) or a GSM8K ``A: 18`` last line or ``#### 18``
     anywhere on the last line (a ``####`` is never a label).
   A "the answer is X" phrase after the tag or line restates it and wins. Prose in
   any of these spans is read by the sentence policy (`sentences`) when parsed.
3. Fallbacks, ``format_valid`` false: "the final answer is X" / "the answer is X" /
   "the result is X" (``final_answer_phrase``); then, reported as ``last_number``,
   a math span closing the text (``so $x \\ge 5$.``), a whole response that is one
   short expression (``x+1``), the final sentence's asserted value, the last
   ```` ```output ```` block, and the last number not glued to a word and not a label
   (``#3``, ``Step 2``). A response that ends in 300+ characters without a digit
   committed to no number: the last three give nothing there; nor do any of
   these unmarked finders when the text stops mid-sentence on a function word or a
   comma (``... multiply this by the number of``): a truncated output.
   Full-width digits (``１２３``) are read as ASCII digits by the fallbacks.

`extract_gold` reads ``#### 18``, then boxes (the last one, or all of them joined
when the gold is only a list of boxes), then answer lines and phrases, then the
whole gold (``any text=12`` naming its value before a final ``=`` gives ``12``).
`bare_answer_text` prepares an already-extracted answer the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.models import ExtractionMethod
from workers.verifier.boxchain import box_chain
from workers.verifier.prose import (
    MAX_BARE_ANSWER_CHARS,
    UNMARKED_FINDERS,
    answer_line,
    cut_mid_sentence,
    named_value,
    phrase_answer,
)
from workers.verifier.spans import (
    SPECIAL_TOKENS,
    Box,
    answer_tag,
    box_list,
    clean,
    last_box,
    marker_name,
    strip_stray_closers,
)

__all__ = ["Extraction", "bare_answer_text", "extract_answer", "extract_gold"]

# More text than this (not counting whitespace) after the final answer's marker is a
# run-on (a new question, rambling): `format_valid` is then false.
MAX_RUN_ON_CHARS = 1_000
# A gold longer than this without any answer marker is not read as a bare answer.
MAX_BARE_GOLD_CHARS = 2_000

_PROSE_METHODS = (
    ExtractionMethod.ANSWER_LINE,
    ExtractionMethod.FINAL_ANSWER_PHRASE,
)
_END_OF_TURN = (*SPECIAL_TOKENS, "<|im_start|>", "<｜end▁of▁sentence｜>")
_NEW_TURNS = ("\nUser:", "\nHuman:", "\nQuestion:")
# Full-width and mathematical digits (and full-width . , / -) as ASCII, so that the
# unmarked fallbacks, which scan for ASCII digits, see `１２３` (one linear pass).
_WIDE_DIGITS = str.maketrans(
    {
        **{chr(0xFF10 + d): str(d) for d in range(10)},
        **{chr(0x1D7CE + i): str(i % 10) for i in range(50)},
        "．": ".",
        "，": ",",
        "／": "/",
        "－": "-",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Extraction:
    """The answer found in a response and how it was found.

    Attributes:
        answer: extracted answer text, stripped; None if nothing usable.
        method: where the answer was found.
        format_valid: an explicit, well-formed final-answer marker was used
            (boxed, fbox, answer_tag, answer_line) and nothing was truncated.
        reason: a short human explanation (for example ``"empty \\boxed{}"``).
    """

    answer: str | None
    method: ExtractionMethod
    format_valid: bool
    reason: str


def extract_answer(response: str) -> Extraction:
    """Extract the final answer from a model's whole response.

    Args:
        response: the model's text (any string; never raises).

    Returns:
        The answer (None when nothing usable), the method and format validity.
    """
    text, think_note = _final_part(response)
    found = _extract_from(text)
    if think_note and found.answer is not None:
        return Extraction(
            answer=found.answer,
            method=found.method,
            format_valid=False,
            reason=f"{found.reason}; {think_note}",
        )
    return found


def extract_gold(gold: str) -> str | None:
    """Read the reference answer out of a gold string.

    Accepts a bare or LaTeX answer, a worked solution (its last box), a GSM8K
    solution (``#### 18`` or a final ``A: 18`` line). Returns None for an empty or
    unreadable gold.
    """
    text = strip_stray_closers(_cut_at_end_of_turn(gold)).strip()
    if not text:
        return None
    hashes = text.rfind("####")
    if hashes >= 0:
        tail = text[hashes + 4 :].strip()
        return clean(tail.splitlines()[0]) if tail else None
    box = last_box(text)
    if box is not None and box.problem:
        return None  # a cut-off box: what the gold meant is unknown
    if box is not None:
        listed = box_list(text)
        return listed if listed is not None else box.content
    line = answer_line(text, allow_gsm8k="\n" in text)
    if line is not None:
        return line[0]
    phrase = phrase_answer(text) if len(text) > MAX_BARE_ANSWER_CHARS else None
    if phrase is not None:
        return phrase
    if len(text) > MAX_BARE_GOLD_CHARS:
        return None
    bare = clean(text)
    return named_value(bare) if bare is not None else None


def bare_answer_text(answer: str) -> str:
    """An already-extracted answer as the comparison should see it: end tokens and
    stray closing tags cut, a `\\boxed{}` still around it opened, a stray trailing
    `\\` dropped, and the value of a named one (`any text=12`)."""
    text = strip_stray_closers(_cut_at_end_of_turn(answer))
    box = last_box(text)
    if box is not None and not box.problem and box.content is not None:
        text = ", ".join(box_chain(text, box))
    bare = clean(text)
    return answer.strip() if bare is None else named_value(bare)


def _final_part(response: str) -> tuple[str, str]:
    """Drop `<think>` reasoning; return the text to search and a note if unusual."""
    response = strip_stray_closers(_cut_at_end_of_turn(response))
    run_on = _run_on_turn(response)
    if run_on >= 0:
        text, note = _final_part(response[:run_on])
        return text, note or "run-on into a new turn after </answer>"
    close = response.rfind("</think>")
    if close >= 0:
        after = response[close + len("</think>") :]
        if clean(after):
            return after, ""
        return response[:close], "answer only inside <think>"
    if response.find("<think>") >= 0:
        return response, "unterminated <think>"
    return response, ""


def _cut_at_end_of_turn(response: str) -> str:
    """Drop what follows an end-of-turn token (a run-on into the next chat turn)."""
    cut = len(response)
    for token in _END_OF_TURN:
        pos = response.find(token, 0, cut)
        if pos >= 0 and response[:pos].strip():
            cut = pos
    return response[:cut]


def _run_on_turn(response: str) -> int:
    """Offset of a new chat turn (`User:`) started after the first `</answer>`, or -1.

    A base model that does not stop writes the next question and answers it: the
    answer to this question is the one before the run-on.
    """
    close = response.find("</answer>")
    if close < 0:
        return -1
    found = [response.find(turn, close) for turn in _NEW_TURNS]
    return min((pos for pos in found if pos >= 0), default=-1)


def _extract_from(text: str) -> Extraction:
    box = last_box(text)
    valid_box = box if box is not None and not box.problem else None
    box_end = valid_box.end if valid_box is not None else -1
    tag = answer_tag(text)
    line = answer_line(text, allow_gsm8k=True)
    if tag is not None and tag[1] > box_end:
        found = _run_on_after(_from_tag(tag[0]), text, tag[1])
        found = _restated(found, text, tag[1])
    elif line is not None and line[1] >= box_end:
        # An answer line after the last box is the model's final word on it.
        found = Extraction(
            answer=line[0],
            method=ExtractionMethod.ANSWER_LINE,
            format_valid=True,
            reason="answer line",
        )
        line_end = text.find("\n", line[1])
        found = _restated(found, text, len(text) if line_end < 0 else line_end)
    elif valid_box is not None:
        return _run_on_after(_from_box(valid_box, text), text, valid_box.end)
    else:
        found = _fallbacks(text)
    if box is not None and box.problem:
        note = f"{box.problem} {marker_name(box.method)}{{"
        return Extraction(
            answer=found.answer,
            method=found.method,
            format_valid=False,
            reason=f"{note}; {found.reason}",
        )
    return found


def _restated(found: Extraction, text: str, end: int) -> Extraction:
    """A "the answer is X" phrase after a tag or answer line is the model's later,
    explicit word: it beats the earlier span (`Answer: The bakery sold 14 loaves.`
    then `The answer is: 10` gives 10)."""
    if found.answer is None or end >= len(text):
        return found
    phrase = phrase_answer(text[end:])
    if phrase is None:
        return found
    return Extraction(
        answer=phrase,
        method=found.method,
        format_valid=found.format_valid,
        reason=f"{found.reason}, restated later by an answer phrase",
    )


def _run_on_after(found: Extraction, text: str, end: int) -> Extraction:
    """`format_valid` false when a long run-on follows the answer's marker (a new
    question, rambling): the answer stands, but the response did not end with it."""
    if not found.format_valid or len(text) - end <= MAX_RUN_ON_CHARS:
        return found
    trailing = len("".join(text[end:].split()))
    if trailing <= MAX_RUN_ON_CHARS:
        return found
    return Extraction(
        answer=found.answer,
        method=found.method,
        format_valid=False,
        reason=f"{found.reason}; followed by {trailing} characters of run-on text",
    )


def _from_box(box: Box, text: str) -> Extraction:
    if box.content is None:
        return _none(f"empty {marker_name(box.method)}{{}}")
    chained = box_chain(text, box)
    reason = f"last {marker_name(box.method)}{{}}"
    if len(chained) > 1:
        reason = f"{len(chained)} boxes joined by connectors, read as a list"
    return Extraction(
        answer=", ".join(chained),
        method=box.method,
        format_valid=True,
        reason=reason,
    )


def _from_tag(content: str) -> Extraction:
    inner = _extract_from(content)
    if inner.method in (ExtractionMethod.BOXED, ExtractionMethod.FBOX):
        return _replace_reason(inner, f"{inner.reason} inside <answer>")
    # A line or phrase inside the tag names the answer; otherwise the whole
    # content is the answer (`<answer>x = 5</answer>`, not its last number).
    answer = inner.answer if inner.method in _PROSE_METHODS else clean(content)
    if answer is None:
        return _none("empty <answer></answer>")
    return Extraction(
        answer=answer,
        method=ExtractionMethod.ANSWER_TAG,
        format_valid=True,
        reason="<answer> tag",
    )


def _fallbacks(text: str) -> Extraction:
    """Without a marker: a phrase, a closing math span, a bare answer, a number.

    A closing math span (`... so $x \\in [-2, 7]$.`) or a whole response that is
    one short expression (`x+1`) is reported as `last_number`: the nearest method
    name for "the last value written", and equally unmarked.
    """
    text = text.translate(_WIDE_DIGITS)
    phrase = phrase_answer(text)
    if phrase is not None:
        return Extraction(
            answer=phrase,
            method=ExtractionMethod.FINAL_ANSWER_PHRASE,
            format_valid=False,
            reason="no marker; final-answer phrase",
        )
    if cut_mid_sentence(text):
        return _none("no marker; the text stops mid-sentence (cut off)")
    for finder, reason in UNMARKED_FINDERS:
        answer = finder(text)
        if answer is not None:
            return Extraction(
                answer=answer,
                method=ExtractionMethod.LAST_NUMBER,
                format_valid=False,
                reason=f"no marker; {reason}",
            )
    return _none("no answer found")


def _none(reason: str) -> Extraction:
    return Extraction(
        answer=None, method=ExtractionMethod.NONE, format_valid=False, reason=reason
    )


def _replace_reason(found: Extraction, reason: str) -> Extraction:
    return Extraction(
        answer=found.answer,
        method=found.method,
        format_valid=found.format_valid,
        reason=reason,
    )
