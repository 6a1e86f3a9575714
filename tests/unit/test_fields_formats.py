"""Rollout files as they come: samples per line, gold aliases and lists, dotted
overrides, prompt keys; JSONL / Parquet / Inspect detected by content; Parquet out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from producer.errors import InputFormatError
from producer.files import formats
from producer.files.formats import (
    InputFormat,
    JsonlWriter,
    detect_format,
    iter_records,
    open_output,
)
from tests.helpers import QWEN_FILE as QWEN
from workers.lines.fields import FieldSpec, prompt_key, record_id
from workers.lines.records import InputRow, LineError, expand_records, rows_from_record


def _rows(record: dict[str, Any], spec: FieldSpec | None = None) -> list[InputRow]:
    rows = rows_from_record(record, 1, spec or FieldSpec())
    assert isinstance(rows, list), rows
    return rows


def test_fields_qwen_line_is_eight_rollouts_with_their_own_pred_and_score():
    record = json.loads(QWEN.read_text().splitlines()[0])
    rows = _rows(record)
    assert len(rows) == 8
    assert [r.record["sample_idx"] for r in rows] == list(range(8))
    for i, row in enumerate(rows):
        assert row.response == record["code"][i] == row.record["response"]
        assert row.record["code"] == record["code"][i]  # parallel lists sliced
        assert row.record["pred"] == record["pred"][i]
        assert row.record["score"] == record["score"][i]
        assert row.gold == record["answer"]
        assert row.record["idx"] == record["idx"]
    assert record["code"] == json.loads(QWEN.read_text().splitlines()[0])["code"]


def test_fields_gold_aliases_and_lists():
    assert _rows({"response": "r", "gt": "7"})[0].gold == "7"
    assert _rows({"response": "r", "target": 7})[0].gold == "7"
    row = _rows({"response": "r", "gold": ["1/2", "0.5"]})[0]
    assert (row.gold, row.alt_golds) == ("1/2", ("0.5",))
    # a bool label is a correctness label, not a gold: the next alias is used
    assert _rows({"response": "r", "label": False, "solution": "s"})[0].gold == "s"
    assert _rows({"response": "r", "label": "42"})[0].gold == "42"
    bad = rows_from_record({"response": "r", "label": True}, 3)
    assert isinstance(bad, LineError)
    assert "no gold field" in bad.reason


def test_fields_dotted_overrides_replace_the_alias_table():
    record = {"out": {"text": ["a", "b"]}, "meta": {"truth": "4"}, "gold": "no"}
    rows = _rows(record, FieldSpec(response="out.text", gold="meta.truth"))
    assert [(r.response, r.gold) for r in rows] == [("a", "4"), ("b", "4")]
    assert rows[1].record["out"] == {"text": "b"}
    assert record["out"] == {"text": ["a", "b"]}  # input not mutated


def test_fields_lm_eval_sample_line():
    # lm-eval's samples_*.jsonl: resps is a list (per request) of generations.
    record = {
        "doc_id": 3,
        "doc": {"question": "1+1?", "answer": "#### 2"},
        "target": "2",
        "arguments": [["1+1?", {"until": ["\n"]}]],
        "resps": [["so \\boxed{2}", "maybe \\boxed{3}"]],
        "filtered_resps": ["2"],
        "exact_match": 1.0,
    }
    rows = _rows(record)
    assert [(r.response, r.gold) for r in rows] == [
        ("so \\boxed{2}", "2"),
        ("maybe \\boxed{3}", "2"),
    ]
    assert prompt_key(rows[1].record, FieldSpec()) == ("doc_id", "3")
    assert record_id(rows[1].record, FieldSpec()) == "3#1"


def test_fields_prompt_key_falls_back_to_prompt_text_then_line():
    spec = FieldSpec()
    assert prompt_key({"uid": "u1", "idx": 4}, spec) == ("uid", "u1")
    how, key = prompt_key({"prompt": [{"role": "user", "content": "hi"}]}, spec)
    assert how == "prompt-hash"
    assert key == prompt_key({"prompt": [{"content": "hi", "role": "user"}]}, spec)[1]
    assert prompt_key({"gradefleet_line": 9}, spec) == ("line", "9")
    assert prompt_key({"q": "x", "idx": 1}, FieldSpec(prompt="q")) == ("q", "x")


def test_formats_detected_by_content_not_by_name(tmp_path: Path):
    table = pa.table({"response": ["\\boxed{1}"], "gold": ["1"]})
    disguised = tmp_path / "really_parquet.jsonl"
    pq.write_table(table, disguised)
    assert detect_format(disguised.read_bytes()[:4]) is InputFormat.PARQUET
    assert list(iter_records(str(disguised))) == [
        (1, {"response": "\\boxed{1}", "gold": "1"})
    ]
    text = tmp_path / "really_jsonl.parquet"
    text.write_text('{"response": "r", "gold": "g"}\n')
    assert list(iter_records(str(text))) == [(1, {"response": "r", "gold": "g"})]


def test_formats_broken_parquet_is_a_clear_error(tmp_path: Path):
    broken = tmp_path / "x.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(InputFormatError, match="not a readable Parquet"):
        list(iter_records(str(broken)))


def test_formats_verl_parquet_with_responses_and_nested_ground_truth(tmp_path: Path):
    # verl's generation output: the dataset columns plus `responses` (n samples).
    path = tmp_path / "gen.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "data_source": "openai/gsm8k",
                    "prompt": [{"role": "user", "content": "2+2?"}],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": "4"},
                    "extra_info": {"split": "test", "index": 0},
                    "responses": ["\\boxed{4}", "\\boxed{5}"],
                }
            ]
        ),
        path,
    )
    rows = [
        r for r in expand_records(iter_records(str(path))) if isinstance(r, InputRow)
    ]
    assert [(r.response, r.gold, r.record["sample_idx"]) for r in rows] == [
        ("\\boxed{4}", "4", 0),
        ("\\boxed{5}", "4", 1),
    ]
    assert prompt_key(rows[0].record, FieldSpec()) == ("extra_info.index", "0")


def test_formats_parquet_round_trip(tmp_path: Path):
    records = [
        {
            "id": f"r{i}",
            "sample_idx": i % 2,
            "reward_model": {"ground_truth": str(i)},
            "correct": i % 3 == 0,
            "extracted": None if i == 2 else str(i),
            "score": 0.5 * i,
        }
        for i in range(25_000)  # more than one row group
    ]
    records[1]["only_here"] = "x"  # a field the first row lacks is kept
    for record in records:
        record.setdefault("only_here", None)
    out = tmp_path / "graded.parquet"
    with open_output(str(out)) as writer:
        for record in records:
            writer.write(record)
    assert [r for _, r in iter_records(str(out))] == records  # type: ignore[misc]
    assert [p.name for p in tmp_path.iterdir()] == ["graded.parquet"]


def test_formats_parquet_output_refuses_a_late_new_column(tmp_path: Path):
    out = tmp_path / "graded.parquet"

    def write_all() -> None:
        with open_output(str(out)) as writer:
            for i in range(10_001):
                writer.write({"a": i})
            writer.write({"a": 1, "b": 2})

    with pytest.raises(InputFormatError, match="write JSONL"):
        write_all()
    assert list(tmp_path.iterdir()) == []  # no partial file, no temp file


# A real Inspect run (mockllm: no network) writes a real .eval log. In a process of
# its own: Inspect's event loop leaves objects that warn when collected later.
_INSPECT_RUN = r"""
import sys
from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate

