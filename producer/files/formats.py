"""Rollout files in and out: JSONL, Parquet and Inspect `.eval` logs, told apart by
their first bytes (never by decoding Parquet as text), and graded output as JSONL or
Parquet (by the output name's `.parquet` suffix), written atomically.

Parquet goes through pyarrow (the `parquet` extra), Inspect logs through inspect-ai's
log API (the `inspect` extra); without the extra, `producer.extras.require` exits 2
with its `pip install` line. lm-eval's `samples_*.jsonl` are JSONL
whose fields the alias tables already know (`resps`, `target`, `doc_id`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import IO, TYPE_CHECKING, Any, Protocol

from producer.errors import InputFormatError
from producer.extras import require
from workers.lines.records import (
    IO_BUFFER_BYTES,
    LineError,
    atomic_output,
    atomic_path,
    dump_line,
    read_lines,
    read_records,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

__all__ = [
    "InputFormat",
    "JsonlWriter",
    "RecordWriter",
    "detect_format",
    "iter_records",
    "jsonl_lines",
    "open_output",
    "require_format_extras",
]

Record = tuple[int, dict[str, Any]]
PARQUET_MAGIC = b"PAR1"
ZIP_MAGIC = b"PK\x03\x04"  # an Inspect `.eval` log is a zip archive
# Rows pyarrow decodes at once, and rows buffered per Parquet row group on output.
PARQUET_READ_ROWS = 1024
PARQUET_GROUP_ROWS = 10_000


class InputFormat(StrEnum):
    """The layouts `iter_records` reads."""

    JSONL = "jsonl"
    PARQUET = "parquet"
    INSPECT = "inspect"


def detect_format(head: bytes) -> InputFormat:
    """The format of a file that starts with `head` (its first 4 bytes or more)."""
    if head.startswith(PARQUET_MAGIC):
        return InputFormat.PARQUET
    if head.startswith(ZIP_MAGIC):
        return InputFormat.INSPECT
    return InputFormat.JSONL


def iter_records(path: str) -> Iterator[Record | LineError]:
    """`(line_no, object)` per record of `path` (`-`: standard input, JSONL only);
    line_no is the 1-based line (JSONL) or row/sample number (Parquet, Inspect).

    Raises:
        InputFormatError: the file is Parquet or a zip but cannot be read as such.
    """
    fmt = _input_format(path)
    if fmt is InputFormat.JSONL:
        with _jsonl_stream(path) as stream:
            yield from read_records(stream)
    elif fmt is InputFormat.PARQUET:
        yield from _parquet_records(path)
    else:
        yield from _inspect_records(path)


def jsonl_lines(path: str) -> Iterator[tuple[int, bytes] | LineError] | None:
    """The raw lines of `path` (`-`: standard input) if it is JSONL, else None."""
    if _input_format(path) is not InputFormat.JSONL:
        return None

    def lines() -> Iterator[tuple[int, bytes] | LineError]:
        with _jsonl_stream(path) as stream:
            yield from read_lines(stream)

    return lines()


# The extra each format needs, and the modules the readers and writers import.
_FORMAT_EXTRAS = {
    InputFormat.PARQUET: ("parquet", ("pyarrow", "pyarrow.parquet")),
    InputFormat.INSPECT: ("inspect", ("inspect_ai.log",)),
}


def require_format_extras(input_path: str, output_path: str) -> None:
    """Before any work: MissingExtraError (exit 2, the `pip install` line) when
    reading `input_path` or writing `output_path` needs an extra not installed."""
    formats = [_input_format(input_path)]
    if output_path.endswith(".parquet"):
        formats.append(InputFormat.PARQUET)
    for fmt in formats:
        if fmt in _FORMAT_EXTRAS:
            extra, modules = _FORMAT_EXTRAS[fmt]
            require(extra, *modules)


def _input_format(path: str) -> InputFormat:
    """What `path` holds (`-`: standard input, which must be JSONL)."""
    if path == "-":
        stdin = sys.stdin.buffer
        head = stdin.peek(4)[:4] if hasattr(stdin, "peek") else b""
        if detect_format(head) is not InputFormat.JSONL:
            raise InputFormatError("Parquet and .eval input need a file path, not -")
        return InputFormat.JSONL
    with open(path, "rb") as handle:
        return detect_format(handle.read(4))


@contextlib.contextmanager
def _jsonl_stream(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdin.buffer  # left open: it is not ours
        return
    with open(path, "rb", buffering=IO_BUFFER_BYTES) as handle:
        yield handle


def _parquet_records(path: str) -> Iterator[Record]:
    require("parquet", *_FORMAT_EXTRAS[InputFormat.PARQUET][1])
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputFormatError(f"{path}: not a readable Parquet file: {exc}") from exc
    row_no = 0
    with parquet:
        for batch in parquet.iter_batches(batch_size=PARQUET_READ_ROWS):
            for record in batch.to_pylist():
                row_no += 1
                yield row_no, record


def _inspect_records(path: str) -> Iterator[Record | LineError]:
    """One record per sample and epoch of an Inspect log (epochs are samples of one
    prompt: `prompt_id` is the sample id, `sample_idx` the epoch - 1)."""
    require("inspect", *_FORMAT_EXTRAS[InputFormat.INSPECT][1])
    from inspect_ai.log import read_eval_log_samples

    try:
        samples = read_eval_log_samples(path, all_samples_required=False)
        for number, sample in enumerate(samples, start=1):
            if sample.error is not None:  # no output to grade: say so, skip it
                yield LineError(
                    line_no=number,
                    reason=f"Inspect sample {sample.id} epoch {sample.epoch} ended in "
                    f"an error: {str(sample.error.message)[:200]}",
                )
            else:
                yield number, _inspect_record(sample)
    except (ValueError, KeyError, OSError) as exc:
        raise InputFormatError(f"{path}: not a readable Inspect log: {exc}") from exc


def _inspect_record(sample: Any) -> dict[str, Any]:
    prompt = sample.input if isinstance(sample.input, str) else None
    return {
        "id": f"{sample.id}#{sample.epoch}",
        "prompt_id": str(sample.id),
        "sample_idx": int(sample.epoch) - 1,
        "response": sample.output.completion,
        "target": sample.target,
        "input": prompt,
        "metadata": dict(sample.metadata or {}),
    }


class RecordWriter(Protocol):
    """Where graded records go, in order."""

    def write(self, record: Mapping[str, Any]) -> None: ...


# Output written since the kernel was last told to start writing it to disk.
WRITEBACK_BYTES = 8 << 20


class JsonlWriter:
    """JSONL records and line-mode workers' lines into `handle`. With `writeback`
    (a file that is fsynced when done, `atomic_output`), each `WRITEBACK_BYTES`
    written are handed to the kernel's writeback at once, so that fsync waits for
    the last few MiB, not the whole file: on a 59 MB output, 15 ms of writing
    and syncing against 35 (median of 8, this machine's disk; issue 11)."""

    def __init__(self, handle: IO[str], *, writeback: bool = False) -> None:
        self._handle = handle
        self._writeback = writeback
        self._unsent = 0  # bytes, roughly (text counts characters)
        self._sent_to = 0  # the file offset written back from

    def write(self, record: Mapping[str, Any]) -> None:
        line = dump_line(record)
        self._handle.write(line)
        self._grew(len(line))

    def write_lines(self, data: bytes) -> None:
        """Lines `dump_line` wrote elsewhere (a line-mode worker), UTF-8, as they
        are (after what was written as text)."""
        buffer = getattr(self._handle, "buffer", None)
        encoding = (getattr(self._handle, "encoding", None) or "").lower()
        if buffer is None or encoding.replace("-", "") != "utf8":
            self._handle.write(data.decode("utf-8"))  # as text, in its encoding
            return
        self._handle.flush()
        buffer.write(data)
        self._grew(len(data))

    def _grew(self, size: int) -> None:
        if not self._writeback:
            return
        self._unsent += size
        if self._unsent < WRITEBACK_BYTES:
            return
        self._unsent = 0
        handle = self._handle
        handle.flush()  # outside the try: a failed write (a full disk) is raised
        try:
            end = handle.buffer.tell()  # type: ignore[attr-defined]
            # For DONTNEED, Linux starts writing the range's dirty pages back, not
            # waiting for it, and drops only its pages already on disk (few: these
            # were written just now); elsewhere it is a hint at most.
            os.posix_fadvise(
                handle.fileno(), self._sent_to, end - self._sent_to,
                os.POSIX_FADV_DONTNEED,
            )  # fmt: skip
            self._sent_to = end
        except (AttributeError, OSError, ValueError):  # no such call, not a file
            self._writeback = False


class _ParquetWriter:
    """Buffers rows and writes a row group per `PARQUET_GROUP_ROWS`; the schema is
    inferred from the first group, and a later column it lacks is an error (never
    dropped silently)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._rows: list[Mapping[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None

    def write(self, record: Mapping[str, Any]) -> None:
        self._rows.append(record)
        if len(self._rows) >= PARQUET_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._rows:
            return
        if self._schema is not None:
            known = set(self._schema.names)
            for record in self._rows:
                extra = set(record) - known
                if extra:
                    raise InputFormatError(
                        f"Parquet output: column(s) {sorted(extra)} first appear after "
                        f"row {PARQUET_GROUP_ROWS:,}; write JSONL instead"
                    )
        # Columns are the union of the rows' fields, in first-seen order (from_pylist
        # would keep only the first row's fields and drop the others silently).
        names = list(dict.fromkeys(k for record in self._rows for k in record))
        if self._schema is not None:
            names = self._schema.names
        columns = {k: [record.get(k) for record in self._rows] for k in names}
        try:
            table = pa.Table.from_pydict(columns, schema=self._schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise InputFormatError(
                f"Parquet output: rows do not fit one schema ({exc}); write JSONL"
            ) from exc
        if self._writer is None:
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self._path, table.schema)
        self._writer.write_table(table)
        self._rows = []

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writer.close()
        else:  # no rows at all: still a valid (empty) Parquet file
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({}), self._path)


@contextlib.contextmanager
def open_output(path: str) -> Iterator[RecordWriter]:
    """A writer for `path`: Parquet if it ends in `.parquet`, else JSONL (`-`:
    standard output). Readers see the old file or the whole new one."""
    if not path.endswith(".parquet"):
        with atomic_output(path) as handle:
            yield JsonlWriter(handle, writeback=path != "-")
        return
    require("parquet", *_FORMAT_EXTRAS[InputFormat.PARQUET][1])  # before any file
    with atomic_path(path) as tmp_name:
        writer = _ParquetWriter(tmp_name)
        yield writer
        writer.close()
