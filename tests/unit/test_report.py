"""`gradefleet report` on the Qwen file (8 samples per problem) against values
computed by hand from its per-sample verdicts; the JSON schema; version mixing."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from producer.cli import cli
from producer.files.formats import iter_records
from tests.helpers import QWEN_FILE as QWEN
from workers.lines.records import InputRow, dump_line, expand_records, graded_record
from workers.verifier import grade


@pytest.fixture(scope="module")
def qwen_graded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen file graded in-process, as `gradefleet grade` writes it."""
    out = tmp_path_factory.mktemp("qwen") / "graded.jsonl"
    rows = [
        r for r in expand_records(iter_records(str(QWEN))) if isinstance(r, InputRow)
    ]
    assert len(rows) == 800
    with out.open("w") as handle:
        for row in rows:
            handle.write(dump_line(graded_record(row, grade(row.response, row.gold))))
    return out


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _hand_majority(samples: list[dict[str, Any]]) -> bool:
    """The vote written out plainly: most frequent canonical answer, the earliest
    on a tie; no answer does not vote; no vote at all is wrong."""
    answers = [s["canonical_pred"] or s["extracted"] for s in samples]
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return False
    top = max(counts.values())
    winner = next(a for a in answers if a is not None and counts[a] == top)
    return bool(samples[answers.index(winner)]["correct"])


