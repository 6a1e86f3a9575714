"""Code grader speed (issue 39, section 5), all figures measured in one run.

Run on demand (not collected by pytest)::

    python3 tests/bench/bench_code.py [--quick] [--workers 2] [--slots 8]

1. Throughput (rollouts/s) and CPU per rollout (the workers and everything they
   started: the machine's other load does not count there) on MBPP's reference
   programs (../shared/data/code/mbpp_sanitized.jsonl):
   `grade_code` (every rollout in a fresh sandbox: bwrap'd zygote, new namespaces,
   slot uid, hard rlimits, harness process) against a plain loop that runs the same
   program + test + `check(entry_point)` in its own `python3` subprocess with rlimits
   (which isolates nothing). Same programs, same worker processes and concurrency.
   Printed with and without the references whose own run is long (over 200 ms: their
   compute, not the grader, decides both sides' time).
2. CPU ms per rollout by phase, one slot, sequential: sandbox start (a null rollout:
   clone into new namespaces, isolate, exit), run (the model process), tests and
   comparison (the harness), and the worker's own share (parse, extract, verdict).
3. A step of `--step` rollouts (8,192; 1,024 with --quick) of MBPP references, clean,
   then with 1% hostile (sleep, fork bomb, memory bomb, output flood): the wall time
   each takes, and the growth against one item deadline.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.code.grade import CodeLimits, grade_code
from workers.code.program import extract_program
from workers.code.sandbox import CodeSandbox

MBPP = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "code"
    / "mbpp_sanitized.jsonl"
)
LONG_RUN_S = 0.2
THROUGHPUT_LIMITS = CodeLimits(time_limit_s=10.0, wall_s=30.0)
STEP_LIMITS = CodeLimits(time_limit_s=2.0, wall_s=10.0, startup_s=1.0)
HOSTILE = {
    "sleep": "import time\ndef {f}(*args):\n    time.sleep(100)\n",
    "fork_bomb": (
        "import os\ndef {f}(*args):\n    while True:\n        try:\n"
        "            os.fork()\n        except OSError:\n            pass\n"
    ),
    "memory_bomb": "def {f}(*args):\n    x = [1] * (10 ** 10)\n    return len(x)\n",
    "output_flood": "def {f}(*args):\n    while True:\n        print('x' * 65536)\n",
}

Item = tuple[str, dict[str, Any]]  # (response, row)
Grader = Callable[[Item], str]
Closer = Callable[[], None]
CpuMeter = Callable[[], float]


def load_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in MBPP.read_text().splitlines()]


def reference(row: dict[str, Any]) -> Item:
    return row["canonical_solution"], row


def hostile(row: dict[str, Any], kind: str) -> Item:
    program = HOSTILE[kind].format(f=row["entry_point"])
    return f"```python\n{program}```", row


def plain_source(row: dict[str, Any]) -> str:
    """The plain loop's program: ours, its test and the call, under rlimits."""
    program = extract_program(
        row["canonical_solution"], row["prompt"], row["entry_point"]
    )
    limits = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (30, 30))\n"
        "resource.setrlimit(resource.RLIMIT_NPROC, (16, 16))\n"
    )
    return f"{limits}{program}\n\n{row['test']}\n\ncheck({row['entry_point']})\n"


# ------------------------------------------------------------------ worker processes


def _cpu_self_and_children() -> float:
    usage = [
        resource.getrusage(who)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    ]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def _ours(slots: int, limits: CodeLimits) -> tuple[Grader, Closer, CpuMeter]:
    boxes = [CodeSandbox() for _ in range(slots)]
    free = list(boxes)
    lock = threading.Lock()

    def grade(item: Item) -> str:
        with lock:
            box = free.pop()
        try:
            response, row = item
            verdict = grade_code(response, row, prompt=row["prompt"],
                                 entry_point=row["entry_point"], limits=limits,
                                 sandbox=box)  # fmt: skip
            return verdict.status.value
        finally:
            with lock:
                free.append(box)

    def close() -> None:
        for box in boxes:
            box.close()

    def cpu() -> float:  # this process, and both zygotes of every slot with children
        return _cpu_self_and_children() + sum(sum(b.zygote_times()) for b in boxes)

    return grade, close, cpu


