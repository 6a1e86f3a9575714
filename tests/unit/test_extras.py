"""The slim core: the real CLI, in a subprocess where every optional extra's packages
are unimportable, grades as it does with them; what needs an extra exits 2 with the
extra's `pip install` line (`producer.extras`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from producer.errors import MissingExtraError, ProducerError
from producer.extras import EXTRAS, install_line, require

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "examples" / "sample.jsonl"
# The extras' packages (and what they bring that the core must not need: starlette,
# pydantic_core, pyarrow's numpy). Third-party only: our own code is never blocked.
BLOCKED = [
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "pydantic",
    "pydantic_core",
    "httpx",
    "pyarrow",
    "matplotlib",
    "numpy",
    "inspect_ai",
]

# Runs its argv through `producer.cli:main` (as the console script does) after a
# finder that refuses the blocked packages is first on sys.meta_path.
_BLOCKER = """
import sys
BLOCKED = frozenset(sys.argv[1].split(","))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, f"imported before the blocker: {loaded}"

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Blocker())
"""
_RUN_CLI = _BLOCKER + "from producer.cli import main\nmain(sys.argv[2:])\n"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def _cli(*args: str | Path, blocked: bool = True) -> subprocess.CompletedProcess[str]:
    if blocked:
        argv = [sys.executable, "-c", _RUN_CLI, ",".join(BLOCKED)]
    else:
        argv = [sys.executable, "-c", "import sys; from producer.cli import main; "
                "main(sys.argv[1:])"]  # fmt: skip
    return subprocess.run(
        [*argv, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=_env(),
    )


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` run after the blocker, in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER + code, ",".join(BLOCKED)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=_env(),
    )


def _assert_needs(done: subprocess.CompletedProcess[str], extra: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert install_line(extra) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_extras_the_blocker_blocks() -> None:
    # Given the blocker; when a blocked package is imported; then it is refused,
    # though it is installed here (the dev install has every extra)
    done = _python("import numpy")
    assert done.returncode == 1
    assert "No module named 'numpy' (blocked)" in done.stderr


def test_extras_grade_without_extras_is_byte_identical(tmp_path: Path) -> None:
    # Given the sample file graded with every extra importable, then without any
    graded = {}
    for blocked in (False, True):
        out = tmp_path / f"blocked-{blocked}.jsonl"
        done = _cli(
            "grade", SAMPLE, "-o", out, "--no-cache", "-q", "--processes", "2",
            blocked=blocked,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        graded[blocked] = out.read_bytes()
    # Then both outputs are the same bytes, every row graded
    assert graded[True] == graded[False]
    assert len(graded[True].splitlines()) == len(SAMPLE.read_bytes().splitlines())


def test_extras_every_core_module_imports_without_extras() -> None:
    # Given every module of workers/ and producer/ but those that are an extra's
    extra_only = {
        "producer.adapters.inspect",  # the `inspect` extra's scorer
        "producer.serve.schemas",  # `gradefleet serve` (the `serve` extra)
        "producer.serve.grade_route",
        "producer.serve.service",
    }
    modules = sorted(
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for package in ("workers", "producer")
        for path in (REPO / package).rglob("*.py")
    )
    core = [m for m in modules if m not in extra_only and m != "workers.__main__"]
    # When each is imported with the extras blocked
    done = _python(
        "import importlib, json\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    # Then all import (nothing of an extra is needed at import time)
    assert done.returncode == 0, done.stderr
    assert not set(json.loads(done.stdout)) & set(BLOCKED)
    # and the extra-only modules really are (the list above stays honest)
    for name in sorted(extra_only):
        assert _python(f"import {name}").returncode == 1, name


@pytest.mark.parametrize("command", ["worker", "status", "grade", "report"])
def test_extras_core_commands_help_without_extras(command: str) -> None:
    done = _cli(command, "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout or "usage" in done.stdout


def test_extras_serve_without_the_extra_exits_2() -> None:
    _assert_needs(_cli("serve", "--port", "0"), "serve")


def test_extras_report_html_without_the_extra_exits_2(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    _assert_needs(_cli("report", SAMPLE, "--html", page), "html")
    assert not page.exists()


def test_extras_report_without_numpy_exits_2_before_grading(tmp_path: Path) -> None:
    # Given no NumPy (as in the worker image): `report` of a graded file and
    # `grade --report` exit 2 naming the report extra; grade --report writes nothing.
    graded = tmp_path / "graded.jsonl"
    done = _cli("grade", SAMPLE, "-o", graded, "--no-cache", "-q", "--processes", "1")
    assert done.returncode == 0, done.stderr
    _assert_needs(_cli("report", graded), "report")
    out, summary = tmp_path / "again.jsonl", tmp_path / "report.json"
    _assert_needs(_cli("grade", SAMPLE, "-o", out, "--report", summary), "report")
    assert not out.exists()
    assert not summary.exists()


def test_extras_parquet_output_without_the_extra_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "graded.parquet"
    _assert_needs(_cli("grade", SAMPLE, "-o", out, "-q"), "parquet")
    assert list(tmp_path.iterdir()) == []  # refused before any file was made


def test_extras_parquet_input_without_the_extra_exits_2(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rollouts.parquet"
    pq.write_table(pa.table({"response": ["\\boxed{2}"], "gold": ["2"]}), path)
    _assert_needs(_cli("grade", path, "-o", tmp_path / "out.jsonl", "-q"), "parquet")
    _assert_needs(_cli("report", path), "parquet")


def test_extras_inspect_log_without_the_extra_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "run.eval"  # a zip, as an Inspect log is
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("header.json", "{}")
    _assert_needs(_cli("grade", path, "-o", tmp_path / "out.jsonl", "-q"), "inspect")


def test_extras_http_url_without_the_extra_exits_2_or_names_it() -> None:
    # The CLI's --broker takes Redis URLs only: an http:// one is a usage error (2)
    # that points to the library's http(s):// grader and its extra
    done = _cli("grade", SAMPLE, "-o", "-", "--broker", "http://127.0.0.1:9/")
    _assert_needs(done, "serve")
    # The library's and the adapters' http(s):// graders name the serve extra
    for call in (
        "from producer import open_grader; open_grader('http://127.0.0.1:9')",
        "from producer.client.backends import open_backend; "
        "open_backend('https://127.0.0.1:9')",
        "from producer.adapters.verl import compute_score_sync; "
        "compute_score_sync('math', '\\\\boxed{2}', '2', grader_url='http://127.0.0.1:9')",
    ):
        done = _python(
            "from producer.errors import MissingExtraError\n"
            f"try:\n    {call}\n"
            "except MissingExtraError as exc:\n"
            "    print(exc.exit_code, exc)\n"
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("2 "), done.stdout
        assert install_line("serve") in done.stdout, call


def test_extras_require_names_the_extra_and_is_a_producer_error() -> None:
    with pytest.raises(MissingExtraError) as caught:
        require("parquet", "json", "gradefleet_no_such_module")
    assert isinstance(caught.value, ProducerError)
    assert caught.value.exit_code == 2
    assert "pip install 'gradefleet[parquet]'" in str(caught.value)
    assert "gradefleet_no_such_module" in str(caught.value)
    (json_module,) = require("parquet", "json")
    assert json_module is json
    with pytest.raises(ValueError, match="unknown extra"):
        require("nope", "json")


def test_extras_each_is_declared_in_pyproject() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    assert set(EXTRAS) <= set(optional)
    assert optional["all"] == [f"gradefleet[{','.join(EXTRAS)}]"]
    assert "gradefleet[all]" in optional["dev"]
    core = " ".join(project["dependencies"])
    for package in ("fastapi", "uvicorn", "pydantic", "httpx", "pyarrow", "matplotlib"):
        assert package not in core
