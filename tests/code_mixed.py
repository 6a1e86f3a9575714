"""A mixed file of math and code rollouts, built from tests/data and tests/data/code
(their sources are in those folders' READMEs): what the code-integration tests grade."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
CODE = DATA / "code"


def _jsonl(path: Path, count: int) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        lines = zip(range(count), handle, strict=False)
        return [json.loads(line) for _n, line in lines]


def math_rows(count: int = 12) -> list[dict[str, Any]]:
    """Qwen2.5-Math rollouts (`response` + `answer`), as the math tests use them."""
    return [
        {"id": f"math-{row['idx']}", "response": row["code"][0], "gold": row["answer"]}
        for row in _jsonl(DATA / "qwen25math_math_cot_100.jsonl", count)
    ]


def _humaneval_rows() -> list[dict[str, Any]]:
    rows = []
    for row in _jsonl(CODE / "mbpp_sanitized.jsonl", 4):
        body = textwrap.indent(textwrap.dedent(row["canonical_solution"]), "    ")
        problem = {k: row[k] for k in ("prompt", "entry_point", "test")}
        rows.append({"id": f"{row['task_id']}-ref", "response": body, **problem})
        rows.append(
            {"id": f"{row['task_id']}-none", "response": "    return None\n", **problem}
        )
    return rows


def _mbpp_rows() -> list[dict[str, Any]]:
    rows = []
    for row in _jsonl(CODE / "mbpp_samples.jsonl", 3):
        problem = {"test_list": row["test_list"], "labels": row["labels"]}
        right = f"```python\n{row['canonical_solution']}\n```"
        # pass@k: a list of samples, one right and one that exits before any test
        wrong = "```python\nimport os\nos._exit(0)\n```"
        rows.append({"id": f"mbpp-{row['id']}", "responses": [right, wrong], **problem})
    return rows


def _nemo_rows() -> list[dict[str, Any]]:
    rows = []
    for n, row in enumerate(_jsonl(CODE / "nemo_gym_code_gen_rollouts.jsonl", 3)):
        meta = row["metadata"]
        if "inputs" not in meta:  # a passing rollout keeps no test in its metadata
            continue
        tests = {"inputs": [meta["inputs"]], "outputs": [meta["expected"]]}
        rows.append(
            {
                "id": f"nemo-{n}",
                "response": row["extracted_model_output"],
                "verifier_metadata": {"unit_tests": tests},
            }
        )
    rows.append(
        {
            "id": "nemo-echo",
            "response": "```python\nprint(input())\n```",
            "verifier_metadata": {
                "unit_tests": {"inputs": ["7\n"], "outputs": ["7\n"]}
            },
        }
    )
    return rows


def _fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def hostile_rows() -> list[dict[str, Any]]:
    """Programs that must not pass: a sleeper (a timeout: never cached), a fake
    "passed" printer, a test reader."""
    tests = {"inputs": ["1\n"], "outputs": ["2\n"]}
    return [
        {
            "id": "hostile-sleep",
            "response": "```python\nimport time\ntime.sleep(30)\n```",
            "input_output": tests,
            "time_limit": 1,
        },
        {
            "id": "hostile-fake",
            "response": _fenced("print('all tests passed')\nraise SystemExit(0)"),
            "input_output": tests,
        },
        {
            "id": "hostile-read",
            "response": _fenced("import glob\nprint(glob.glob('/**', recursive=True))"),
            "input_output": tests,
        },
    ]


def invalid_rows() -> list[dict[str, Any]]:
    return [
        {
            "id": "invalid-counts",
            "response": "```python\nprint(1)\n```",
            "input_output": {"inputs": ["1\n", "2\n"], "outputs": ["1\n"]},
        },
        {"id": "invalid-none", "response": "def f():\n    return 1\n", "test_list": []},
    ]


def code_rows() -> list[dict[str, Any]]:
    return [
        *_humaneval_rows(),
        *_mbpp_rows(),
        *_nemo_rows(),
        *hostile_rows(),
        *invalid_rows(),
    ]


def mixed_rows() -> list[dict[str, Any]]:
    """Math and code rows interleaved (so batches mix the kinds)."""
    math, code = math_rows(), code_rows()
    mixed: list[dict[str, Any]] = []
    while math or code:
        mixed.extend(math[:1])
        mixed.extend(code[:2])
        math, code = math[1:], code[2:]
    return mixed


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text(
        "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), "utf-8"
    )
    return path
