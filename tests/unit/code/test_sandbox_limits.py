"""Each limit of a sandboxed rollout holds and ends as its verdict: processes (a real,
bounded fork bomb: RLIMIT_NPROC binds because the model runs as a non-root uid),
memory, CPU, wall clock, output size, file size; and the sandbox keeps grading
correctly afterwards. Real processes; every bomb is bounded by the rollout's limits."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from workers.code.grade import CodeLimits, grade_code
from workers.code.sandbox import CodeSandbox, RunLimits
from workers.code.suite import CallCase, StdioCase, TestSuite
from workers.models import Status

LIMITS = RunLimits(
    time_limit_s=1.0, wall_s=6.0, memory_bytes=256 << 20, output_bytes=64 << 10,
    processes=8, startup_s=0.5,
)  # fmt: skip
CODE_LIMITS = CodeLimits(time_limit_s=1.0, wall_s=6.0, memory_bytes=256 << 20,
                         output_bytes=64 << 10, processes=8)  # fmt: skip
ECHO = TestSuite(mode="stdio", stdio=(StdioCase(stdin="3\n", expected_stdout="6\n"),))
GOOD = "print(int(input()) * 2)"


@pytest.fixture(scope="module")
def sandbox():
    box = CodeSandbox()
    try:
        yield box
    finally:
        box.close()


def run(box: CodeSandbox, program: str) -> dict:
    (outcome,) = box.run_stdio(program, "", [""], LIMITS)
    assert outcome["ready"], outcome
    return outcome


def grade(box: CodeSandbox, program: str):
    return grade_code(
        f"```python\n{program}\n```", ECHO, limits=CODE_LIMITS, sandbox=box
    )


def test_limits_process_count_binds_for_the_sandboxed_uid(sandbox):
    # A bounded fork bomb: fork until refused (or 200 times), report how far it got.
    program = """
import os, time
made = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
print(made)
"""
    outcome = run(sandbox, program)
    assert outcome["exit"] == 0, outcome
    assert int(outcome["stdout"]) < LIMITS.processes


def test_limits_fork_bomb_is_a_verdict_and_the_next_rollout_grades(sandbox):
    bomb = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
    started = time.monotonic()
    verdict = grade(sandbox, bomb)
    assert verdict.status is Status.WRONG
    assert verdict.tests_passed == 0
    assert verdict.failure["kind"] == "timeout"
    assert time.monotonic() - started < LIMITS.time_limit_s + LIMITS.startup_s + 2
    assert grade(sandbox, GOOD).correct


def test_limits_memory_bomb_is_a_memory_verdict(sandbox):
    verdict = grade(sandbox, "x = bytearray(1 << 30)\nprint(len(x))")
    assert verdict.status is Status.WRONG
    assert verdict.failure["kind"] == "memory"
    assert grade(sandbox, GOOD).correct


def test_limits_cpu_loop_and_sleep_are_timeouts_within_the_deadline(sandbox):
    for program in ("while True: pass", "import time\ntime.sleep(60)"):
        started = time.monotonic()
        verdict = grade(sandbox, program)
        elapsed = time.monotonic() - started
        assert verdict.failure["kind"] == "timeout", program
        assert elapsed < LIMITS.time_limit_s + LIMITS.startup_s + 1.5, (
            program,
            elapsed,
        )


def test_limits_output_flood_is_cut_at_the_cap(sandbox):
    started = time.monotonic()
    outcome = run(sandbox, "while True:\n    print('x' * 10000)")
    assert outcome["killed"] == "output_limit"
    assert len(outcome["stdout"]) <= LIMITS.output_bytes
    assert time.monotonic() - started < 2
    verdict = grade(
        sandbox, "import sys\nwhile True:\n    sys.stdout.write('6\\n' * 1000)"
    )
    assert verdict.failure["kind"] == "output_limit"


def test_limits_file_size_and_tmpfs_are_bounded(sandbox):
    program = """
import json
out = {}
for size in (1 << 20, 64 << 20):
    try:
        with open("/tmp/big", "wb") as f:
            f.write(b"x" * size)
        out[size] = "written"
    except OSError as exc:
        out[size] = type(exc).__name__
