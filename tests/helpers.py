"""Shared test helpers: data paths, real rollouts, free ports, a misbehaving grader.

Importable as `tests.helpers` (tests/conftest.py puts the repository root on the
path), and by the benchmarks, which run with the repository root on PYTHONPATH.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from workers import verifier
from workers.models import GradeOptions, Rollout, Verdict

if TYPE_CHECKING:
    import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "tests" / "data"
QWEN_FILE = DATA_DIR / "qwen25math_math_cot_100.jsonl"
GSM8K_FILE = DATA_DIR / "gsm8k_example_model_solutions.jsonl"
MIB = 1 << 20
# What the "keep" response leaves allocated in the grading process.
KEPT_BYTES = 100 * MIB


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def qwen_groups() -> list[list[Rollout]]:
    """Qwen2.5-Math outputs on MATH, 8 per prompt (100 prompts)."""
    groups = []
    with QWEN_FILE.open() as lines:
        for line in lines:
            record = json.loads(line)
            groups.append([Rollout(code, record["gt"]) for code in record["code"]])
    return groups


def gsm8k_groups() -> list[list[Rollout]]:
    """GPT-3 outputs on GSM8K, one per model column (4 per prompt, 1,319 prompts)."""
    groups = []
    with GSM8K_FILE.open() as lines:
        for line in lines:
            record = json.loads(line)
            group = []
            for key, value in record.items():
                if key in ("question", "ground_truth"):
                    continue
                sample = value if isinstance(value, dict) else ast.literal_eval(value)
                group.append(Rollout(sample["solution"], record["ground_truth"]))
            groups.append(group)
    return groups


def real_rollouts() -> list[Rollout]:
    """Qwen2.5-Math MATH outputs (800) then GSM8K GPT-3 outputs (5,276)."""
    return [r for group in qwen_groups() + gsm8k_groups() for r in group]


def mixed_lines() -> bytes:
    """Every kind of line item mode handles, as raw bytes (line mode must write
    what item mode writes for each: tests/unit/test_line_mode.py and the fleet's
    in tests/integration/test_cli_fleet.py)."""
    from workers.lines.records import MAX_LINE_BYTES

    real = real_rollouts()[:150]
    records: list[Any] = [{"response": r.response, "gold": r.gold} for r in real]
    records[3:3] = [
        {"uid": "s", "responses": ["\\boxed{4}", "\\boxed{5}", "x"], "gt": 4},
        {"code": ["\\boxed{0.5}"], "gold": ["1/3", "1/2"]},
        {"response": "\\boxed{18446744073709551616}", "gold": 18446744073709551616},
        {"response": "\\boxed{0.5}", "gold": 0.5, "meta": {"cached": False}},
        {"response": "so \\boxed{\ud800}", "gold": "1", "cached": "input's"},
        {"response": "\\boxed{1}", "gold": "1", "gradefleet_line": -1},
        {"response": 3, "gold": "1"},
        {"response": "x" * 10, "gold": ""},
        [1, 2],
    ]
    lines = [json.dumps(record).encode() for record in records]
    lines[0] = b"\xef\xbb\xbf" + lines[0]  # a byte order mark
    lines[10:10] = [
        b"",
        b"   ",
        b"{not json",
        b'{"response": "\\\\boxed{1}", "gold": NaN}',
        b'{"response": "\xff\xfe", "gold": "1"}',  # invalid UTF-8
        b'{"response": "' + b"y" * (MAX_LINE_BYTES + 10) + b'", "gold": "1"}',
        b'{"response": "caf\xc3\xa9 \\\\boxed{2}", "gold": "2"}',
    ]
    return (
        b"\n".join(lines) + b"\n" + json.dumps({"response": "1", "gold": "1"}).encode()
    )


def _alloc_slowly() -> None:
    blobs = []
    while True:
        blobs.append(b"x" * (8 * MIB))


_KEPT: list[bytearray] = []


def _keep() -> None:
    # Stays allocated after the item (as a heap the allocator never handed back):
    # bytearray() zero-fills, so the pages count in the process's RSS.
    _KEPT.append(bytearray(KEPT_BYTES))


def _raise() -> None:
    raise KeyError("grader bug")


def _kill_parent() -> None:
    os.kill(os.getppid(), signal.SIGKILL)  # the sandbox child's parent
    time.sleep(60)


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # as an operator or the OOM killer would
    time.sleep(60)


def _mark_then_hang(path: str) -> None:
    Path(path).touch()
    time.sleep(60)


def _hang_once(path: str) -> None:
    mark = Path(path)
    if not mark.exists():
        mark.write_text(str(os.getpid()))
        time.sleep(60)


def _logged_nap(path: str) -> None:
    with Path(path).open("a") as log:  # one line each time it is graded
        log.write(f"{os.getpid()}\n")
    time.sleep(0.3)


# Exact responses, then prefixes "name:<path>": what each makes the grader do.
_MISBEHAVIOURS = {
    "hang": lambda: time.sleep(60),
    "nap": lambda: time.sleep(0.5),
    "alloc-at-once": lambda: bytearray(4096 * MIB),
    "alloc-slowly": _alloc_slowly,
    "abort": os.abort,
    "segv": lambda: os.kill(os.getpid(), signal.SIGSEGV),
    "raise": _raise,
    "keep": _keep,
}
_PREFIXED = {
    "sleep-then-mark": _mark_then_hang,
    "once": _hang_once,
    "logged-nap": _logged_nap,
}


def hostile_grade(
    response: str, gold: str, *, options: GradeOptions | None = None
) -> Verdict:
    """`verifier.grade`, except for magic responses that misbehave on purpose.

    "kill-my-worker" anywhere in a response kills the grading process's parent (a
    fleet worker's sandbox child kills the worker: never use it in the embedded pool,
    whose parent is the caller); "kill-me" SIGKILLs the grading process itself.
    "once:<path>" hangs the first time, leaving the grading process's pid in <path>;
    "logged-nap:<path>" adds a line to <path> and takes 0.3 s.
    """
    name, _, argument = response.partition(":")
    if response in _MISBEHAVIOURS:
        _MISBEHAVIOURS[response]()
    elif name in _PREFIXED and argument:
        _PREFIXED[name](argument)
    elif "kill-my-worker" in response:
        _kill_parent()
    elif "kill-me" in response:
        _kill_self()
    return verifier.grade(response, gold, options=options)


def misbehave_while_prepared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch `verifier.prepare` here (and so in every process forked from here):
    "hang while prepared" hangs, "raise while prepared" raises KeyError; other
    texts are prepared as always."""
    real_prepare = verifier.prepare

    def prepare(response: str, gold: str, **kw: Any) -> verifier.Prepared:
        if response == "hang while prepared":
            time.sleep(60)
        if response == "raise while prepared":
            raise KeyError("extraction bug")
        return real_prepare(response, gold, **kw)

    monkeypatch.setattr(verifier, "prepare", prepare)


T = TypeVar("T")


def kill_when_marked(mark: Path, run: Callable[[], T]) -> T:
    """Run `run` in a thread; once a "once:<mark>" item has written its grading
    process's pid into `mark`, SIGKILL that process (as an operator or the OOM
    killer would); return what `run` returns."""
    results: list[T] = []
    runner = threading.Thread(target=lambda: results.append(run()))
    runner.start()
    deadline = time.monotonic() + 20
    while not (mark.exists() and mark.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(int(mark.read_text()), signal.SIGKILL)
    runner.join(timeout=60)
    (result,) = results
    return result
