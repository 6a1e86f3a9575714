"""JSONL reading (aliases, line errors), chunking, output records and atomic writes."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from workers.lines.fields import FieldSpec
from workers.lines.records import (
    LINE_FIELD,
    VERDICT_FIELDS,
    InputRow,
    LineError,
    Summary,
    atomic_output,
    dump_line,
    graded_record,
    growing_chunks,
    parse_line,
    parse_record,
    read_rows,
    rows_from_record,
)
from workers.models import ExtractionMethod, Status, Verdict, VerifyMethod
from workers.wire.contract import MAX_TEXT_CHARS


def _parse(obj: object, line_no: int = 1) -> InputRow | LineError | None:
    parsed = parse_line(json.dumps(obj).encode(), line_no)
    if isinstance(parsed, list):
        assert len(parsed) == 1
        return parsed[0]
    return parsed


# --- alias resolution: (record, expected response, expected gold) ---
ALIASES = [
    # plain names
    ({"response": "r", "gold": "g"}, "r", "g"),
    # response aliases
    ({"completion": "r", "gold": "g"}, "r", "g"),
    ({"output": "r", "gold": "g"}, "r", "g"),
    ({"solution_str": "r", "gold": "g"}, "r", "g"),
    # gold aliases
    ({"response": "r", "ground_truth": "g"}, "r", "g"),
    ({"response": "r", "answer": "g"}, "r", "g"),
    ({"response": "r", "solution": "g"}, "r", "g"),
    ({"response": "r", "expected_answer": "g"}, "r", "g"),
    ({"response": "r", "reward_model": {"ground_truth": "g"}}, "r", "g"),
    # precedence: the first field present in the documented order wins
    ({"output": "o", "response": "r", "completion": "c", "gold": "g"}, "r", "g"),
    ({"completion": "c", "solution_str": "s", "gold": "g"}, "c", "g"),
    ({"response": "r", "answer": "a", "gold": "g", "ground_truth": "t"}, "r", "g"),
    ({"response": "r", "solution": "s", "answer": "a"}, "r", "a"),
    (
        {
            "response": "r",
            "reward_model": {"ground_truth": "n"},
            "expected_answer": "e",
        },
        "r",
        "e",
    ),
    # null counts as absent, numbers are accepted for gold
    ({"response": None, "completion": "c", "gold": "g"}, "c", "g"),
    ({"response": "r", "gold": None, "answer": "a"}, "r", "a"),
    ({"response": "r", "gold": 18}, "r", "18"),
    ({"response": "r", "gold": 0.5}, "r", "0.5"),
]


@pytest.mark.parametrize(
    ("record", "response", "gold"), ALIASES, ids=[json.dumps(a[0]) for a in ALIASES]
)
def test_batching_alias_resolution(
    record: dict[str, Any], response: str, gold: str
) -> None:
    row = _parse(record)
    assert isinstance(row, InputRow)
    assert (row.response, row.gold) == (response, gold)
    assert row.record == record


# --- malformed lines: (raw bytes, words the reason must contain) ---
MALFORMED = [
    (b'{"response": "r", "gold": ', "invalid JSON"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'"just a string"', "expected a JSON object, got str"),
    (b'{"gold": "g"}', "no response field"),
    (b'{"response": "r"}', "no gold field"),
    (b'{"response": 3, "gold": "g"}', "'response' must be a string or a list, not int"),
    (b'{"response": "r", "gold": true}', "'gold' must be a string or number, not bool"),
    (
        b'{"response": "r", "gold": [{}]}',
        "'gold' must be a string or number, not dict",
    ),
    (b'{"response": "r", "gold": []}', "'gold' is an empty list"),
    (b'{"response": [], "gold": "g"}', "'response' is an empty list"),
    (b'{"response": ["a", 3], "gold": "g"}', "'response'[1] must be a string"),
    (
        b'{"response": "r", "reward_model": {"ground_truth": {}}}',
        "'reward_model.ground_truth'",
    ),
    (b'{"response": "\xff", "gold": "g"}', "invalid UTF-8 at byte 14"),
    (b"[" * 100_000, "invalid JSON"),
]


@pytest.mark.parametrize(("raw", "words"), MALFORMED, ids=[m[1] for m in MALFORMED])
def test_batching_malformed_line_is_a_line_error(raw: bytes, words: str) -> None:
    error = parse_line(raw, 7)
    assert isinstance(error, LineError)
    assert error.line_no == 7
    assert words in error.reason
    assert str(error).startswith("line 7: ")


def test_batching_text_over_wire_limit_is_a_line_error() -> None:
    error = _parse({"response": "x" * (MAX_TEXT_CHARS + 1), "gold": "1"})
    assert isinstance(error, LineError)
    assert "limit" in error.reason


def test_batching_read_rows_skips_blank_lines_and_keeps_numbering() -> None:
    data = (
        b'{"response": "a", "gold": "1"}\n\n   \nnot json\n{"response": "b", "gold": 2}'
    )
    parsed = list(read_rows(io.BytesIO(data)))
    assert [type(p).__name__ for p in parsed] == ["InputRow", "LineError", "InputRow"]
    assert [p.line_no for p in parsed] == [1, 4, 5]


def test_batching_read_rows_strips_bom_and_handles_crlf() -> None:
    data = '\ufeff{"response": "a", "gold": "1"}\r\n{"response": "é", "gold": "2"}\r\n'
    rows = list(read_rows(io.BytesIO(data.encode("utf-8"))))
    assert [(r.line_no, r.response) for r in rows if isinstance(r, InputRow)] == [
        (1, "a"),
        (2, "é"),
    ]


def test_batching_read_rows_rejects_an_overlong_line_without_losing_the_next() -> None:
    long_line = b'{"response": "' + b"x" * 5000 + b'", "gold": "1"}\n'
    data = long_line + b'{"response": "a", "gold": "1"}\n'
    parsed = list(read_rows(io.BytesIO(data), max_line_bytes=1000))
    assert isinstance(parsed[0], LineError)
    assert "longer than 1000 bytes" in parsed[0].reason
    assert isinstance(parsed[1], InputRow)
    assert parsed[1].line_no == 2


def test_batching_growing_chunks_keep_order_and_grow_to_the_cap() -> None:
    assert list(growing_chunks(range(7), 3, 1, 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    chunks = list(growing_chunks(range(40), 2, 3, 10))
    assert [len(c) for c in chunks] == [2, 6, 10, 10, 10, 2]
    assert [x for c in chunks for x in c] == list(range(40))
    assert list(growing_chunks([], 3, 2, 5)) == []
    with pytest.raises(ValueError, match="chunk sizes"):
        list(growing_chunks(range(3), 0, 2, 5))


def test_batching_growing_chunks_split_the_last_short_chunk_on_request() -> None:
    # The last chunk (7 of 10 asked) goes in two, its last quarter (at least the
    # first chunk's size) on its own; nothing else changes
    chunks = list(growing_chunks(range(25), 2, 3, 10, split_tail=True))
    assert [len(c) for c in chunks] == [2, 6, 10, 5, 2]
    assert [x for c in chunks for x in c] == list(range(25))
    assert [len(c) for c in growing_chunks(range(25), 2, 3, 10)] == [2, 6, 10, 7]
    big = list(growing_chunks(range(18 + 9), 2, 3, 10, split_tail=True))
    assert [len(c) for c in big] == [2, 6, 10, 7, 2]
    # A last chunk under twice the first size, or a full one, stays whole
    assert [len(c) for c in growing_chunks(range(21), 2, 3, 10, split_tail=True)] == [
        2,
        6,
        10,
        3,
    ]
    assert [len(c) for c in growing_chunks(range(28), 2, 3, 10, split_tail=True)] == [
        2,
        6,
        10,
        10,
    ]
    assert [len(c) for c in growing_chunks(range(3), 2, 3, 10, split_tail=True)] == [
        2,
        1,
    ]


def _verdict(**changes: object) -> Verdict:
    base = Verdict(
        correct=True,
        status=Status.CORRECT,
        format_valid=True,
        extracted="4",
        extraction_method=ExtractionMethod.BOXED,
        canonical_pred="4",
        canonical_gold="4",
        verify_method=VerifyMethod.EXACT,
        reason="",
        grader_version="v-test",
    )
    return base.replace(**changes)


def test_batching_graded_record_is_input_plus_verdict_fields() -> None:
    row = InputRow(
        line_no=9, response="r", gold="4", record={"id": "a", "status": "mine"}
    )
    record = graded_record(row, _verdict())
    assert list(record) == [
        "id",
        "status",
        *[f for f in VERDICT_FIELDS if f != "status"],
        LINE_FIELD,
    ]
    assert record["status"] == "correct"  # verdict fields win over input fields
    assert record[LINE_FIELD] == 9
    assert record["extraction_method"] == "boxed"
    assert record["canonical_pred"] == _verdict().canonical_pred
    assert "canonical_gold" not in record
    assert row.record == {"id": "a", "status": "mine"}  # the input is not mutated


def test_batching_atomic_output_replaces_only_on_success(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")

    def write_then_fail() -> None:
        with atomic_output(str(target)) as handle:
            handle.write("half")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_then_fail()
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["out.jsonl"]  # no temp file left behind
    with atomic_output(str(target)) as handle:
        handle.write("new\n")
    assert target.read_text() == "new\n"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_batching_summary_counts_and_renders() -> None:
    summary = Summary()
    summary.add(_verdict())
    summary.add(_verdict(correct=False, status=Status.WRONG, format_valid=False))
    summary.add(_verdict(correct=False, status=Status.TIMEOUT, cached=False))
    summary.add(_verdict(cached=True))
    summary.input_errors = 2
    summary.wall_s = 2.0
    table = {label.strip(): value for label, value in summary.rows()}
    assert table["rollouts graded"] == "4"
    assert table["accuracy"] == "50.0%"
    assert table["format valid"] == "75.0%"
    assert table["wrong"] == "25.0%"
    assert table["timeout"] == "25.0%"
    assert table["no_answer"] == "0.0%"
    assert table["cache hit rate"] == "25.0%"
    assert table["input errors"] == "2"
    assert table["throughput"] == "2.0 rollouts/s"
    assert "wall time" in summary.render()


def test_batching_summary_of_nothing_says_na() -> None:
    table = dict(Summary().rows())
    assert table["accuracy"] == "n/a"
    assert table["throughput"] == "n/a"


def test_batching_dump_line_escapes_lone_surrogates_only() -> None:
    record = {"a": "x\ud800y", "b\udfff": "é ✓", "c": "\U0001f600"}
    line = dump_line(record)
    line.encode("utf-8")  # writable as UTF-8
    assert json.loads(line) == record
    assert "é ✓" in line  # the rest stays readable
    assert "\U0001f600" in line


@pytest.mark.parametrize(
    "record",
    [
        {"response": "\\boxed{\\frac{1}{2}} é ✓ \u2028 \x01", "gold": "0.5", "n": None},
        {"nested": {"list": [1, 2.5, {"deep": [True, None, "x"]}]}, "e": 1e300},
        {"big": 2**70, "neg": -(2**64)},  # beyond 64 bits
        {"a": "x\ud800y", "extracted": None},  # a lone surrogate
        {"nan": float("nan"), "extracted": None},
        {"inf": [float("inf"), float("-inf")], "extracted": None},
    ],
)
def test_batching_dump_line_reads_back_as_the_stdlib_writes_it(
    record: dict[str, Any],
) -> None:
    # Whichever encoder writes a line, it reads back as the stdlib's line does.
    line = dump_line(record)
    assert line.endswith("\n")
    assert line.count("\n") == 1
    line.encode("utf-8")  # writable as UTF-8
    want = json.loads(json.dumps(record, ensure_ascii=False))
    got = json.loads(line)
    assert repr(got) == repr(want)  # NaN == NaN only through repr


@pytest.mark.parametrize(
    "raw",
    [
        b'{"id": 123456789012345678901234567890, "response": "x", "gold": "1"}',
        b'{"id": -9223372036854775809, "n": 18446744073709551616}',
        b'{"score": NaN, "big": 1e400, "small": -Infinity}',
        b'{"response": "\\ud800 lone", "gold": "\\udfff"}',
        b'{"a": 1, "a": 2, "f": 1.1000000000000001, "z": -0.0}',
        '{"response": "caf\u00e9 \U0001f600", "gold": "1"}'.encode(),
    ],
)
def test_batching_parse_record_reads_every_line_as_the_stdlib(raw: bytes) -> None:
    # The fast reader (orjson) must never change a value the stdlib reads.
    record = parse_record(raw, 2)
    assert repr(record) == repr(json.loads(raw.decode()))


@pytest.mark.parametrize(
    "record",
    [
        {"response": "so \\boxed{2}", "gold": "2", "id": 7},
        {"response": "x", "gold": "1", "answer": "9", "completion": "y"},
        {"response": "x" * (MAX_TEXT_CHARS + 1), "gold": "1"},
        {"response": "x", "gold": "1" * (MAX_TEXT_CHARS + 1)},
        {"response": "x", "gold": 3},
        {"response": ["a", "b"], "gold": "1", "score": [1, 0]},
        {"response": "x", "gold": ["1", "2"]},
        {"response": "x", "gold": True},
    ],
)
def test_batching_common_layout_reads_as_the_alias_tables_say(
    record: dict[str, Any],
) -> None:
    # The shortcut for {"response": str, "gold": str} (no field overrides) must give
    # exactly the rows of the general path, which an override always takes.
    tables = rows_from_record(dict(record), 3)
    named = rows_from_record(
        dict(record), 3, FieldSpec(response="response", gold="gold")
    )
    assert tables == named