def _plain(slots: int, limits: CodeLimits) -> tuple[Grader, Closer, CpuMeter]:
    def grade(item: Item) -> str:
        argv = [sys.executable, "-c", plain_source(item[1])]
        proc = subprocess.run(
            argv, capture_output=True, timeout=limits.wall_s, check=False
        )
        return "correct" if proc.returncode == 0 else "wrong"

    return grade, lambda: None, _cpu_self_and_children


def worker(kind: str, items: list[Item], slots: int, limits: CodeLimits,
           ready: Any, go: Any, results: Any) -> None:  # fmt: skip
    grade, close, cpu = (_ours if kind == "ours" else _plain)(slots, limits)
    with ThreadPoolExecutor(slots) as pool:  # warm every slot before the clock starts
        list(pool.map(grade, [items[0]] * slots))
        ready.put(os.getpid())
        go.wait()
        started, cpu_before = time.perf_counter(), cpu()
        statuses = list(pool.map(grade, items))
    results.put((time.perf_counter() - started, Counter(statuses), cpu() - cpu_before))
    close()


def run_parallel(
    kind: str, items: list[Item], workers: int, slots: int, limits: CodeLimits
) -> tuple[float, Counter[str], float]:
    """Wall seconds from the start signal to the last worker done, the statuses, and
    the CPU seconds the workers and everything they started spent meanwhile."""
    ctx = multiprocessing.get_context("fork")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    shares = [items[i::workers] for i in range(workers)]
    procs = [
        ctx.Process(
            target=worker, args=(kind, item_share, slots, limits, ready, go, results)
        )
        for item_share in shares
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    started = time.perf_counter()
    go.set()
    statuses: Counter[str] = Counter()
    cpu_s = 0.0
    for _ in procs:
        _, counts, spent = results.get(timeout=3600)
        statuses.update(counts)
        cpu_s += spent
    wall = time.perf_counter() - started
    for proc in procs:
        proc.join()
    return wall, statuses, cpu_s


# ---------------------------------------------------------------------------- phases


def _zygote_self_and_children(box: CodeSandbox) -> list[float]:
    """[model self, model children, harness self] CPU seconds so far."""
    _, model, harness = box._zygotes()
    out = []
    for zygote in (model, harness):
        zygote.send({"op": "times"})
        times = zygote.read(time.monotonic() + 10)
        out += [times[0] + times[1], times[2] + times[3]]
    return out[:3]


def phase_cpu(rows: list[dict[str, Any]], items: list[Item]) -> dict[str, float]:
    """CPU ms per rollout: worker, model zygote, model process, harness."""
    box = CodeSandbox()
    grade_code(items[0][0], items[0][1], prompt=items[0][1]["prompt"], sandbox=box)
    before = _zygote_self_and_children(box)
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    for response, row in items:
        grade_code(
            response,
            row,
            prompt=row["prompt"],
            entry_point=row["entry_point"],
            limits=THROUGHPUT_LIMITS,
            sandbox=box,
        )
    after = _zygote_self_and_children(box)
    self_after = resource.getrusage(resource.RUSAGE_SELF)
    box.close()
    n = len(items)
    worker_s = (self_after.ru_utime + self_after.ru_stime) - (
        self_before.ru_utime + self_before.ru_stime
    )
    model_self, model_children, harness = (
        (b - a) for a, b in zip(before, after, strict=True)
    )
    return {
        "worker": worker_s / n * 1e3,
        "model zygote": model_self / n * 1e3,
        "model process": model_children / n * 1e3,
        "harness": harness / n * 1e3,
    }


def null_items(rows: list[dict[str, Any]], n: int) -> list[Item]:
    """A rollout that does nothing: one assert on a function returning None."""
    row = {"prompt": "", "entry_point": "f", "test_list": ["assert f() is None"]}
    return [("```python\ndef f():\n    return None\n```", row)] * n


# ------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 1,024-rollout step")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=8, help="sandboxes per worker")
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("--parts", default="1,2,3", help="which parts to run")
    parser.add_argument("--repeat", type=int, default=1, help="step runs of each kind")
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    step = args.step or (1024 if args.quick else 8192)
    rows = load_rows()
    print(f"machine: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")

    # Which references run long on their own (measured by the plain loop, once).
    durations = {}
    for row in rows:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", plain_source(row)],
            capture_output=True,
            timeout=60,
            check=False,
        )
        durations[row["task_id"]] = time.perf_counter() - started
    short = [row for row in rows if durations[row["task_id"]] < LONG_RUN_S + 0.1]
    long_ids = sorted(t for t, d in durations.items() if d >= LONG_RUN_S + 0.1)
    print(f"references: {len(rows)}; running long on their own: {long_ids}")

    if 1 in parts:
        throughput(rows, short, args.workers, args.slots)
    if 2 in parts:
        phases(rows, short)
    if 3 in parts:
        hostile_step(short, step, args.workers, args.slots, args.repeat)
    print(
        f"load average now {os.getloadavg()[0]:.2f}; median plain run "
        f"{statistics.median(durations.values()) * 1e3:.1f} ms"
    )


