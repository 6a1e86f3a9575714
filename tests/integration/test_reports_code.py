"""`report`, `diff` and `audit` on a mixed math and code file graded by the real CLI
(`tests.code_reports`): grouped by kind and data source, one grader version per kind,
pass@k for code from `correct`, code flips and disagreements naming their first
failing test. Every expectation is computed here from the graded records.

These need the code sandbox (bubblewrap, root): without it they fail, never skip.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from producer.cli import cli
from tests.code_reports import grade, labeled_rows, write_jsonl

pytestmark = pytest.mark.integration

OLD_FIELDS = {
    "key", "n", "prompts", "correct", "accuracy", "stderr", "ci95", "clustered",
    "pass_at", "maj_at", "status_rates", "format_valid_rate", "samples_per_prompt",
}  # fmt: skip


@pytest.fixture(scope="module")
def graded(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[dict[str, Any]]]:
    assert shutil.which("bwrap"), "bubblewrap (bwrap) is not installed"
    folder = tmp_path_factory.mktemp("mixed")
    src = write_jsonl(folder / "mixed.jsonl", labeled_rows())
    out = folder / "graded.jsonl"
    return out, grade(src, out)


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def _json(*args: str) -> dict[str, Any]:
    result = _invoke(*args, "--json", "-")
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def _kind(record: dict[str, Any]) -> str:
    return record.get("kind") or "math"


def _by_prompt(records: list[dict[str, Any]]) -> list[list[bool]]:
    """Code rows' `correct` per prompt, keyed as `report` keys them here: the prompt
    text when the row has one, else its input line (the samples of one line)."""
    found: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        key = r.get("prompt") or f"line {r['gradefleet_line']}"
        found[key].append(r["correct"])
    return list(found.values())


def test_report_groups_a_mixed_file_by_kind_and_data_source(graded) -> None:
    path, records = graded
    # When the mixed file (a math and a code grader version) is reported
    report = _json("report", str(path))
    # Then it is not refused: one version per kind
    versions = {_kind(r): r["grader_version"] for r in records}
    assert report["grader_versions_by_kind"] == {k: [v] for k, v in versions.items()}
    assert report["grader_version"] == "mixed"
    assert report["schema"] == 1
    assert set(report["overall"]) >= OLD_FIELDS
    # And each kind's figures are its rows'
    kinds = {g["key"]["kind"]: g for g in report["kinds"]}
    assert sorted(kinds) == ["code", "math"]
    for kind, group in kinds.items():
        mine = [r for r in records if _kind(r) == kind]
        assert group["n"] == len(mine)
        assert group["correct"] == sum(r["correct"] for r in mine)
        assert set(group) >= OLD_FIELDS
    code = [r for r in records if _kind(r) == "code"]
    scored = [r["score"] for r in code if r["score"] is not None]
    assert kinds["code"]["test_score"] == pytest.approx(
        sum(scored) / len(scored), abs=1e-6
    )
    assert kinds["math"]["test_score"] is None
    failures: dict[str, int] = defaultdict(int)
    for r in code:
        if r["failure"]:
            failures[r["failure"]["kind"]] += 1
    assert kinds["code"]["failure_rates"] == {
        k: pytest.approx(n / len(code), abs=1e-6) for k, n in failures.items()
    }
    # And every (kind, data source) pair is a row of `sources`
    pairs = defaultdict(int)
    for r in records:
        pairs[(_kind(r), r["data_source"])] += 1
    assert {
        (g["key"]["kind"], g["key"]["data_source"]): g["n"] for g in report["sources"]
    } == pairs


def test_report_pass_at_k_for_code_counts_correct_and_maj_at_k_skips_code(
    graded,
) -> None:
    path, records = graded
    report = _json("report", str(path), "--k", "1,2")
    kinds = {g["key"]["kind"]: g for g in report["kinds"]}
    code = _by_prompt([r for r in records if _kind(r) == "code"])
    assert max(len(p) for p in code) == 2  # several samples per prompt
    # pass@1 = mean c/n; pass@2 over prompts with 2 samples = any correct
    pass1 = sum(sum(p) / len(p) for p in code) / len(code)
    twos = [p for p in code if len(p) == 2]
    assert kinds["code"]["pass_at"]["1"] == pytest.approx(pass1, abs=1e-6)
    assert kinds["code"]["pass_at"]["2"] == pytest.approx(
        sum(any(p) for p in twos) / len(twos), abs=1e-6
    )
    assert kinds["code"]["prompts"] == len(code)
    # Code has no canonical answers: no maj@k, and overall maj@1 is math's
    assert kinds["code"]["maj_at"] == {}
    assert report["overall"]["maj_at"]["1"] == kinds["math"]["maj_at"]["1"]
    # The terminal form shows both kinds, with tests%
    text = _invoke("report", str(path)).output
    assert "kind=code" in text
    assert "kind=math" in text
    assert "tests%" in text
    assert "kind=code, data_source=mbpp" in text


def test_report_still_refuses_two_versions_of_one_kind(graded, tmp_path) -> None:
    _path, records = graded
    regraded = [dict(r) for r in records]
    first_code = next(r for r in regraded if _kind(r) == "code")
    first_code["grader_version"] = first_code["grader_version"] + "-next"
    mixed = write_jsonl(tmp_path / "two.jsonl", regraded)
    result = _invoke("report", str(mixed))
    assert result.exit_code == 4
    assert "code rows graded by several grader versions" in result.output


def _variant(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same rollouts with a math gold and two code rows' tests changed."""
    out = []
    for row in rows:
        row = json.loads(json.dumps(row))
        if row["id"] == "math-0":
            row["gold"] = "421"  # was 420: correct -> wrong
        if row["id"] == "MbppEval/2-ref":  # a broken expected value: test 1 fails
            row["test"] = row["test"].replace("set((3, 4))", "set((3, 5))")
        if row["id"] == "invalid-counts":  # the counts mended: invalid -> correct
            row["input_output"] = {"inputs": ["1\n"], "outputs": ["1\n"]}
        out.append(row)
    return out


