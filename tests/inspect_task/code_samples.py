"""The code samples of the Inspect unit-test task: real problems from tests/data/code
(see its README), each with a recorded-style reply, in every test convention of
`producer.adapters.inspect.unit_tests` (metadata row, JSON target, test-code target).

Pure data (no Inspect import): the replay model reads the replies from here.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CODE = Path(__file__).resolve().parents[1] / "data" / "code"


@dataclass(frozen=True)
class CodeSample:
    sid: str
    question: str
    reply: str
    target: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    # What the scorer must say: "C", "I" or None (unscored: no usable tests).
    expected: str | None = "C"


def _jsonl(name: str, count: int) -> list[dict[str, Any]]:
    with (CODE / name).open(encoding="utf-8") as handle:
        return [
            json.loads(line) for _n, line in zip(range(count), handle, strict=False)
        ]


def _humaneval() -> list[CodeSample]:
    """HumanEval's layout, as inspect_evals keeps it: `prompt`, `test`, `entry_point`
    in the metadata, the test code as target; the reply completes the prompt."""
    out = []
    for row in _jsonl("mbpp_sanitized.jsonl", 2):
        body = textwrap.indent(textwrap.dedent(row["canonical_solution"]), "    ")
        meta = {k: row[k] for k in ("prompt", "entry_point", "test")}
        for tag, reply, expected in (
            ("ref", body, "C"),
            ("none", "    return None\n", "I"),
        ):
            out.append(
                CodeSample(
                    sid=f"{row['task_id']}-{tag}",
                    question=f"[{row['task_id']}-{tag}] {row['prompt']}",
                    reply=reply,
                    target=row["test"],
                    metadata=meta,
                    expected=expected,
                )
            )
    return out


def _mbpp() -> list[CodeSample]:
    """MBPP's `test_list` in the metadata; one right reply, one that exits early."""
    out = []
    for row in _jsonl("mbpp_samples.jsonl", 2):
        meta = {"test_list": row["test_list"], "labels": row["labels"]}
        right = f"```python\n{row['canonical_solution']}\n```"
        exits = "```python\nimport os\nos._exit(0)\n```"
        for tag, reply, expected in (("ref", right, "C"), ("exit", exits, "I")):
            out.append(
                CodeSample(
                    sid=f"mbpp-{row['id']}-{tag}",
                    question=f"[mbpp-{row['id']}-{tag}] {row['test_list'][0]}",
                    reply=reply,
                    metadata=meta,
                    expected=expected,
                )
            )
    return out


def _targets() -> list[CodeSample]:
    """Tests in the target: a JSON stdio spec, and the seed's assert script."""
    io = json.dumps(
        {"input_output": {"inputs": ["3\n", "10\n"], "outputs": ["4\n", "11\n"]}}
    )
    script = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"
    return [
        CodeSample(
            sid="io-right",
            question="Read n, print n + 1.",
            reply="```python\nprint(int(input()) + 1)\n```",
            target=io,
        ),
        CodeSample(
            sid="io-fake",
            question="Read n, print n + 1 (but claim success).",
            reply="```python\nprint('all tests passed')\nraise SystemExit(0)\n```",
            target=io,
            expected="I",
        ),
        CodeSample(
            sid="assert-right",
            question="Write add(a, b).",
            reply="Here it is:\n```python\ndef add(a, b):\n    return a + b\n```",
            target=script,
        ),
        CodeSample(
            sid="assert-wrong",
            question="Write add(a, b) (off by one).",
            reply="```python\ndef add(a, b):\n    return a + b + 1\n```",
            target=script,
            expected="I",
        ),
        CodeSample(
            sid="no-tests",
            question="Write anything (no tests).",
            reply="```python\nprint(1)\n```",
            expected=None,
        ),
    ]


def code_samples() -> list[CodeSample]:
    return [*_humaneval(), *_mbpp(), *_targets()]
