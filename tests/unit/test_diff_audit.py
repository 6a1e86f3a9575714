"""`gradefleet diff` (flips, directions, McNemar, exit code) and `gradefleet audit`
(confusion matrix, alpha/phi with Wilson intervals, corrected accuracy)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

from producer.cli import cli


def _row(
    i: int, correct: bool, status: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "id": f"r{i}",
        "response": f"text {i}",
        "gold": "1",
        "data_source": "a" if i % 2 else "b",
        "correct": correct,
        "status": status or ("correct" if correct else "wrong"),
        "format_valid": True,
        "extracted": str(i),
        "reason": "because",
        "grader_version": "v",
        "cached": False,
        **extra,
    }


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_diff_identical_except_cached_is_no_flip(tmp_path: Path):
    rows = [_row(i, i % 3 == 0) for i in range(10)]
    a = _write(tmp_path / "a.jsonl", rows)
    b = _write(tmp_path / "b.jsonl", [{**r, "cached": True} for r in rows])
    result = _invoke("diff", a, b)
    assert result.exit_code == 0, result.output
    assert "flipped: 0" in result.output


def test_diff_lists_flips_counts_directions_and_tests_them(tmp_path: Path):
    # 40 pairs: 3 correct->wrong, 9 wrong->correct, 2 wrong->unsupported.
    old = [_row(i, i < 20) for i in range(40)]
    new = [dict(r) for r in old]
    for i in range(3):
        new[i] |= {"correct": False, "status": "wrong", "grader_version": "w"}
    for i in range(20, 29):
        new[i] |= {"correct": True, "status": "correct", "grader_version": "w"}
    for i in range(29, 31):
        new[i] |= {"status": "unsupported"}
    new.reverse()  # joined on id, not on position
    a, b = _write(tmp_path / "a.jsonl", old), _write(tmp_path / "b.jsonl", new)
    result = _invoke(
        "diff", a, b, "--by", "data_source", "--json", str(tmp_path / "d.json")
    )
    assert result.exit_code == 1, result.output
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["joined_on"] == "id"
    assert data["paired"] == 40
    assert len(data["flips"]) == 14
    totals: dict[str, int] = {}
    for group in data["directions"]:
        for direction, n in group["counts"].items():
            totals[direction] = totals.get(direction, 0) + n
    assert totals == {"correct→wrong": 3, "wrong→correct": 9, "wrong→unsupported": 2}
    assert data["accuracy"] == {"a": 0.5, "b": pytest.approx(26 / 40)}
    reference = mcnemar([[17, 3], [9, 11]], exact=True).pvalue
    assert data["mcnemar"]["p_value"] == pytest.approx(reference)
    assert data["delta"]["value"] == pytest.approx(6 / 40)
    se = math.sqrt(12 - 36 / 40) / 40
    assert data["delta"]["stderr"] == pytest.approx(se)
    flip = next(f for f in data["flips"] if f["id"] == "r0")
    assert flip["status"] == {"a": "correct", "b": "wrong"}
    assert flip["grader_version"] == {"a": "v", "b": "w"}
    assert flip["extracted"] == {"a": "0", "b": "0"}
    assert "r0: correct→wrong" in result.output


def test_diff_without_ids_joins_on_position_and_checks_the_texts(tmp_path: Path):
    old = [{k: v for k, v in _row(i, True).items() if k != "id"} for i in range(3)]
    new = [dict(r) for r in old]
    new[1] |= {"correct": False, "status": "wrong"}
    result = _invoke("diff", _write(tmp_path / "a", old), _write(tmp_path / "b", new))
    assert result.exit_code == 1
    assert "joined on position" in result.output
    shuffled = [new[1], new[0], new[2]]
    result = _invoke(
        "diff", _write(tmp_path / "a", old), _write(tmp_path / "c", shuffled)
    )
    assert result.exit_code == 4
    assert "do not line up" in result.output


def _labeled(tmp_path: Path) -> str:
    # 30 labeled correct: 27 verdict correct, 3 not (FN); 20 labeled wrong: 2 FP.
    rows = [_row(i, i < 27, label=True) for i in range(30)]
    rows[27]["status"] = "unsupported"
    rows += [_row(i, i < 32, label=False) for i in range(30, 50)]
    rows += [_row(99, True)]  # no label: left out
    return _write(tmp_path / "labeled.jsonl", rows)


def test_audit_confusion_alpha_phi_and_corrected_accuracy(tmp_path: Path):
    out = tmp_path / "audit.json"
    result = _invoke(
        "audit", _labeled(tmp_path), "--json", str(out), "--by", "data_source"
    )
    assert result.exit_code == 0, result.output
    audit = json.loads(out.read_text())
    assert audit["confusion"] == {"tp": 27, "fn": 3, "fp": 2, "tn": 18}
    assert audit["unlabeled"] == 1
    assert audit["alpha"]["value"] == pytest.approx(3 / 30)
    assert audit["phi"]["value"] == pytest.approx(2 / 20)
    low, high = proportion_confint(3, 30, method="wilson")
    assert audit["alpha"]["ci95"] == pytest.approx([low, high])
    low, high = proportion_confint(2, 20, method="wilson")
    assert audit["phi"]["ci95"] == pytest.approx([low, high])
    # On the audited set the corrected accuracy is exactly the labeled accuracy.
    assert audit["measured_accuracy"]["value"] == pytest.approx(29 / 50)
    assert audit["corrected_accuracy"]["value"] == pytest.approx(30 / 50)
    assert audit["by_status"]["unsupported"] == {"label_correct": 1}
    kinds = [d["kind"] for d in audit["disagreements"]]
    assert kinds == ["false_positive"] * 2 + ["false_negative"] * 3
    assert {d["id"] for d in audit["disagreements"][:2]} == {"r30", "r31"}
    assert sum(g["n"] for g in audit["groups"]) == 50
    assert "false_positive: r30" in result.output


def test_report_with_audit_prints_the_corrected_accuracy(tmp_path: Path):
    audit_path = tmp_path / "audit.json"
    assert (
        _invoke("audit", _labeled(tmp_path), "--json", str(audit_path)).exit_code == 0
    )
    graded = _write(tmp_path / "g.jsonl", [_row(i, i < 70) for i in range(100)])
    result = _invoke("report", graded, "--audit", str(audit_path), "--json", "-")
    assert result.exit_code == 0, result.output
    corrected = json.loads(result.stdout)["corrected"]
    alpha, phi = 0.1, 0.1
    assert corrected["value"] == pytest.approx((0.7 - phi) / (1 - alpha - phi))
    assert corrected["ci95"][0] < corrected["value"] < corrected["ci95"][1]
    text = _invoke("report", graded, "--audit", str(audit_path)).output
    assert "corrected accuracy 75.00%" in text


def test_audit_without_labels_is_an_error(tmp_path: Path):
    path = _write(tmp_path / "g.jsonl", [_row(1, True)])
    result = _invoke("audit", path)
    assert result.exit_code == 4
    assert "no row has a label" in result.output
