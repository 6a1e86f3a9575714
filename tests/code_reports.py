"""Mixed math and code rollouts with data sources and trusted labels, graded by the
real CLI: what the report, diff and audit tests read (rows from `tests.code_mixed`).

Labels come from the data's own sources: a math row's is the Qwen grader's verdict
(`score[0]`), a code row's says whether the response is the data set's reference
solution (true) or a known-bad stand-in (false); NeMo Gym rollouts keep NeMo Gym's
reward. Rows with several samples (MBPP) carry no single label.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from producer.cli import cli
from tests.code_mixed import DATA, _jsonl, code_rows

ITEM_TIMEOUT_S = 30.0
TIMEOUT = ("--item-timeout-s", str(ITEM_TIMEOUT_S))


def _source(rid: str) -> str:
    for prefix, source in (
        ("MbppEval/", "humaneval-style"),
        ("mbpp-", "mbpp"),
        ("nemo-", "nemo_gym"),
    ):
        if rid.startswith(prefix):
            return source
    return "adversarial"


def _label(rid: str) -> bool | None:
    if rid.endswith("-ref") or rid == "nemo-echo":
        return True
    if rid.startswith(("hostile-", "nemo-")) or rid.endswith("-none"):
        return False  # NeMo Gym's own reward was 0.0 for nemo-0 and nemo-2
    return None


def labeled_rows(math_count: int = 8) -> list[dict[str, Any]]:
    """Math rows then code rows, interleaved, each with `data_source` and a label."""
    math = [
        {
            "id": f"math-{row['idx']}",
            "response": row["code"][0],
            "gold": row["answer"],
            "data_source": "MATH",
            "label": row["score"][0],
        }
        for row in _jsonl(DATA / "qwen25math_math_cot_100.jsonl", math_count)
    ]
    code = []
    for row in code_rows():
        label = _label(row["id"])
        extra = {} if label is None or "responses" in row else {"label": label}
        code.append({**row, "data_source": _source(row["id"]), **extra})
    mixed: list[dict[str, Any]] = []
    while math or code:
        mixed += math[:1] + code[:2]
        math, code = math[1:], code[2:]
    return mixed


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def grade(src: Path, out: Path) -> list[dict[str, Any]]:
    """`gradefleet grade SRC -o OUT` embedded; the graded records."""
    result = CliRunner().invoke(
        cli,
        [*("grade", str(src), "-o", str(out), "--processes", "2"), *TIMEOUT],
        env={"GRADEFLEET_BROKER_URL": "", "GRADEFLEET_URL": ""},
    )
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in out.read_text("utf-8").splitlines()]