def throughput(
    rows: list[dict[str, Any]], short: list[dict[str, Any]], workers: int, slots: int
) -> None:
    print("\n1. throughput, MBPP references (rollouts/s)")
    for label, subset in (("all", rows), ("without long runs", short)):
        items = [reference(row) for row in subset]
        shape = (workers, slots, THROUGHPUT_LIMITS)
        plain_wall, plain_statuses, plain_cpu = run_parallel("plain", items, *shape)
        ours_wall, ours_statuses, ours_cpu = run_parallel("ours", items, *shape)
        plain_rate, ours_rate = len(items) / plain_wall, len(items) / ours_wall
        plain_ms, ours_ms = (cpu / len(items) * 1e3 for cpu in (plain_cpu, ours_cpu))
        print(f"  {label} (n={len(items)})")
        print(
            f"    plain python3 loop {plain_rate:7.1f}/s {plain_ms:6.2f} CPU ms/rollout"
            f"  {dict(plain_statuses)}"
        )
        print(
            f"    ours               {ours_rate:7.1f}/s {ours_ms:6.2f} CPU ms/rollout"
            f"  {dict(ours_statuses)}"
        )
        print(
            f"    ratio: throughput {ours_rate / plain_rate:.2f}x,"
            f" CPU per rollout {plain_ms / ours_ms:.2f}x"
        )


def phases(rows: list[dict[str, Any]], short: list[dict[str, Any]]) -> None:
    print("\n2. CPU ms per rollout by phase (one slot, sequential)")
    refs = [reference(row) for row in short]
    null = phase_cpu(rows, null_items(rows, 300))
    real = phase_cpu(rows, refs)
    print(f"  {'phase':16s} {'null rollout':>13s} {'MBPP reference':>15s}")
    for name in real:
        print(f"  {name:16s} {null[name]:13.2f} {real[name]:15.2f}")
    derived = {
        "sandbox start (null rollout: clone, namespaces, isolate, exit)": (
            null["model zygote"] + null["model process"]
        ),
        "run (model process beyond a null rollout's)": (
            real["model process"] - null["model process"]
        ),
        "compare (harness: tests and comparisons)": real["harness"],
        "worker (parse, extract, verdict, IPC)": real["worker"],
        "total": sum(real.values()),
    }
    for name, value in derived.items():
        print(f"  {name:64s} {value:6.2f} ms")


def hostile_step(
    short: list[dict[str, Any]], step: int, workers: int, slots: int, repeat: int
) -> None:
    print(
        f"\n3. step of {step} rollouts, {workers} workers x {slots} slots,"
        f" {STEP_LIMITS.time_limit_s} s per test, item deadline {STEP_LIMITS.wall_s} s"
    )
    clean = [reference(row) for row in itertools.islice(itertools.cycle(short), step)]
    kinds = itertools.cycle(sorted(HOSTILE))
    dirty = [
        hostile(item[1], next(kinds)) if i % 100 == 50 else item
        for i, item in enumerate(clean)
    ]
    hostile_n = sum(1 for i in range(step) if i % 100 == 50)
    walls: dict[str, list[float]] = {"clean": [], "hostile": []}
    for _ in range(repeat):  # alternated, so a change in the machine's load hits both
        for label, items in (("clean", clean), ("hostile", dirty)):
            wall, statuses, _ = run_parallel("ours", items, workers, slots, STEP_LIMITS)
            walls[label].append(wall)
            print(
                f"  {label:8s} {wall:7.2f} s  {dict(statuses)}"
                f"  load {os.getloadavg()[0]:.1f}"
            )
    growth = min(walls["hostile"]) - min(walls["clean"])
    verdict = "within" if growth <= STEP_LIMITS.wall_s else "OVER"
    print(
        f"  {hostile_n} hostile; growth (best of each) {growth:.2f} s ="
        f" {growth / STEP_LIMITS.wall_s:.2f} item deadlines ({verdict} one)"
    )


if __name__ == "__main__":
    main()