def output(text):
    made = ModelOutput.from_content(model="mockllm/model", content=text)
    made.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return made

texts = ["so \\boxed{4}", "it is \\boxed{5}", "\\boxed{6}", "\\boxed{9}"]
model = get_model("mockllm/model", custom_outputs=[output(t) for t in texts])
task = Task(
    dataset=[
        Sample(input="2+2?", target="4", id="q1"),
        Sample(input="2+3?", target=["5", "five"], id="q2"),
    ],
    solver=generate(),
    epochs=2,
)
logs = inspect_eval(
    task, model=model, log_dir=sys.argv[1], display="none", max_samples=1
)
assert logs[0].status == "success", logs[0].error
print(logs[0].location)
"""


@pytest.mark.slow
def test_formats_inspect_eval_log_read_through_its_log_api(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-c", _INSPECT_RUN, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    path = run.stdout.strip().splitlines()[-1]
    rows = [r for r in expand_records(iter_records(path)) if isinstance(r, InputRow)]
    got = {(r.record["prompt_id"], r.record["sample_idx"]): r for r in rows}
    assert set(got) == {("q1", 0), ("q1", 1), ("q2", 0), ("q2", 1)}
    texts = {"so \\boxed{4}", "it is \\boxed{5}", "\\boxed{6}", "\\boxed{9}"}
    assert {r.response for r in rows} == texts
    assert got["q2", 0].gold == "5"
    assert got["q2", 0].alt_golds == ("five",)
    assert prompt_key(got["q1", 1].record, FieldSpec()) == ("prompt_id", "q1")


@pytest.mark.parametrize("writeback_bytes", [1, 4096, 1 << 40])
def test_formats_jsonl_output_handed_to_writeback_is_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writeback_bytes: int
) -> None:
    # Given records and workers' raw lines written in turn, the kernel told to
    # write the file back every few bytes, every page or never
    monkeypatch.setattr(formats, "WRITEBACK_BYTES", writeback_bytes)
    out = tmp_path / "out.jsonl"
    want = []
    with open_output(str(out)) as writer:
        assert isinstance(writer, JsonlWriter)
        for i in range(300):
            record = {"i": i, "text": "é" * (i % 50)}
            writer.write(record)
            raw = json.dumps({"raw": i}).encode() + b"\n"
            writer.write_lines(raw)
            want += [record, {"raw": i}]
    # Then the file holds every line, in order
    assert [json.loads(line) for line in out.read_text().splitlines()] == want


def test_formats_jsonl_writeback_on_a_pipe_is_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a writer with writeback on a pipe (no pages to write back)
    monkeypatch.setattr(formats, "WRITEBACK_BYTES", 1)
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "w") as handle:
        writer = JsonlWriter(handle, writeback=True)
        # When lines go through it, then they arrive whole, nothing raised
        writer.write({"a": 1})
        writer.write_lines(b'{"b": 2}\n')
        handle.close()
        assert reader.read() == b'{"a":1}\n{"b": 2}\n'
