"""Reading a row's tests: each shipped data file, each documented shape, bad rows.

Data: tests/data/code/ (see its README for sources). Counts below were read off the
files; a parse that drops or invents a test changes them.
"""

from __future__ import annotations

import ast
import base64
import json
import pickle
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.code.errors import CodeGraderError, InvalidTestsError
from workers.code.suite import (
    MAX_TESTS,
    AssertCase,
    CallCase,
    StdioCase,
    TestSuite,
    is_code_row,
    parse_suite,
    suite_key,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "code"


def rows(name: str) -> list[dict[str, Any]]:
    with (DATA / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def packed(value: Any) -> str:
    """LiveCodeBench's encoding: base64(zlib(pickle(value)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(value))).decode()


# ------------------------------------------------------------------- data files


def test_mbpp_sanitized_humaneval_format() -> None:
    data = rows("mbpp_sanitized.jsonl")
    suites = [parse_suite(row) for row in data]
    assert len(suites) == 427
    assert {s.mode for s in suites} == {"assert"}
    assert sum(len(s) for s in suites) == 1322
    for row, suite in zip(data, suites, strict=True):
        entry = row["entry_point"].strip()  # two rows carry a trailing space
        assert suite.entry_point == entry
        for case in suite.asserts:
            tree = ast.parse(case.source)
            last = tree.body[-1]
            assert isinstance(last, ast.Expr)
            assert ast.unparse(last) == f"check({entry})"
            assert sum(isinstance(n, ast.Assert) for n in ast.walk(tree)) >= 1
        assert suite.program_names[0] == entry
    # Checks made of plain asserts are split one case per assert, keeping each assert.
    asserts_in_data = sum(row["test"].count("assert ") for row in data)
    asserts_in_cases = sum(c.source.count("assert ") for s in suites for c in s.asserts)
    assert asserts_in_cases == asserts_in_data


def test_mbpp_sanitized_tests_calling_other_program_functions() -> None:
    # The HumanEval way ran the test in the program's namespace: some tests call a
    # function of the reference other than the entry point; the harness must bind it.
    data = {row["task_id"]: row for row in rows("mbpp_sanitized.jsonl")}
    suite = parse_suite(data["MbppEval/6"])  # entry_point "is_Power_Of_Two "
    assert suite.program_names == ("is_Power_Of_Two", "differ_At_One_Bit_Pos")
    assert len(suite) == 6
    others = [r for r in data.values() if len(parse_suite(r).program_names) > 1]
    assert len(others) == 10
    # `def sum` in the program shadows the builtin the test calls: still split.
    assert parse_suite(data["MbppEval/126"]).program_names == ("sum",)
    assert len(parse_suite(data["MbppEval/126"])) == 3
    # The program's `check` collides with the test's own: kept whole (it cannot pass
    # the HumanEval way either).
    assert len(parse_suite(data["MbppEval/56"])) == 1


def test_mbpp_sanitized_prompt_imports_become_setup_code() -> None:
    data = {row["task_id"]: row for row in rows("mbpp_sanitized.jsonl")}
    suite = parse_suite(data["MbppEval/3"])  # prompt: "import math\ndef is_not_prime"
    assert suite.setup_code == "import math\n"
    assert parse_suite(data["MbppEval/2"]).setup_code == ""
    with_imports = [r for r in data.values() if parse_suite(r).setup_code]
    for row in with_imports:
        for line in parse_suite(row).setup_code.splitlines():
            assert line.startswith(("import ", "from "))
            # From the prompt, or a stdlib module the test reads without importing
            # (it ran in the program's namespace, where the program imported it).
            assert line in row["prompt"] or line.split()[1] in row["test"]
    # MbppEval/98's test reads math.isclose; its prompt imports nothing.
    multiply = next(r for r in data.values() if r["entry_point"] == "multiply_num")
    assert parse_suite(multiply).setup_code == "import math\n"


def test_mbpp_split_case_keeps_one_assert_and_the_module() -> None:
    row = rows("mbpp_sanitized.jsonl")[0]  # MbppEval/2: three asserts
    suite = parse_suite(row)
    assert len(suite) == 3
    assert suite.asserts[1].source == (
        "def check(candidate):\n"
        "    assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))\n"
        "\ncheck(similar_elements)\n"
    )


def test_mbpp_samples_test_list_format() -> None:
    data = rows("mbpp_samples.jsonl")
    suites = [parse_suite(row) for row in data]
    assert len(suites) == 20
    assert {s.mode for s in suites} == {"assert"}
    assert [len(s) for s in suites] == [3] * 20
    for row, suite in zip(data, suites, strict=True):
        assert [c.source for c in suite.asserts] == row["test_list"]
        defined = {
            n.name
            for n in ast.walk(ast.parse(row["canonical_solution"]))
            if isinstance(n, ast.FunctionDef)
        }
        assert suite.entry_point in defined
        assert suite.setup_code == row["labels"]["test_setup_code"]
        assert suite.program_names == (suite.entry_point,)


def test_codecontests_samples_sandboxfusion_test_field() -> None:
    data = rows("codecontests_samples.jsonl")
    suites = [parse_suite(row) for row in data]
    assert len(suites) == 20
    assert {s.mode for s in suites} == {"stdio"}
    assert sum(len(s) for s in suites) == 2233
    first = suites[0].stdio[0]
    assert first.stdin.startswith("3\n2\n< 100 No\n")
    assert first.expected_stdout == "0\n1\n2\n"
    for row, suite in zip(data, suites, strict=True):
        raw = json.loads(row["test"])
        assert [c.stdin for c in suite.stdio] == [t["input"]["stdin"] for t in raw]


def test_livecodebench_samples_pickled_tests() -> None:
    suites = [parse_suite(row) for row in rows("livecodebench_samples.jsonl")]
    assert [(s.mode, len(s)) for s in suites] == [
        ("stdio", 5),
        ("call", 14),
        ("stdio", 15),
    ]
    assert suites[0].stdio[1] == StdioCase(stdin="1\nabc\n", expected_stdout="YES\n")
    call = suites[1]
    assert call.fn_name == "countSeniors"
    assert call.calls[0] == CallCase(
        args=(["7868190130M7522", "5303914400F9211", "9273338290F4010"],), expected=2
    )
    assert call.calls[1].expected == 0


def test_nemo_gym_unit_tests() -> None:
    suites = [parse_suite(row) for row in rows("nemo_gym_code_gen_problems.jsonl")]
    assert [(s.mode, len(s)) for s in suites] == [
        ("stdio", 1),
        ("stdio", 97),
        ("stdio", 100),
        ("stdio", 82),
        ("stdio", 3),
    ]


def test_nemo_gym_rollouts_match_their_problems() -> None:
    problems = {
        row["responses_create_params"]["input"][0]["content"]: row
        for row in rows("nemo_gym_code_gen_problems.jsonl")
    }
    for rollout in rows("nemo_gym_code_gen_rollouts.jsonl"):
        problem = problems[rollout["responses_create_params"]["input"][0]["content"]]
        suite = parse_suite(problem)
        # NeMo Gym stops at the first failure: its result list is a prefix.
        assert len(rollout["result"]) <= len(suite)
        if rollout["reward"] == 1.0:
            assert len(rollout["result"]) == len(suite)


@pytest.mark.parametrize(
    "name",
    [
        "mbpp_sanitized.jsonl",
        "mbpp_samples.jsonl",
        "codecontests_samples.jsonl",
        "livecodebench_samples.jsonl",
        "nemo_gym_code_gen_problems.jsonl",
    ],
)
def test_every_data_row_is_a_code_row_with_a_stable_key(name: str) -> None:
    for row in rows(name):
        assert is_code_row(row)
        key = suite_key(parse_suite(row))
        assert key == suite_key(parse_suite(json.loads(json.dumps(row))))
        json.loads(key)


# --------------------------------------------------------------- documented shapes

STDIO_IO = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}
STDIO_CASES = (
    StdioCase(stdin="1 2\n", expected_stdout="3\n"),
    StdioCase(stdin="3 4\n", expected_stdout="7\n"),
)
LCB_CALL = {"inputs": ["[1, 2]\n3", '"a"'], "outputs": ["[3]", '"b"'], "fn_name": "f"}
LCB_CALLS = (
    CallCase(args=([1, 2], 3), expected=[3]),
    CallCase(args=("a",), expected="b"),
)

LOOP_CHECK = (
    "def check(candidate):\n    for i in range(3):\n        assert candidate(i) == i\n"
)
HEAD = "METADATA = {}\n\n\ndef check(candidate):\n    '''doc'''\n"
ASSERT_1 = "    assert candidate(1) == 1\n"
ASSERT_2 = "    assert candidate(\n        2\n    ) == 2\n"

SHAPES: dict[str, tuple[dict[str, Any], TestSuite]] = {
    "APPS input_output object": (
        {"input_output": STDIO_IO},
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "APPS input_output JSON text": (
        {"input_output": json.dumps(STDIO_IO)},
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "APPS lists of lines are joined": (
        {"input_output": {"inputs": [["1 2", "x"]], "outputs": [["3", "y"]]}},
        TestSuite(
            mode="stdio", stdio=(StdioCase(stdin="1 2\nx", expected_stdout="3\ny"),)
        ),
    ),
    "APPS call-based, outputs wrapped in a list": (
        {
            "input_output": {
                "fn_name": "add",
                "inputs": [[1, 2], [[1], 0]],
                "outputs": [[3], [[1, 2]]],
            }
        },
        TestSuite(
            mode="call",
            fn_name="add",
            calls=(
                CallCase(args=(1, 2), expected=[3], also_expected=(3,)),
                CallCase(args=([1], 0), expected=[[1, 2]], also_expected=([1, 2],)),
            ),
        ),
    ),
    "APPS call-based, unwrapped output": (
        {"input_output": {"fn_name": "g", "inputs": [["ab"]], "outputs": ["ba"]}},
        TestSuite(
            mode="call", fn_name="g", calls=(CallCase(args=("ab",), expected="ba"),)
        ),
    ),
    "LiveCodeBench-style call in input_output": (
        {"input_output": LCB_CALL},
        TestSuite(mode="call", fn_name="f", calls=LCB_CALLS),
    ),
    "tests field": (
        {"tests": json.dumps(STDIO_IO)},
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "tests as a list of input/output objects": (
        {
            "tests": [
                {"input": "1 2\n", "output": "3\n"},
                {"input": "3 4\n", "output": "7\n"},
            ]
        },
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "NeMo Gym verifier_metadata.unit_tests": (
        {"verifier_metadata": {"unit_tests": STDIO_IO}},
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "verl reward_model.ground_truth JSON text": (
        {"reward_model": {"ground_truth": json.dumps(STDIO_IO), "style": "rule"}},
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "verl ground_truth with fn_name": (
        {"reward_model": {"ground_truth": json.dumps(LCB_CALL)}},
        TestSuite(mode="call", fn_name="f", calls=LCB_CALLS),
    ),
    "verl assert_case": (
        {
            "reward_model": {
                "ground_truth": json.dumps(
                    {"assert_case": ["assert f(1) == 2", "assert f(2) == 3"]}
                )
            }
        },
        TestSuite(
            mode="assert",
            asserts=(
                AssertCase(source="assert f(1) == 2"),
                AssertCase(source="assert f(2) == 3"),
            ),
            entry_point="f",
            program_names=("f",),
        ),
    ),
    "verl assert_case beside empty inputs/outputs": (
        {
            "ground_truth": {
                "inputs": ["", ""],
                "outputs": [None, ""],
                "assert_case": ["assert f(1) == 2", "assert f(0) == 1"],
            }
        },
        TestSuite(
            mode="assert",
            asserts=(
                AssertCase(source="assert f(1) == 2"),
                AssertCase(source="assert f(0) == 1"),
            ),
            entry_point="f",
            program_names=("f",),
        ),
    ),
    "PrimeIntellect verification_info": (
        {
            "verification_info": json.dumps(
                {
                    "language": "python",
                    "test_cases": [
                        {
                            "input": "1 2\n",
                            "output": "3\n",
                            "type": "stdin_stdout",
                            "fn_name": None,
                        },
                        {
                            "input": "3 4\n",
                            "output": "7\n",
                            "type": "stdin_stdout",
                            "fn_name": None,
                        },
                    ],
                }
            )
        },
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "PrimeIntellect function_call": (
        {
            "verification_info": {
                "test_cases": [
                    {
                        "input": "[1, 2]\n3",
                        "output": "[3]",
                        "type": "function_call",
                        "fn_name": "f",
                    },
                    {
                        "input": '"a"',
                        "output": '"b"',
                        "type": "function_call",
                        "fn_name": "f",
                    },
                ]
            }
        },
        TestSuite(mode="call", fn_name="f", calls=LCB_CALLS),
    ),
    "CodeContests public/private/generated joined": (
        {
            "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
            "private_tests": {"input": [], "output": []},
            "generated_tests": {"input": ["3 4\n"], "output": ["7\n"]},
        },
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "LiveCodeBench native, private pickled": (
        {
            "public_test_cases": json.dumps(
                [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
            ),
            "private_test_cases": packed(
                json.dumps([{"input": "3 4\n", "output": "7\n", "testtype": "stdin"}])
            ),
            "metadata": "{}",
        },
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "LiveCodeBench native functional": (
        {
            "public_test_cases": json.dumps(
                [{"input": "[1, 2]\n3", "output": "[3]", "testtype": "functional"}]
            ),
            "private_test_cases": packed(
                json.dumps(
                    [{"input": '"a"', "output": '"b"', "testtype": "functional"}]
                )
            ),
            "metadata": json.dumps({"func_name": "f"}),
        },
        TestSuite(mode="call", fn_name="f", calls=LCB_CALLS),
    ),
    "SandboxFusion test list": (
        {
            "test": json.dumps(
                [
                    {"input": {"stdin": "1 2\n"}, "output": {"stdout": "3\n"}},
                    {"input": {"stdin": "3 4\n"}, "output": {"stdout": "7\n"}},
                ]
            )
        },
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "SandboxFusion pickled input_output": (
        {"test": packed({"input_output": json.dumps(STDIO_IO)})},
        TestSuite(mode="stdio", stdio=STDIO_CASES),
    ),
    "HumanEval test + entry_point, check with a loop stays whole": (
        {
            "test": LOOP_CHECK,
            "entry_point": "ident",
        },
        TestSuite(
            mode="assert",
            asserts=(AssertCase(source=LOOP_CHECK + "\ncheck(ident)\n"),),
            entry_point="ident",
            program_names=("ident",),
        ),
    ),
    "HumanEval METADATA and a docstring kept around the split asserts": (
        {
            "test": HEAD + ASSERT_1 + ASSERT_2,
            "entry_point": "ident",
            "prompt": "from typing import List\nimport math\ndef ident(x):\n    pass\n",
        },
        TestSuite(
            mode="assert",
            asserts=(
                AssertCase(source=HEAD + ASSERT_1 + "\ncheck(ident)\n"),
                AssertCase(source=HEAD + ASSERT_2 + "\ncheck(ident)\n"),
            ),
            entry_point="ident",
            program_names=("ident",),
            setup_code="from typing import List\nimport math\n",
        ),
    ),
    "MBPP test_list JSON text with top-level setup code": (
        {
            "test_list": json.dumps(["assert f(1) == 2", "assert len(f(2)) == 3"]),
            "test_setup_code": "import math",
        },
        TestSuite(
            mode="assert",
            asserts=(
                AssertCase(source="assert f(1) == 2"),
                AssertCase(source="assert len(f(2)) == 3"),
            ),
            entry_point="f",
            program_names=("f",),
            setup_code="import math",
        ),
    ),
    "MBPP: a function the setup code defines is not the entry point": (
        {
            "test_list": ["assert helper(f(1)) == 2"],
            "labels": {"test_setup_code": "def helper(x):\n    return x\n"},
        },
        TestSuite(
            mode="assert",
            asserts=(AssertCase(source="assert helper(f(1)) == 2"),),
            entry_point="f",
            program_names=("f",),
            setup_code="def helper(x):\n    return x\n",
        ),
    ),
    "program functions and stdlib modules the tests read": (
        {"test_list": ["assert f(1) == helper(2)", "assert math.isclose(f(0.5), 1)"]},
        TestSuite(
            mode="assert",
            asserts=(
                AssertCase(source="assert f(1) == helper(2)"),
                AssertCase(source="assert math.isclose(f(0.5), 1)"),
            ),
            entry_point="f",
            program_names=("f", "helper"),
            setup_code="import math\n",
        ),
    ),
    "DeepCoder tests list with metadata.func_name": (
        {
            "tests": json.dumps(
                [
                    {"input": "[1, 2]\n3", "output": "[3]", "testtype": "functional"},
                    {"input": '"a"', "output": '"b"', "testtype": "functional"},
                ]
            ),
            "metadata": {"func_name": "f"},
        },
        TestSuite(mode="call", fn_name="f", calls=LCB_CALLS),
    ),
    "input_output with the row's fn_name": (
        {
            "input_output": {
                "inputs": LCB_CALL["inputs"],
                "outputs": LCB_CALL["outputs"],
            },
            "fn_name": "f",
        },
        TestSuite(mode="call", fn_name="f", calls=LCB_CALLS),
    ),
    "tests as HumanEval code": (
        {"tests": LOOP_CHECK, "metadata": {"entry_point": "ident"}},
        TestSuite(
            mode="assert",
            asserts=(AssertCase(source=LOOP_CHECK + "\ncheck(ident)\n"),),
            entry_point="ident",
            program_names=("ident",),
        ),
    ),
    "open-r1 Codeforces official_tests": (
        {
            "official_tests": [
                {"input": "1 2\n", "output": "3\n"},
                {"input": "3 4\n", "output": "7\n"},
            ],
            "time_limit": 2.0,
            "memory_limit": 256,
        },
        TestSuite(
            mode="stdio",
            stdio=STDIO_CASES,
            time_limit_s=2.0,
            memory_limit_bytes=256 << 20,
        ),
    ),
    "top-level assert_case string": (
        {"assert_case": "assert f(1) == 2\nassert f(2) == 3"},
        TestSuite(
            mode="assert",
            asserts=(AssertCase(source="assert f(1) == 2\nassert f(2) == 3"),),
            entry_point="f",
            program_names=("f",),
        ),
    ),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_documented_shapes(name: str) -> None:
    row, expected = SHAPES[name]
    assert is_code_row(row)
    assert parse_suite(row) == expected


def test_split_keeps_odd_line_breaks_inside_strings() -> None:
    test = (
        "def check(candidate):\n"
        "    assert candidate('a\u2028b\x0cc') == 1\n"
        "    assert candidate('x') == 2\n"
    )
    suite = parse_suite({"test": test, "entry_point": "f"})
    head = "def check(candidate):\n"
    assert [c.source for c in suite.asserts] == [
        head + "    assert candidate('a\u2028b\x0cc') == 1\n\ncheck(f)\n",
        head + "    assert candidate('x') == 2\n\ncheck(f)\n",
    ]


def test_humaneval_debug_asserts_are_left_out_of_the_split() -> None:
    test = (
        "def check(candidate):\n"
        "    assert True, 'This prints if this assert fails 1'\n"
        "    assert candidate(1) == 1\n"
        "    assert candidate(2) == 2\n"
        "    assert True\n"
    )
    suite = parse_suite({"test": test, "entry_point": "f"})
    assert len(suite) == 2
    assert all("assert True" not in c.source for c in suite.asserts)


def test_first_shape_wins_in_documented_order() -> None:
    row = {
        "input_output": STDIO_IO,
        "test_list": ["assert f(1) == 2"],
        "public_tests": {"input": ["x"], "output": ["y"]},
    }
    assert parse_suite(row).mode == "stdio"
    assert len(parse_suite(row)) == 2


# --------------------------------------------------------------------- limits


@pytest.mark.parametrize(
    ("fields", "time_limit_s", "memory_limit_bytes", "float_tol"),
    [
        ({}, None, None, None),
        ({"time_limit": 2}, 2.0, None, None),
        ({"time_limit": "2 seconds"}, 2.0, None, None),
        ({"time_limit": "1.5s"}, 1.5, None, None),
        ({"time_limit": "500 ms"}, 0.5, None, None),
        ({"time_limit": {"seconds": 1, "nanos": 500_000_000}}, 1.5, None, None),
        ({"time_limit_s": 3.0}, 3.0, None, None),
        ({"memory_limit": 256}, None, 256 << 20, None),
        ({"memory_limit": "256 megabytes"}, None, 256 << 20, None),
        ({"memory_limit": "1 GB"}, None, 1 << 30, None),
        ({"memory_limit_mb": 64}, None, 64 << 20, None),
        ({"memory_limit_bytes": 1000}, None, 1000, None),
        ({"float_tol": 1e-6}, None, None, 1e-6),
        ({"atol": 0.01}, None, None, 0.01),
        ({"abs_tol": 0.5}, None, None, 0.5),
        ({"tolerance": 1e-9}, None, None, 1e-9),
    ],
)
def test_row_limits(
    fields: dict[str, Any],
    time_limit_s: float | None,
    memory_limit_bytes: int | None,
    float_tol: float | None,
) -> None:
    suite = parse_suite({"input_output": STDIO_IO, **fields})
    assert suite.time_limit_s == time_limit_s
    assert suite.memory_limit_bytes == memory_limit_bytes
    assert suite.float_tol == float_tol


@pytest.mark.parametrize(
    "fields",
    [
        {"time_limit": -1},
        {"time_limit": 0},
        {"time_limit": "soon"},
        {"time_limit": "2 parsecs"},
        {"time_limit": True},
        {"time_limit": float("nan")},
        {"time_limit": {"seconds": "x"}},
        {"memory_limit": "lots"},
        {"memory_limit_bytes": -5},
        {"float_tol": 0},
        {"float_tol": "1e-6"},
        {"float_tol": float("inf")},
    ],
)
def test_unusable_limits_are_invalid(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidTestsError):
        parse_suite({"input_output": STDIO_IO, **fields})


# ------------------------------------------------------------------- malformed

MALFORMED: dict[str, dict[str, Any]] = {
    "no tests at all": {"prompt": "x", "response": "y"},
    "zero stdio tests": {"input_output": {"inputs": [], "outputs": []}},
    "zero tests, JSON text": {"tests": '{"inputs": [], "outputs": []}'},
    "inputs and outputs of different lengths": {
        "input_output": {"inputs": ["1"], "outputs": []}
    },
    "inputs not a list": {"input_output": {"inputs": "1", "outputs": ["1"]}},
    "missing outputs": {"input_output": {"inputs": ["1"]}},
    "not JSON": {"input_output": "{inputs: [1]"},
    "JSON of the wrong type": {"input_output": "[1, 2]"},
    "a number as stdin": {"input_output": {"inputs": [5], "outputs": ["5"]}},
    "fn_name not an identifier": {
        "input_output": {"inputs": ["1"], "outputs": ["1"], "fn_name": "f()"}
    },
    "call input neither text nor list": {
        "input_output": {"inputs": [5], "outputs": ["5"], "fn_name": "f"}
    },
    "call argument not JSON": {
        "input_output": {"inputs": ["[1,"], "outputs": ["1"], "fn_name": "f"}
    },
    "call output not JSON text": {
        "input_output": {"inputs": ["1"], "outputs": [1], "fn_name": "f"}
    },
    "call output with a huge int": {
        "input_output": {"inputs": ["1"], "outputs": ["9" * 5000], "fn_name": "f"}
    },
    "zero CodeContests tests": {"public_tests": {"input": [], "output": []}},
    "CodeContests lengths differ": {"public_tests": {"input": ["1"], "output": []}},
    "CodeContests not an object": {"private_tests": [1, 2]},
    "zero SandboxFusion tests": {"test": "[]"},
    "SandboxFusion test without output": {
        "test": json.dumps([{"input": {"stdin": "1"}}])
    },
    "SandboxFusion test not an object": {"test": json.dumps(["x"])},
    "pickled tests that are not zlib": {"test": "eJ" + "A" * 40},
    "pickled tests with a global": {"test": packed(Counter())},
    "HumanEval without check": {"test": "assert True\n", "entry_point": "f"},
    "HumanEval test does not parse": {
        "test": "def check(candidate):\n    assert (\n",
        "entry_point": "f",
    },
    "HumanEval entry_point not an identifier": {
        "test": "def check(c):\n    assert c(1)\n",
        "entry_point": "f x",
    },
    "HumanEval entry_point not text": {
        "test": "def check(c):\n    assert c(1)\n",
        "entry_point": 3,
    },
    "MBPP empty test_list": {"test_list": []},
    "MBPP test_list of numbers": {"test_list": [1, 2]},
    "MBPP assert does not parse": {"test_list": ["assert f(1 == 2"]},
    "MBPP setup code does not parse": {
        "test_list": ["assert f(1) == 2"],
        "test_setup_code": "def (",
    },
    "MBPP setup code not text": {
        "test_list": ["assert f(1) == 2"],
        "test_setup_code": 5,
    },
    "a null byte in test code": {"test_list": ["assert f(1) == 2\x00"]},
    "assert_case empty": {"assert_case": []},
    "test code that never calls its check": {
        "test": "def check(candidate):\n    assert candidate(1) == 2\n"
    },
    "pytest-style test functions never called": {
        "assert_case": [
            "from solution import f\n\ndef test_f():\n    assert f(1) == 2\n"
        ]
    },
    "an MBPP entry that only imports": {"test_list": ["import math"]},
    "assert_case of numbers": {"assert_case": [1]},
    "assert_case with expected outputs too": {
        "tests": {"assert_case": ["assert f(1)"], "inputs": [""], "outputs": ["1"]}
    },
    "verification_info without test_cases": {
        "verification_info": {"language": "python"}
    },
    "verification_info zero test_cases": {"verification_info": {"test_cases": []}},
    "functional tests without a name": {
        "verification_info": {
            "test_cases": [{"input": "1", "output": "1", "type": "function_call"}]
        }
    },
    "stdin and functional tests mixed": {
        "public_test_cases": [
            {"input": "1", "output": "1", "testtype": "stdin"},
            {"input": "1", "output": "1", "testtype": "functional"},
        ],
        "metadata": {"func_name": "f"},
    },
    "LiveCodeBench cases not a list": {"public_test_cases": "{}"},
    "too many tests": {
        "input_output": {
            "inputs": ["1"] * (MAX_TESTS + 1),
            "outputs": ["1"] * (MAX_TESTS + 1),
        }
    },
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_or_empty_tests_raise_invalid_tests(name: str) -> None:
    with pytest.raises(InvalidTestsError) as info:
        parse_suite(MALFORMED[name])
    assert str(info.value)  # a reason for the data set's owner
    assert isinstance(info.value, CodeGraderError)


def test_deep_json_in_tests_is_invalid_not_a_crash() -> None:
    deep = "[" * 50_000 + "]" * 50_000
    with pytest.raises(InvalidTestsError):
        parse_suite(
            {"input_output": {"inputs": [deep], "outputs": ["1"], "fn_name": "f"}}
        )


# ----------------------------------------------------------------- is_code_row

MATH_ROWS: list[dict[str, Any]] = [
    {"prompt": "1+1?", "response": "\\boxed{2}", "gold": "2"},
    {"problem": "x", "answer": "[1, 2]"},
    {"reward_model": {"ground_truth": "42", "style": "rule"}},
    {"reward_model": {"ground_truth": "[0, 1)"}},
    {"reward_model": {"ground_truth": '{"a": 1}'}},
    {"ground_truth": "\\frac{1}{2}", "response": "1/2"},
    {"ground_truth": "[1, 2]"},
    {"verifier_metadata": {"expected_answer": "3"}},
    {"prompt": "1+1?", "gold": "2", "tests": None, "test": None},
]


@pytest.mark.parametrize("row", MATH_ROWS, ids=repr)
def test_math_rows_are_not_code_rows(row: dict[str, Any]) -> None:
    assert not is_code_row(row)


# -------------------------------------------------------------------- suite_key


def test_suite_key_tells_types_and_limits_apart() -> None:
    base = {"input_output": {"fn_name": "f", "inputs": ["1"], "outputs": ["1"]}}
    as_float = {"input_output": {"fn_name": "f", "inputs": ["1"], "outputs": ["1.0"]}}
    as_bool = {"input_output": {"fn_name": "f", "inputs": ["1"], "outputs": ["true"]}}
    keys = {
        suite_key(parse_suite(base)),
        suite_key(parse_suite(as_float)),
        suite_key(parse_suite(as_bool)),
        suite_key(parse_suite({**base, "time_limit": 2})),
        suite_key(parse_suite({**base, "float_tol": 1e-6})),
        suite_key(parse_suite({**base, "memory_limit": 64})),
    }
    assert len(keys) == 6


def test_suite_len_counts_tests() -> None:
    assert len(TestSuite(mode="stdio", stdio=STDIO_CASES)) == 2
    assert len(TestSuite(mode="call", calls=LCB_CALLS, fn_name="f")) == 2


# ------------------------------------------------------------------------- fuzz

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(
        st.sampled_from(
            ["inputs", "outputs", "fn_name", "input", "output", "stdin", "stdout",
             "testtype", "type", "assert_case", "test_cases", "input_output"]
        ) | st.text(max_size=5),
        children,
        max_size=4,
    ),
    max_leaves=12,
)  # fmt: skip
_FIELDS = [
    "input_output", "tests", "test", "test_list", "public_tests", "private_tests",
    "public_test_cases", "private_test_cases", "verification_info", "assert_case",
    "official_tests", "ground_truth", "entry_point", "prompt", "metadata",
    "time_limit", "memory_limit", "float_tol", "test_setup_code",
]  # fmt: skip


@given(
    st.dictionaries(
        st.sampled_from(_FIELDS), _JSON | _JSON.map(json.dumps), min_size=1, max_size=4
    )
)
def test_any_row_gives_a_suite_or_invalid_tests(row: dict[str, Any]) -> None:
    try:
        suite = parse_suite(row)
    except InvalidTestsError:
        return
    assert len(suite) >= 1
    json.loads(suite_key(suite))
