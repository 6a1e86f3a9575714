"""JSONL rollouts in and graded JSONL out: field aliases, line errors, chunking (pure).

Input: one JSON object per line. The response is the first field present (and not
null) among `RESPONSE_FIELDS`, the gold the first among `GOLD_FIELDS`; blank lines are
skipped. A line that cannot be used becomes a `LineError` and every other line is still
graded. Output: the input object plus `VERDICT_FIELDS` and `gradefleet_line` (the
1-based input line number, so output can be joined back to input).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import IO, Any, TypeVar

from workers import models
from workers.contract import text_error
from workers.models import Status, Verdict

__all__ = [
    "GOLD_FIELDS",
    "LINE_FIELD",
    "MAX_LINE_BYTES",
    "RESPONSE_FIELDS",
    "VERDICT_FIELDS",
    "InputRow",
    "LineError",
    "Summary",
    "atomic_output",
    "chunked",
    "dump_line",
    "graded_record",
    "parse_line",
    "read_rows",
]

T = TypeVar("T")

# Precedence is the tuple order: the first field present and not null wins.
RESPONSE_FIELDS = ("response", "completion", "output", "solution_str")
GOLD_FIELDS = (
    "gold",
    "ground_truth",
    "answer",
    "solution",
    "expected_answer",
    "reward_model.ground_truth",  # verl's nested layout
)
# The verdict fields written to each output line (the canonical forms stay internal).
VERDICT_FIELDS = tuple(
    name
    for name in models.VERDICT_FIELDS
    if name not in {"canonical_pred", "canonical_gold"}
)
LINE_FIELD = "gradefleet_line"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Longer lines are rejected without being held in memory (a CoT is ~1-20 KB).
MAX_LINE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class InputRow:
    """One usable input line: the fields to grade and the original object."""

    line_no: int
    response: str
    gold: str
    record: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class LineError:
    """One input line that could not be used, with a reason for the user."""

    line_no: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.reason}"


def _lookup(record: Mapping[str, Any], path: str) -> Any:
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _pick(record: Mapping[str, Any], fields: tuple[str, ...]) -> tuple[str, Any]:
    for name in fields:
        value = _lookup(record, name)
        if value is not None:
            return name, value
    return "", None


def _gold_text(value: Any) -> str | None:
    # Numeric golds are common (`"answer": 18`); bools are not answers.
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _row(record: dict[str, Any], line_no: int) -> InputRow | LineError:
    name, response = _pick(record, RESPONSE_FIELDS)
    if not name:
        return LineError(
            line_no=line_no,
            reason=f"no response field (one of {', '.join(RESPONSE_FIELDS)})",
        )
    if not isinstance(response, str):
        kind = type(response).__name__
        return LineError(
            line_no=line_no, reason=f"field {name!r} must be a string, not {kind}"
        )
    name, gold = _pick(record, GOLD_FIELDS)
    if not name:
        return LineError(
            line_no=line_no, reason=f"no gold field (one of {', '.join(GOLD_FIELDS)})"
        )
    gold_text = _gold_text(gold)
    if gold_text is None:
        kind = type(gold).__name__
        return LineError(
            line_no=line_no,
            reason=f"field {name!r} must be a string or number, not {kind}",
        )
    if (error := text_error(response, gold_text)) is not None:
        return LineError(line_no=line_no, reason=error)
    return InputRow(line_no=line_no, response=response, gold=gold_text, record=record)


def parse_line(raw: bytes, line_no: int) -> InputRow | LineError | None:
    """Parse one raw line (bytes, newline included or not); None for a blank line."""
    if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte order mark some editors write
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return LineError(line_no=line_no, reason=f"invalid UTF-8 at byte {exc.start}")
    if not text.strip():
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return LineError(
            line_no=line_no, reason=f"invalid JSON: {exc.msg} at column {exc.colno}"
        )
    except RecursionError:
        return LineError(line_no=line_no, reason="invalid JSON: nested too deeply")
    if not isinstance(record, dict):
        kind = type(record).__name__
        return LineError(line_no=line_no, reason=f"expected a JSON object, got {kind}")
    return _row(record, line_no)


def read_rows(
    stream: IO[bytes], *, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[InputRow | LineError]:
    """Yield a row or an error per non-blank line (streaming, bounded per line)."""
    line_no = 0
    while True:
        raw = stream.readline(max_line_bytes + 1)
        if not raw:
            return
        line_no += 1
        if len(raw) > max_line_bytes:
            while raw and not raw.endswith(b"\n"):  # drain the rest of the long line
                raw = stream.readline(max_line_bytes)
            yield LineError(
                line_no=line_no, reason=f"line longer than {max_line_bytes} bytes"
            )
            continue
        parsed = parse_line(raw, line_no)
        if parsed is not None:
            yield parsed


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Split `items` into lists of at most `size`, in order."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def graded_record(row: InputRow, verdict: Verdict) -> dict[str, Any]:
    """The output object: input fields, then verdict fields (these win on clashes)."""
    verdict_dict = verdict.to_dict()
    record = dict(row.record)
    for name in VERDICT_FIELDS:
        record[name] = verdict_dict[name]
    record[LINE_FIELD] = row.line_no
    return record


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def dump_line(record: Mapping[str, Any]) -> str:
    """One JSONL line (UTF-8 kept readable, newline included).

    A lone surrogate (input JSON may carry `"\\ud800"`, and the verdict's
    `extracted` may echo it) cannot be written as UTF-8; it is written as its
    JSON escape instead, which reads back as the same string. Surrogates only
    ever sit inside JSON strings, so the escape keeps the line valid JSON.
    """
    return (
        _LONE_SURROGATE.sub(_escape_surrogate, json.dumps(record, ensure_ascii=False))
        + "\n"
    )


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[IO[str]]:
    """Open `path` for writing so readers see the old file or the whole new one.

    Writes to a temporary file in the same directory and renames it into place only
    if the block finishes without an exception. `-` means standard output.
    """
    if path == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or "."
    )
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def _rate(count: int, total: int) -> str:
    return f"{count / total:.1%}" if total else "n/a"


@dataclass(slots=True, kw_only=True)
class Summary:
    """Running totals over graded rows, rendered as the CLI's closing table."""

    graded: int = 0
    correct: int = 0
    format_valid: int = 0
    cached: int = 0
    input_errors: int = 0
    wall_s: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)

    def add(self, verdict: Verdict) -> None:
        self.graded += 1
        self.correct += verdict.correct
        self.format_valid += verdict.format_valid
        self.cached += verdict.cached
        self.statuses[verdict.status.value] += 1

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs in display order; every status is listed."""
        n = self.graded
        throughput = f"{n / self.wall_s:,.1f} rollouts/s" if self.wall_s > 0 else "n/a"
        rows = [
            ("rollouts graded", f"{n:,}"),
            ("accuracy", _rate(self.correct, n)),
            ("format valid", _rate(self.format_valid, n)),
        ]
        rows += [(f"  {s.value}", _rate(self.statuses[s.value], n)) for s in Status]
        rows += [
            ("cache hit rate", _rate(self.cached, n)),
            ("input errors", f"{self.input_errors:,}"),
            ("throughput", throughput),
            ("wall time", f"{self.wall_s:.2f} s"),
        ]
        return rows

    def render(self) -> str:
        """A two-column plain-text table (no colours, safe to paste in a log)."""
        rows = self.rows()
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {value}" for label, value in rows) + "\n"
