"""Sandbox child lifecycle: recycling, reaping, external kills, parent death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.helpers import hostile_grade
from workers import verifier
from workers.models import GradeOptions, Status, Verdict
from workers.sandbox.process import Sandbox

OPTIONS = GradeOptions()
MIB = 1 << 20


def marking_grade(
    response: str, gold: str, *, options: GradeOptions | None = None
) -> Verdict:
    """Touch the file named after `mark:` and hang, so a test can act mid-item."""
    if response.startswith("mark:"):
        Path(response.split(":", 1)[1]).touch()
        time.sleep(60)
    return verifier.grade(response, gold, options=options)


def process_gone(pid: int) -> bool:
    """True once `pid` has exited (missing, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


def wait_until(predicate: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_sandbox_recycles_child_every_n_items() -> None:
    restarts: list[str] = []
    pids: set[int] = set()
    with Sandbox(
        item_timeout_s=5.0,
        item_memory_bytes=256 * MIB,
        recycle_after_items=3,
        on_restart=restarts.append,
    ) as sandbox:
        for _ in range(7):
            sandbox.grade("\\boxed{1}", "1", OPTIONS)
            if sandbox.child_pid is not None:
                pids.add(sandbox.child_pid)
    assert restarts == ["recycle", "recycle"]
    assert len(pids) == 3
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)


def test_sandbox_close_reaps_every_child() -> None:
    pids: list[int] = []
    sandbox = Sandbox(item_timeout_s=0.2, item_memory_bytes=256 * MIB)
    sandbox.grade("\\boxed{1}", "1", OPTIONS)
    pids.append(sandbox.child_pid or -1)
    sandbox.close()
    sandbox.close()  # idempotent
    assert sandbox.child_pid is None
    # Reaped, not merely dead: the pid is gone from /proc (a zombie would remain).
    assert not Path(f"/proc/{pids[0]}").exists()


def test_sandbox_external_sigkill_mid_item_reports_the_item(tmp_path: Path) -> None:
    # Given an item that hangs, and someone killing the child while it runs
    mark = tmp_path / "started"
    restarts: list[str] = []
    sandbox = Sandbox(
        item_timeout_s=30.0,
        item_memory_bytes=256 * MIB,
        grade_fn=marking_grade,
        on_restart=restarts.append,
    )
    results: list[Verdict] = []
    with sandbox:
        sandbox.grade("\\boxed{1}", "1", OPTIONS)
        victim = sandbox.child_pid
        assert victim is not None
        worker = threading.Thread(
            target=lambda: results.append(sandbox.grade(f"mark:{mark}", "1", OPTIONS))
        )
        worker.start()
        assert wait_until(mark.exists)
        os.kill(victim, signal.SIGKILL)
        worker.join(timeout=10)
        # Then the item is answered (error, naming the signal) and the sandbox goes on
        assert [v.status for v in results] == [Status.ERROR]
        assert "SIGKILL" in results[0].reason
        assert restarts == ["crash"]
        assert sandbox.grade("\\boxed{2}", "2", OPTIONS).correct
    assert not Path(f"/proc/{victim}").exists()


def test_sandbox_child_killed_between_items_is_replaced_silently() -> None:
    restarts: list[str] = []
    with Sandbox(
        item_timeout_s=5.0, item_memory_bytes=256 * MIB, on_restart=restarts.append
    ) as sandbox:
        sandbox.grade("\\boxed{1}", "1", OPTIONS)
        victim = sandbox.child_pid
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        assert wait_until(lambda: process_gone(victim))
        assert sandbox.grade("\\boxed{3}", "3", OPTIONS).correct
        assert restarts == ["crash"]


PARENT_SCRIPT = """
import sys, time
from workers.models import GradeOptions
from tests.helpers import hostile_grade
from workers.sandbox.process import Sandbox
sandbox = Sandbox(item_timeout_s=5.0, item_memory_bytes=256 << 20)
sandbox.grade("\\\\boxed{1}", "1", GradeOptions())
print(sandbox.child_pid, flush=True)
time.sleep(120)
"""


def test_sandbox_child_dies_with_its_parent() -> None:
    # Given a parent process holding a sandbox child
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert not process_gone(child_pid)
        # When the parent is SIGKILLed (no chance to clean up)
        parent.kill()
        parent.wait(timeout=10)
        # Then the kernel kills the child too (PR_SET_PDEATHSIG)
        assert wait_until(lambda: process_gone(child_pid))
    finally:
        parent.kill()
        parent.wait(timeout=10)
        if parent.stdout is not None:
            parent.stdout.close()


PROBE_SCRIPT = """
import sys
from workers import verifier
from workers.models import GradeOptions
from tests.helpers import hostile_grade
from workers.sandbox.process import Sandbox

def probe(response, gold, *, options=None):
    preloaded = str("sympy" in sys.modules)
    return verifier.grade(response, gold, options=options).replace(reason=preloaded)

with Sandbox(item_timeout_s=30, item_memory_bytes=256 << 20, grade_fn=probe,
             warm_up=sys.argv[1] == "warm") as sandbox:
    print(sandbox.grade("\\\\boxed{1}", "1", GradeOptions()).reason)
"""


def test_sandbox_children_start_with_the_verifier_warm() -> None:
    # SymPy is imported lazily by the verifier: the parent must do it before forking.
    def child_had_sympy(mode: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", PROBE_SCRIPT, mode],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip()

    assert child_had_sympy("warm") == "True"
    assert child_had_sympy("cold") == "False"


def test_sandbox_replaces_a_child_whose_heap_grew_a_quarter_of_the_cap() -> None:
    # "keep" leaves 100 MiB allocated in the child: past a quarter of a 256 MiB
    # cap, the child is replaced after its chunk though far from its item count;
    # below a quarter (a 1 GiB cap), it stays.
    for cap_mib, replaced in ((256, True), (1024, False)):
        restarts: list[str] = []
        with Sandbox(
            item_timeout_s=5.0,
            item_memory_bytes=cap_mib * MIB,
            on_restart=restarts.append,
            grade_fn=hostile_grade,
        ) as sandbox:
            sandbox.grade("\\boxed{1}", "1", OPTIONS)
            first = sandbox.child_pid
            kept = sandbox.grade("keep", "1", OPTIONS)
            after = sandbox.grade("\\boxed{2}", "2", OPTIONS)
            assert kept == verifier.grade("keep", "1", options=OPTIONS)
            assert after.correct
            assert (sandbox.child_pid != first) is replaced
        assert restarts == (["recycle"] if replaced else [])