def _hand_per_problem(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    by_idx: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_idx.setdefault(str(r["idx"]), []).append(r)
    out = {}
    for idx, samples in by_idx.items():
        samples.sort(key=lambda s: s["sample_idx"])
        assert len(samples) == 8
        c = sum(s["correct"] for s in samples)
        out[idx] = {
            "pass1": c / 8,  # 1 - C(8-c, 1)/C(8, 1)
            "pass8": 1.0 if c else 0.0,  # 1 - C(8-c, 8)/C(8, 8)
            "maj8": float(_hand_majority(samples)),
            "acc": c / 8,
        }
    return out


def _report(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["report", *args, "--json", "-"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_report_qwen_per_problem_pass_and_maj_match_hand_computation(qwen_graded):
    hand = _hand_per_problem(_records(qwen_graded))
    report = _report(str(qwen_graded), "--by", "idx", "--k", "1,8")
    groups = {g["key"]["idx"]: g for g in report["groups"]}
    assert set(groups) == set(hand)
    for idx, expected in hand.items():
        got = groups[idx]
        assert got["n"] == 8
        assert got["prompts"] == 1
        assert got["pass_at"]["1"] == pytest.approx(expected["pass1"], abs=1e-6)
        assert got["pass_at"]["8"] == pytest.approx(expected["pass8"], abs=1e-6)
        assert got["maj_at"]["8"] == pytest.approx(expected["maj8"], abs=1e-6)
        assert got["accuracy"] == pytest.approx(expected["acc"], abs=1e-6)


def test_report_qwen_overall_matches_hand_computation(qwen_graded):
    records = _records(qwen_graded)
    hand = _hand_per_problem(records)
    report = _report(str(qwen_graded))
    overall = report["overall"]
    assert overall["n"] == 800
    assert overall["prompts"] == 100
    assert report["prompt_key"] == {"idx": 800}
    mean = lambda key: sum(h[key] for h in hand.values()) / 100  # noqa: E731
    assert overall["pass_at"]["1"] == pytest.approx(mean("pass1"), abs=1e-6)
    assert overall["pass_at"]["8"] == pytest.approx(mean("pass8"), abs=1e-6)
    assert overall["maj_at"]["8"] == pytest.approx(mean("maj8"), abs=1e-6)
    correct = sum(r["correct"] for r in records)
    assert overall["correct"] == correct
    assert overall["accuracy"] == pytest.approx(correct / 800, abs=1e-6)
    # clustered by problem: G/(G-1) * sum_j (c_j - p*8)^2 / N^2
    p = correct / 800
    spread = sum((8 * h["acc"] - 8 * p) ** 2 for h in hand.values())
    se = math.sqrt(100 / 99 * spread) / 800
    assert overall["clustered"] is True
    assert overall["stderr"] == pytest.approx(se, abs=1e-6)
    assert overall["ci95"][0] == pytest.approx(p - 1.959963984540054 * se, abs=1e-6)
    statuses = Counter(r["status"] for r in records)
    for status, rate in overall["status_rates"].items():
        assert rate == pytest.approx(statuses[status] / 800, abs=1e-6)
    valid = sum(r["format_valid"] for r in records)
    assert overall["format_valid_rate"] == pytest.approx(valid / 800, abs=1e-6)


def test_report_json_schema_fields(qwen_graded):
    report = _report(str(qwen_graded), "--by", "level")
    assert report["schema"] == 1
    assert report["grader_version"].startswith("gradefleet-")
    assert report["k"] == [1, 2, 4, 8]
    assert "first in sample order" in report["maj_tie_break"]
    levels = [g["key"]["level"] for g in report["groups"]]
    assert levels == sorted(levels)
    assert sum(g["n"] for g in report["groups"]) == 800
    for group in [report["overall"], *report["groups"]]:
        assert set(group) >= {
            "key", "n", "prompts", "accuracy", "stderr", "ci95", "pass_at",
            "maj_at", "status_rates", "format_valid_rate",
        }  # fmt: skip


def test_report_terminal_table_states_the_grader_and_the_prompt_key(qwen_graded):
    result = CliRunner().invoke(cli, ["report", str(qwen_graded), "--by", "level"])
    assert result.exit_code == 0, result.output
    assert "grader version: gradefleet-" in result.output
    assert "prompts keyed by: idx (800)" in result.output
    assert "level=Level 5" in result.output
    assert "pass@8" in result.output


def _graded_line(i: int, version: str, **extra: Any) -> str:
    record = {
        "id": f"r{i}",
        "response": f"\\boxed{{{i}}}",
        "gold": "1",
        "correct": i == 1,
        "status": "correct" if i == 1 else "wrong",
        "format_valid": True,
        "extracted": str(i),
        "canonical_pred": str(i),
        "grader_version": version,
        "gradefleet_line": i,
        **extra,
    }
    return json.dumps(record) + "\n"


def test_report_refuses_mixed_grader_versions_or_splits_them(tmp_path: Path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        _graded_line(1, "v1") + _graded_line(2, "v2") + _graded_line(3, "v2")
    )
    result = CliRunner().invoke(cli, ["report", str(path)])
    assert result.exit_code == 4
    assert "several grader versions" in result.output
    assert "v1 (1 rows)" in result.output
    split = _report(str(path), "--split-versions")
    assert [(g["key"]["grader_version"], g["n"]) for g in split["groups"]] == [
        ("v1", 1),
        ("v2", 2),
    ]
    assert split["grader_version"] == "mixed"


def test_report_pass_at_k_only_over_prompts_with_enough_samples(tmp_path: Path):
    # prompt a: 4 samples (1 correct), prompt b: 2 samples (both correct)
    lines = [
        _graded_line(1 if s == 0 else 9, "v", uid="a", sample_idx=s) for s in range(4)
    ] + [_graded_line(1, "v", uid="b", sample_idx=s) for s in range(2)]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(lines))
    report = _report(str(path), "--k", "1,2,4")
    overall = report["overall"]
    assert overall["pass_at"]["1"] == pytest.approx((0.25 + 1.0) / 2)
    assert overall["pass_at"]["2"] == pytest.approx((0.5 + 1.0) / 2)
    assert overall["pass_at"]["4"] == pytest.approx(1.0)  # only prompt a has 4
    # maj@4 of a: answers 1,9,9,9 -> 9 (wrong)
    assert overall["maj_at"]["4"] == pytest.approx(0.0)
    assert overall["samples_per_prompt"] == {"min": 2, "max": 4}


def test_report_rejects_an_ungraded_file(tmp_path: Path):
    path = tmp_path / "raw.jsonl"
    path.write_text('{"response": "r", "gold": "g"}\n')
    result = CliRunner().invoke(cli, ["report", str(path)])
    assert result.exit_code == 4
    assert "no verdict" in result.output


def test_report_maj_at_k_of_a_prompt_split_across_sources_is_voted_per_source(
    tmp_path: Path,
):
    # prompt a: samples 0-1 in source x answer 9 (wrong), 2-3 in y answer 1 (right);
    # over all four, maj@2 takes the first two (9, 9): wrong. Per source it is not.
    lines = [
        _graded_line(9, "v", uid="a", sample_idx=0, data_source="x"),
        _graded_line(9, "v", uid="a", sample_idx=1, data_source="x"),
        _graded_line(1, "v", uid="a", sample_idx=2, data_source="y"),
        _graded_line(1, "v", uid="a", sample_idx=3, data_source="y"),
    ]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(lines))
    report = _report(str(path), "--k", "2", "--by", "data_source")
    by_source = {g["key"]["data_source"]: g["maj_at"]["2"] for g in report["groups"]}
    assert by_source == {"x": 0.0, "y": 1.0}
    sources = {g["key"]["data_source"]: g["maj_at"]["2"] for g in report["sources"]}
    assert sources == {"x": 0.0, "y": 1.0}
    (kind,) = report["kinds"]  # one kind: the prompt is whole, 4 samples
    assert kind["key"] == {"kind": "math"}
    assert kind["maj_at"]["2"] == 0.0
