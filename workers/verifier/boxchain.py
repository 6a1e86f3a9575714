"""Boxes written as one list (`\\boxed{1}, \\boxed{2}`): read back from the last box.

A response's earlier boxes normally never count (a corrected answer wins). The one
exception: boxes that end the response joined by nothing but connectors (spaces,
commas, math delimiters, `\\quad`, `and`/`or`, `\\text{and}`, a part label such as
`for part (a)`) are one list answer. Any other word between them (`Draft \\boxed{5};
corrected \\boxed{7}`, `wait, no:`) breaks the chain, and only the last box counts.
Boxes may carry distinct labels (`y_1 = \\boxed{..} and y_2 = \\boxed{..}`), kept as
`y_1 = .., y_2 = ..`. The merged answer is a comma list, so it can only match a gold
with several parts (or one that every part equals).
"""

from __future__ import annotations

import re

from workers.verifier.spans import Box, last_box

__all__ = ["box_chain"]

# Boxes joined beyond this many are not merged at all (the last box alone counts).
MAX_CHAIN_BOXES = 16
# A gap between chained boxes longer than this is not a connector.
MAX_CONNECTOR_CHARS = 60
# How far before the first box its label (`y_1 =`) is looked for.
MAX_LABEL_CHARS = 20

_WORD = (
    r"\s|,|(?<![A-Za-z])(?:and|or)(?![A-Za-z])"
    r"|(?<![A-Za-z])(?:for\s+)?part\s*(?:\([a-z0-9]\)|[a-z0-9])(?![A-Za-z0-9])"
)
_CONNECTOR = (
    rf"(?:{_WORD}|\$|&|\\[()\[\]]|\\q?quad(?![A-Za-z])|\\[,;: !]"
    rf"|\\text\s*\{{(?:{_WORD})*\}})*"
)
_NAME = r"(?<![A-Za-z\\])[A-Za-z](?:_\{?[A-Za-z0-9]{1,3}\}?)?"
_GAP = re.compile(rf"{_CONNECTOR}(?:(?P<label>{_NAME})\s*=\s*)?")
_LABEL_END = re.compile(rf"(?P<label>{_NAME})\s*=\s*\Z")


def box_chain(text: str, last: Box) -> list[str]:
    """The chained boxes' answers (with their labels), in text order.

    Returns ``[last.content]`` when no earlier box is chained, when the chain is
    longer than `MAX_CHAIN_BOXES`, when labels are missing or repeated, or when
    every chained box says the same thing.
    """
    if last.content is None:
        return []
    contents, labels = [last.content], []
    start = last.start
    for _ in range(MAX_CHAIN_BOXES):
        previous = _chained_before(text, start) if start >= 0 else None
        if previous is None:
            break
        content, start, label = previous
        contents.append(content)
        labels.append(label)
    else:
        return [last.content]  # too many boxes to be one answer
    labels.append(_label_before(text, start))
    return _items(contents[::-1], labels[::-1], last.content)


def _items(contents: list[str], labels: list[str], last: str) -> list[str]:
    """Join unlabelled boxes as they are; labelled ones only with distinct labels."""
    if not any(labels[1:]):  # a label on the first box alone names them all
        return [last] if len(set(contents)) == 1 else contents
    if not all(labels) or len(set(labels)) != len(labels):
        return [last]
    pairs = zip(labels, contents, strict=True)
    return [f"{label} = {content}" for label, content in pairs]


def _chained_before(text: str, start: int) -> tuple[str, int, str] | None:
    """(content, start, label of the box at `start`) of the box chained before it."""
    box = last_box(text[:start])
    if box is None or box.problem or box.content is None or box.start < 0:
        return None
    gap = text[box.end : start]
    match = _GAP.fullmatch(gap) if len(gap) <= MAX_CONNECTOR_CHARS else None
    if match is None:
        return None
    return box.content, box.start, _squeeze(match.group("label"))


def _label_before(text: str, start: int) -> str:
    match = _LABEL_END.search(text, max(0, start - MAX_LABEL_CHARS), max(start, 0))
    return _squeeze(match.group("label")) if match is not None else ""


def _squeeze(label: str | None) -> str:
    return "".join(label.split()) if label else ""
