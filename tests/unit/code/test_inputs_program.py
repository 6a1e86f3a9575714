"""Finding the program in a response: fences, HumanEval completions, MBPP indentation.

Nothing here may run the code: an audit hook records any exec or process spawn while
the extraction runs, and payloads try to leave a file behind.
"""

from __future__ import annotations

import ast
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.code.program import (
    MAX_PROGRAM_CHARS,
    MAX_RESPONSE_CHARS,
    extract_program,
    parse_tree,
    parses,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "code"
HE_PROMPT = (
    'from typing import List\n\n\ndef add(a: int, b: int) -> int:\n    """Sum."""\n'
)


def rows(name: str) -> list[dict[str, Any]]:
    with (DATA / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


# ------------------------------------------------------------------------ fences

FENCES: dict[str, tuple[str, str | None]] = {
    "python fence": ("Here:\n```python\nprint(1)\n```\nDone.", "print(1)\n"),
    "py fence": ("```py\nx = 1\n```", "x = 1\n"),
    "Python3 fence": ("```Python3\nx = 3\n```", "x = 3\n"),
    "info string with attributes": ('```python title="a.py"\nx = 1\n```', "x = 1\n"),
    "last of several python blocks": (
        "```python\nx = 1\n```\nbetter:\n```python\nx = 2\n```",
        "x = 2\n",
    ),
    "python block wins over a later bare sample output": (
        "```python\nprint(input())\n```\nOutput:\n```\n3 4\n```",
        "print(input())\n",
    ),
    "bare block when there is no python block": ("```\nx = 1\n```", "x = 1\n"),
    "bare block that parses wins over a later one that does not": (
        "```\nprint(2)\n```\nSample:\n```\n1 2 3\n```",
        "print(2)\n",
    ),
    "other languages skipped": (
        "```python\nx = 1\n```\n```cpp\nint main() {}\n```",
        "x = 1\n",
    ),
    "only another language: no program": ("```cpp\nint main() {}\n```", None),
    "longer fence holds a shorter one": (
        "````python\ns = '''\n```\n'''\n````",
        "s = '''\n```\n'''\n",
    ),
    "indented fence in a list item": (
        "1. Code:\n   ```python\n   def f():\n       return 1\n   ```",
        "def f():\n    return 1\n",
    ),
    "windows line ends": ("```python\r\nx = 1\r\n```\r\n", "x = 1\r\n"),
    "unclosed final fence that parses": (
        "```python\nprint(1)\nprint(2)",
        "print(1)\nprint(2)\n",
    ),
    "unclosed final fence that does not parse falls back": (
        "```python\nx = 1\n```\nnow:\n```python\nprint(1",
        "x = 1\n",
    ),
    "fenced code that does not parse is still the program": (
        "```python\ndef f(:\n```",
        "def f(:\n",
    ),
    "no fence, the response parses": (
        "import sys\nprint(2)\n",
        "import sys\nprint(2)\n",
    ),
    "no fence, prose": ("I think the answer is to loop over it.", None),
    "empty response": ("", None),
    "whitespace response": ("  \n\n ", None),
    "empty fence": ("```python\n```", None),
    "think block then code": (
        "<think>\nmaybe\n```python\nx = 0\n```\n</think>\n```python\nx = 1\n```",
        "x = 1\n",
    ),
}


@pytest.mark.parametrize("name", list(FENCES))
def test_fenced_blocks(name: str) -> None:
    response, expected = FENCES[name]
    assert extract_program(response, None, None) == expected


# ------------------------------------------------------------ HumanEval / MBPP


def test_completion_body_is_appended_to_the_prompt() -> None:
    program = extract_program("    return a + b\n", HE_PROMPT, "add")
    assert program == HE_PROMPT + "    return a + b\n"


def test_mbpp_two_space_body_is_reindented() -> None:
    prompt = "def f(x):\n    '''Double.'''\n"
    program = extract_program("  y = 2 * x\n  return y\n", prompt, "f")
    assert program == prompt + "    y = 2 * x\n    return y\n"


def test_fenced_function_defining_the_entry_point_keeps_the_prompt_before_it() -> None:
    response = "```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```"
    program = extract_program(response, HE_PROMPT, "add")
    assert program is not None
    assert program.startswith("from typing import List")
    tree = ast.parse(program)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [d.name for d in defs] == ["add", "add"]  # the model's def comes last
    assert isinstance(defs[-1].body[0], ast.Return)


def test_prompt_helpers_stay_available() -> None:
    prompt = (
        "def helper(x):\n    return x + 1\n\n\ndef main(x):\n    '''Use helper.'''\n"
    )
    response = "```python\ndef main(x):\n    return helper(x) * 2\n```"
    program = extract_program(response, prompt, "main")
    assert program is not None
    assert "def helper" in program


def test_fenced_body_without_the_def_is_completed() -> None:
    response = "```python\n    return a + b\n```"
    assert extract_program(response, HE_PROMPT, "add") == HE_PROMPT + (
        "    return a + b\n"
    )


def test_a_chat_prompt_is_not_prepended() -> None:
    prompt = "Write a function add(a, b) that returns the sum. Use Python."
    response = "```python\ndef add(a, b):\n    return a + b\n```"
    assert extract_program(response, prompt, "add") == (
        "def add(a, b):\n    return a + b\n"
    )
    other = "```python\ndef plus(a, b):\n    return a + b\n```"
    assert (
        extract_program(other, prompt, "add") == "def plus(a, b):\n    return a + b\n"
    )


def test_entry_point_found_by_class_assignment_or_import() -> None:
    for code in (
        "class add:\n    pass\n",
        "add = lambda a, b: a + b\n",
        "from operator import add\n",
        "from operator import iadd as add\n",
        "add: object = sum\n",
    ):
        program = extract_program(f"```python\n{code}```", HE_PROMPT, "add")
        assert program is not None
        assert program.endswith(code)
        assert program.startswith("from typing import List")


@pytest.mark.parametrize(
    "tail",
    [
        "\nThis function adds the two numbers.\n",
        "\n```\n\nExplanation: it adds them.",
        "\n</code>\n",
        "\nprint(add(1, 2)  # a broken example\n",
    ],
)
def test_untruncated_completion_is_cut_before_trailing_text(tail: str) -> None:
    program = extract_program("    return a + b\n" + tail, HE_PROMPT, "add")
    assert program == HE_PROMPT + "    return a + b\n"


def test_a_completion_that_parses_whole_is_not_cut() -> None:
    body = "    return helper(a) + b\n\n\ndef helper(x):\n    return x\n"
    assert extract_program(body, HE_PROMPT, "add") == HE_PROMPT + body


def test_prose_after_a_prompt_is_no_answer() -> None:
    assert extract_program("Sorry, I cannot do that.", HE_PROMPT, "add") is None


def test_mbpp_sanitized_reference_bodies_all_give_parsing_programs() -> None:
    data = rows("mbpp_sanitized.jsonl")
    for row in data:
        entry = row["entry_point"].strip()
        program = extract_program(row["canonical_solution"], row["prompt"], entry)
        assert program is not None, row["task_id"]
        assert parses(program), row["task_id"]
        assert program.startswith(row["prompt"])
        tree = parse_tree(program)
        assert tree is not None
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert entry in names


def test_mbpp_sanitized_return_none_bodies_give_programs_too() -> None:
    for row in rows("mbpp_sanitized.jsonl"):
        program = extract_program(
            "    return None\n", row["prompt"], row["entry_point"].strip()
        )
        assert program == row["prompt"] + "    return None\n"


def test_mbpp_rough_reindent_cases() -> None:
    data = {row["task_id"]: row for row in rows("mbpp_sanitized.jsonl")}
    # Tabs, an odd first line, helper defs after the body.
    for task in ("MbppEval/18", "MbppEval/70", "MbppEval/164"):
        row = data[task]
        program = extract_program(
            row["canonical_solution"], row["prompt"], row["entry_point"].strip()
        )
        assert program is not None
        assert parses(program)


def test_nemo_gym_rollouts_extract_what_nemo_gym_extracted() -> None:
    for rollout in rows("nemo_gym_code_gen_rollouts.jsonl"):
        text = rollout["response"]["output"][-1]["content"][0]["text"]
        program = extract_program(text, None, None)
        assert program is not None
        assert program.rstrip("\n") == rollout["extracted_model_code"].rstrip("\n")


# ----------------------------------------------------------------- bounds, safety


def test_code_the_parser_warns_about_still_parses() -> None:
    # Under pytest's "error" warnings filter, as in any strict deployment.
    code = 'import re\nprint(re.match("\\w+", "a") is not None, 1 is 1)\n'
    assert parses(code)
    assert extract_program(code, None, None) == code


def test_program_over_the_bound_is_no_answer() -> None:
    big = "x = 1\n" * (MAX_PROGRAM_CHARS // 6 + 1)
    assert extract_program(f"```python\n{big}```", None, None) is None
    assert extract_program(big, None, None) is None


def test_huge_responses_are_read_from_their_end_quickly() -> None:
    filler = "word " * (MAX_RESPONSE_CHARS // 5 + 1000)
    start = time.process_time()
    assert extract_program(filler + "\n```python\nx = 1\n```", None, None) == "x = 1\n"
    fences = "```\n(\n```\n" * 200_000  # many blocks, none parsing
    assert extract_program(fences, None, None) == "(\n"
    nested = "```python\n" + "(" * 100_000 + "\n```"
    assert extract_program(nested, None, None) is not None  # returned, not parsed ok
    assert time.process_time() - start < 10.0


@pytest.fixture
def audit() -> Iterator[list[str]]:
    """Exec of code that is not a module file on disk (an import execs its module's
    code; model text would be compiled from a string), and process spawns."""
    events: list[str] = []
    spawns = {"os.system", "subprocess.Popen", "os.posix_spawn", "os.fork"}

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if not active:
            return
        if event == "exec":
            filename = str(getattr(args[0], "co_filename", "<?>"))
            if not Path(filename).is_file():
                events.append(f"exec {filename}")
        elif event in spawns or event.startswith("os.exec"):
            events.append(event)

    active = True
    sys.addaudithook(hook)  # hooks cannot be removed; `active` turns it off
    yield events
    active = False


def test_extraction_runs_nothing(audit: list[str], tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    payloads = [
        f"```python\nopen({str(canary)!r}, 'w').write('x')\n```",
        f"import os\nos.system('touch {canary}')\n",
        f"```python\nimport os\nos.system('touch {canary}')\n```",
        f"    open({str(canary)!r}, 'w')\n",
    ]
    for payload in payloads:
        extract_program(payload, HE_PROMPT, "add")
        extract_program(payload, None, None)
    assert audit == []
    assert not canary.exists()


_PIECES = st.sampled_from(
    ["```", "```python", "```py", "```\n", "\n", "    ", "  ", "\t", "def f(x):",
     "return x", "print(1)", "(", ")", "'''", '"', "\\", "\x00", "\r", "é", "\u2028",
     "<think>", "x = 1", ":", "class Solution:"]
)  # fmt: skip


@given(
    st.lists(_PIECES | st.text(max_size=5), max_size=30).map("".join),
    st.sampled_from([None, HE_PROMPT, "def f(x):\n  '''d'''\n", "Solve it."]),
    st.sampled_from([None, "add", "f"]),
)
def test_any_text_gives_a_program_or_none(
    response: str, prompt: str | None, entry_point: str | None
) -> None:
    program = extract_program(response, prompt, entry_point)
    assert program is None or (program.strip() and len(program) <= MAX_PROGRAM_CHARS)