print(json.dumps(out))
"""
    outcome = run(sandbox, program)
    result = json.loads(outcome["stdout"])
    assert result == {str(1 << 20): "written", str(64 << 20): "OSError"}


def test_limits_a_program_that_fails_to_start_is_never_a_pass(sandbox):
    verdict = grade(sandbox, "import os\nos._exit(0)")
    assert verdict.status is Status.WRONG
    assert verdict.tests_passed == 0
    verdict = grade(sandbox, "print(6)\nraise ValueError('late')")
    assert verdict.failure == {
        "index": 0,
        "kind": "runtime_error",
        "exception": "ValueError",
    }


def _cgroups_of(uid: int) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            if f"\nUid:\t{uid}\t" in status:
                found.append((entry / "cgroup").read_text())
        except OSError:
            continue
    return found


def test_limits_model_processes_share_their_slots_cgroups(sandbox):
    if not os.access("/sys/fs/cgroup/cpu", os.W_OK):
        pytest.skip("no writable cgroup v1 cpu hierarchy on this machine")
    # Given a rollout that runs for a while, with a few processes
    program = "import os, time\nfor _ in range(3):\n    os.fork()\ntime.sleep(1.5)\n"
    uid = sandbox._zygotes()[0].model_uid
    runner = threading.Thread(target=run, args=(sandbox, program))
    runner.start()
    seen: list[str] = []
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline and len(seen) < 8:
        seen = _cgroups_of(uid)
        time.sleep(0.05)
    runner.join()
    # Then all of them are in the slot's cpu and pids cgroups
    assert len(seen) == 8
    for cgroups in seen:
        assert "cpu:/gradefleet-code-slot-" in cgroups.replace(",cpuacct", "")
        assert "pids:/gradefleet-code-slot-" in cgroups


def test_limits_output_flood_in_call_mode_is_cut_too(sandbox):
    case = CallCase(args=(1,), expected=1)
    suite = TestSuite(mode="call", calls=(case,), fn_name="f")
    program = "def f(x):\n    while True:\n        print('x' * 10000)\n"
    started = time.monotonic()
    verdict = grade_code(program, suite, limits=CODE_LIMITS, sandbox=sandbox)
    elapsed = time.monotonic() - started
    assert verdict.failure == {"index": 0, "kind": "output_limit"}, verdict
    assert elapsed < 1.0, elapsed  # cut at the cap, not at the deadline


def test_limits_zygotes_outlive_the_thread_that_started_them():
    # bwrap's --die-with-parent follows the starting thread: a pool thread that
    # ends must not take the zygotes (and the next rollouts) with it.
    box = CodeSandbox()
    try:
        starter = threading.Thread(target=grade, args=(box, GOOD))
        starter.start()
        starter.join()
        assert grade(box, GOOD).correct
    finally:
        box.close()


def test_limits_under_a_lower_inherited_hard_limit_still_grade():
    # A worker started under `ulimit -Hv` (hard RLIMIT_AS) below the harness's own
    # 2 GB: the sandbox takes the tighter limit instead of failing to start.
    hard_bytes = 1536 << 20
    script = f"""
import json, resource, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
resource.setrlimit(resource.RLIMIT_AS, ({hard_bytes}, {hard_bytes}))
from workers.code.grade import CodeLimits, grade_code
from workers.code.sandbox import CodeSandbox
from workers.code.suite import AssertCase, TestSuite
suite = TestSuite(mode="assert", asserts=(AssertCase(source="assert f(2) == 4"),),
                  entry_point="f", program_names=("f",))
box = CodeSandbox(slot_prefix="gradefleet-test-hard-as")
try:
    limits = CodeLimits(memory_bytes=512 << 20)
    verdicts = [grade_code(r, suite, limits=limits, sandbox=box)
                for r in ("def f(x):\\n    return 2 * x", "def f(x):\\n    return x")]
finally:
    box.close()
print(json.dumps([[v.status.value, v.reason] for v in verdicts]))
"""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    statuses = json.loads(done.stdout.splitlines()[-1])
    assert [s for s, _ in statuses] == ["correct", "wrong"], statuses