def test_diff_counts_kinds_and_names_the_first_failing_test(graded, tmp_path) -> None:
    path, records = graded
    src_b = write_jsonl(tmp_path / "b.jsonl", _variant(labeled_rows()))
    b_records = grade(src_b, tmp_path / "b-graded.jsonl")
    path_b = tmp_path / "b-graded.jsonl"
    # When the two gradings are diffed
    result = _invoke("diff", str(path), str(path_b))
    assert result.exit_code == 1, result.output
    data = _json("diff", str(path), str(path_b))
    # Then the flips are the three changed rows, each counted under its kind
    flips = {f["id"]: f for f in data["flips"]}
    assert set(flips) == {"math-0", "MbppEval/2-ref", "invalid-counts"}
    kinds = {k["key"]["kind"]: k for k in data["kinds"]}
    assert kinds["math"]["flipped"] == 1
    assert kinds["code"]["flipped"] == 2
    assert kinds["code"]["paired"] == sum(_kind(r) == "code" for r in records)
    assert kinds["code"]["correct_to_wrong"] == 1
    sources = {tuple(s["key"].values()): s for s in data["sources"]}
    assert sources[("code", "humaneval-style")]["flipped"] == 1
    assert sources[("math", "MATH")]["flipped"] == 1
    # And a code flip names B's first failing test, from B's graded row
    broken = flips["MbppEval/2-ref"]
    b_row = next(r for r in b_records if r["id"] == "MbppEval/2-ref")
    assert b_row["failure"]["index"] == 1
    assert broken["first_failure"]["a"] is None
    assert broken["first_failure"]["b"].startswith("test 1: wrong_answer")
    assert "set((3, 5))" in broken["first_failure"]["b"]
    assert broken["tests_passed"] == {"a": 3, "b": 2}
    assert flips["invalid-counts"]["direction"] == "invalid_gold→correct"
    assert "first_failure" not in flips["math-0"]
    assert "first failing test 1: wrong_answer" in result.output
    assert "kind=code" in result.output


def test_audit_per_kind_and_code_disagreements_name_their_test(graded) -> None:
    path, records = graded
    audit = _json("audit", str(path))
    kinds = {k["key"]["kind"]: k for k in audit["kinds"]}
    for kind, group in kinds.items():
        labeled = [
            r for r in records if _kind(r) == kind and isinstance(r.get("label"), bool)
        ]
        assert group["n"] == len(labeled)
        c = group["confusion"]
        assert c["tp"] == sum(r["label"] and r["correct"] for r in labeled)
        assert c["fn"] == sum(r["label"] and not r["correct"] for r in labeled)
        assert c["fp"] == sum(not r["label"] and r["correct"] for r in labeled)
    sources = {tuple(s["key"].values()) for s in audit["sources"]}
    assert ("code", "humaneval-style") in sources
    assert ("math", "MATH") in sources
    # A reference solution the grader calls wrong is a false negative with its test
    code_fn = [
        d
        for d in audit["disagreements"]
        if d["rollout_kind"] == "code" and d["kind"] == "false_negative"
    ]
    expected = [
        r["id"]
        for r in records
        if _kind(r) == "code" and r.get("label") is True and not r["correct"]
    ]
    # MbppEval/6-ref: tests.code_mixed indents the whole reference body under the
    # prompt's def, which nests its second def (differ_At_One_Bit_Pos): the grader
    # rightly fails it (NameError), and the "reference" label disagrees.
    assert expected
    assert [d["id"] for d in code_fn] == expected
    for d in code_fn:
        assert d["first_failure"].startswith("test ")
    # The terminal form too (a group without a label-correct row has no alpha)
    text = _invoke("audit", str(path))
    assert text.exit_code == 0, text.output
    assert "kind=code, data_source=adversarial: " in text.output
    assert "alpha=n/a (no rows)" in text.output
    assert f"false_negative: {expected[0]}" in text.output
    assert "    first failing test 0: " in text.output


def test_grade_with_report_on_a_mixed_file_reports_both_kinds(tmp_path) -> None:
    # `grade --report` used to stop with exit 4 on a mixed file (two versions)
    src = write_jsonl(tmp_path / "mixed.jsonl", labeled_rows(math_count=2))
    out, report_path = tmp_path / "graded.jsonl", tmp_path / "report.json"
    result = CliRunner().invoke(
        cli,
        [
            "grade",
            str(src),
            "-o",
            str(out),
            "--report",
            str(report_path),
            "-q",
            "--processes",
            "2",
        ],
        env={"GRADEFLEET_BROKER_URL": "", "GRADEFLEET_URL": ""},
    )
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {g["key"]["kind"]: g["n"] for g in report["kinds"]} == {
        "code": sum(_kind(r) == "code" for r in records),
        "math": 2,
    }
