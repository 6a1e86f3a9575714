"""Code rollouts on a fleet, 1 -> N workers (issue 40, section 7): prints figures.

    python tests/bench/bench_fleet_code.py --quick    # 1 and 2 workers, < 1 min here
    python tests/bench/bench_fleet_code.py --workers 1,2,4,8,16 --rollouts 6144

The rollouts are MBPP's reference programs (../shared/data/code/mbpp_sanitized.jsonl,
`--data`), repeated to `--rollouts`, a share of them (`--wrong-share`) with the body
`return None` instead, so verdicts are mixed; each ends in a comment line of its
own, so no two are alike and every one runs in a sandbox (no cache hit, no reuse
within a batch; the cache is flushed before each run too). References whose own
run is long (over `bench_code.LONG_RUN_S` in a preflight) are left out unless
`--keep-long`: their compute, not the fleet, would decide the tail.

They are graded through `GradingClient` on bench_fleet's fleet (a private
redis-server, `python -m workers` nodes of one process each), cold, `--rounds`
times per worker count; each row gives the median run's rollouts/s, its ratio to
the first count's (one worker by default), and CPU per rollout. A node of one
process keeps one code sandbox (one slot: a model and a harness zygote) and grades
its code items one at a time; each row says how many sandboxes the nodes held.
Every verdict of every run is compared with embedded mode's verdict of the same
rollout (the local pool, graded once before); a mismatch is printed and the exit
status is 1.

Needs the code sandbox (root and bubblewrap): without it the script exits 2 before
starting anything, saying which is missing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_code import LONG_RUN_S, MBPP
from bench_fleet import (
    Bench,
    _process_table,
    _producer_cpu_s,
    measured_run,
    print_scaling_row,
    process_tree,
)

from producer import ProducerSettings, code_rollout, open_grader
from producer.client.fleet import Rollout
from workers.models import Status, Verdict

WRONG_BODY = "    return None\n"
# A worker node's code items run one at a time in its task process's one sandbox
# (`workers.code.grade.default_sandbox`): a model and a harness zygote under bwrap.
ZYGOTE_ROLE = "'model'"


def sandbox_problem() -> str | None:
    """Why the code sandbox cannot run here (None: it may)."""
    if os.geteuid() != 0:
        return "the code sandbox needs root (new namespaces, a uid per slot)"
    if shutil.which("bwrap") is None:
        return (
            "bubblewrap (bwrap) is not on PATH: install it (Debian: apt-get install"
            " bubblewrap), or put a bwrap binary on PATH"
        )
    return None


def preflight(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Grade each reference once in a sandbox of this process, timed: (the rows whose
    reference ran under LONG_RUN_S, the task ids of the others). Exits 2 when the
    sandbox does not start (its reason printed)."""
    from workers.code.grade import grade_code
    from workers.code.sandbox import CodeSandbox

    short, long_ids = [], []
    box = CodeSandbox()
    try:
        for row in rows:
            started = time.perf_counter()
            verdict = grade_code(
                row["canonical_solution"],
                row,
                prompt=row["prompt"],
                entry_point=row["entry_point"],
                sandbox=box,
            )
            seconds = time.perf_counter() - started
            if verdict.status is Status.ERROR and "sandbox" in verdict.reason:
                raise fail(f"the code sandbox does not run: {verdict.reason}", 2)
            if seconds < LONG_RUN_S:
                short.append(row)
            else:
                long_ids.append(row["task_id"])
    finally:
        box.close()
    return short, long_ids


def marked(body: str, tag: str) -> str:
    """`body` with a last comment line `# tag`, indented as its first line
    (a column-0 comment would change how a body indented two spaces is re-indented
    under its prompt, `workers.code.program`)."""
    first = next((line for line in body.splitlines() if line.strip()), "")
    indent = first[: len(first) - len(first.lstrip())]
    return f"{body.rstrip()}\n{indent}# {tag}\n"


def code_rollouts(
    rows: list[dict[str, Any]], n: int, wrong_share: float
) -> tuple[list[Rollout], list[str]]:
    """`n` unique code rollouts cycling over `rows` (a `wrong_share` of them with the
    body `return None`), shuffled; and a label for each (task id, and which body)."""
    rng = random.Random(1)
    made = []
    for k in range(n):
        row = rows[k % len(rows)]
        wrong = rng.random() < wrong_share
        body = WRONG_BODY if wrong else row["canonical_solution"]
        label = f"{row['task_id']} ({'return None' if wrong else 'reference'})"
        made.append((code_rollout(marked(body, f"rollout {k}"), row), label))
    rng.shuffle(made)
    return [rollout for rollout, _ in made], [label for _, label in made]


def embedded_verdicts(
    rollouts: list[Rollout], processes: int, item_timeout_s: float
) -> tuple[list[Verdict], float]:
    """Embedded mode's verdicts of `rollouts` and its wall seconds, in a process of
    its own (its pool and sandboxes end with it; this one stays a plain producer)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        verdicts, seconds = pool.apply(
            _embedded_in_child, (rollouts, processes, item_timeout_s)
        )
    return verdicts, seconds


def _embedded_in_child(
    rollouts: list[Rollout], processes: int, item_timeout_s: float
) -> tuple[list[Verdict], float]:
    settings = ProducerSettings(
        processes=processes, item_timeout_s=item_timeout_s, cache_dir=None
    )
    warm = [Rollout(marked(r.response, "warm-up"), r.gold) for r in rollouts[:128]]
    with open_grader(None, settings=settings) as grader:
        grader.grade(warm)  # every process's sandbox started before the clock
        started = time.perf_counter()
        verdicts = grader.grade(rollouts)
        return verdicts, time.perf_counter() - started


def sandboxes_of(bench: Bench) -> int:
    """Code sandboxes the fleet's workers hold now: their model zygotes' bwrap
    processes (one per sandbox; bwrap's own child in the new namespace has a bwrap
    parent and is not counted). "bwrap.bin": device_kit.sh's wrapped bwrap."""
    stats = _process_table()
    tree = process_tree([worker.proc.pid for worker in bench.workers], stats)
    is_bwrap = {
        pid: _read(f"/proc/{pid}/comm").strip() in ("bwrap", "bwrap.bin")
        for pid in tree
    }
    return sum(
        1
        for pid in tree
        if is_bwrap[pid]
        and not is_bwrap.get(stats[pid][0], False)
        and ZYGOTE_ROLE in _read(f"/proc/{pid}/cmdline").replace("\0", " ")
    )


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:  # the process ended meanwhile
        return ""


def mismatches(
    fleet: Sequence[Verdict], embedded: Sequence[Verdict], labels: Sequence[str]
) -> list[str]:
    """One line for each rollout whose fleet verdict is not embedded mode's."""
    return [
        f"    rollout {i} {labels[i]}: fleet {f.status.value} ({f.reason}) "
        f"embedded {e.status.value} ({e.reason})"
        for i, (f, e) in enumerate(zip(fleet, embedded, strict=True))
        if f.replace(cached=False) != e.replace(cached=False)
    ]


def warm_up(bench: Bench, rollouts: list[Rollout], batch_size: int | None) -> None:
    """Code rollouts on every worker, so each one's sandbox starts before the
    clock: 2 x workers batches of the client's smallest size (16) or `batch_size`."""
    count = 2 * len(bench.workers) * (batch_size or 16)
    warm = [
        Rollout(marked(r.response, f"warm-up {k}"), r.gold)
        for k, r in enumerate((rollouts * (count // len(rollouts) + 1))[:count])
    ]
    bench.grade(warm, batch_size)


def scaling(
    bench: Bench,
    rollouts: list[Rollout],
    labels: list[str],
    embedded: list[Verdict],
    args: argparse.Namespace,
) -> int:
    """The table: per worker count, `args.rounds` cold runs, each checked against
    `embedded`; returns how many runs had a verdict differ."""
    n, bad_runs, first_rate = len(rollouts), 0, None
    for count in [int(x) for x in args.workers.split(",")]:
        if count != len(bench.workers):
            bench.resize(count)
        warm_up(bench, rollouts, args.batch_size)
        slots = sandboxes_of(bench)
        runs = []
        for _ in range(args.rounds):
            got: list[Verdict] = []

            def grade(into: list[Verdict] = got) -> float:
                before = _producer_cpu_s()
                into[:] = bench.grade(rollouts, args.batch_size)
                return _producer_cpu_s() - before

            runs.append(measured_run(bench, grade))
            wrong = mismatches(got, embedded, labels)
            if wrong:
                bad_runs += 1
                print(
                    f"!!! VERDICT MISMATCH: {count} workers, {len(wrong)} of {n} "
                    "verdicts differ from embedded mode's; the first ones:\n"
                    + "\n".join(wrong[:10]),
                    flush=True,
                )
        rate = print_scaling_row(count, runs, n, first_rate, unit="ms")
        first_rate = first_rate or rate
        print(
            f"          sandboxes held: {slots} ({slots / count:.1f} a worker); "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return bad_runs


def default_counts() -> str:
    cpus = os.cpu_count() or 1
    counts = [1, 2] + [c for c in (4, 8, 16, 32, 64) if c < cpus] + [cpus]
    return ",".join(str(c) for c in sorted(set(counts)))


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,2 workers, small")
    parser.add_argument("--workers", help="e.g. 1,2,4,8,16 (default 1, 2, ... CPUs)")
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="runs per count")
    parser.add_argument("--wrong-share", type=float, default=0.25)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--item-timeout-s", type=float, default=30.0)
    parser.add_argument("--keep-long", action="store_true")
    parser.add_argument("--data", type=Path, default=MBPP)
    args = parser.parse_args(argv)
    args.workers = args.workers or ("1,2" if args.quick else default_counts())
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.rollouts = args.rollouts or (512 if args.quick else 4096)
    return args


def fail(message: str, exit_code: int) -> SystemExit:
    print(f"bench_fleet_code: {message}", file=sys.stderr, flush=True)
    return SystemExit(exit_code)


def prepare(args: argparse.Namespace) -> tuple[list[Rollout], list[str], list[Verdict]]:
    """The rollouts, their labels and embedded mode's verdicts of them."""
    problem = sandbox_problem()
    if problem is not None:
        raise fail(problem, 2)
    if not args.data.is_file():
        raise fail(f"no MBPP file at {args.data} (--data)", 2)
    cpus = os.cpu_count() or 1
    print(
        f"machine: {cpus} CPUs, load average {os.getloadavg()[0]:.2f}; "
        f"bwrap {shutil.which('bwrap')}",
        flush=True,
    )
    rows = [json.loads(line) for line in args.data.read_text().splitlines()]
    short, long_ids = preflight(rows)
    chosen = rows if args.keep_long else short
    print(
        f"references: {len(rows)}; ran over {LONG_RUN_S} s on their own"
        f"{' (kept)' if args.keep_long else ' (left out)'}: {long_ids}",
        flush=True,
    )
    n = args.rollouts
    rollouts, labels = code_rollouts(chosen, n, args.wrong_share)
    embedded, embedded_s = embedded_verdicts(rollouts, cpus, args.item_timeout_s)
    statuses = Counter(v.status.value for v in embedded)
    print(
        f"{n} unique code rollouts ({len(chosen)} references, about "
        f"{args.wrong_share:.0%} with the body `return None`); embedded mode "
        f"({cpus} processes, cache off): {n / embedded_s:,.0f} rollouts/s, "
        f"verdicts {dict(statuses)}",
        flush=True,
    )
    if statuses["error"]:  # a grader that cannot run: nothing to compare
        errors = [v.reason for v in embedded if v.status is Status.ERROR]
        raise fail(f"!!! embedded mode answered error, e.g. {errors[0]!r}", 1)
    return rollouts, labels, embedded


def main(argv: Sequence[str] | None = None) -> int:
    # A SIGTERM (`timeout`) unwinds, so the fleet's processes are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = arguments(argv)
    rollouts, labels, embedded = prepare(args)
    print(
        f"fleet: nodes of 1 process, item timeout {args.item_timeout_s:.0f} s, "
        f"batch {args.batch_size or 'per job (client default)'}, cold cache, "
        f"median of {args.rounds}; CPU in ms a rollout",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        first = int(args.workers.split(",")[0])
        bench = Bench(Path(tmp), first, args.item_timeout_s, test_hooks=False)
        try:
            bad_runs = scaling(bench, rollouts, labels, embedded, args)
        finally:
            bench.close()
    print(f"load average now {os.getloadavg()[0]:.2f}")
    if bad_runs:
        raise fail(f"!!! FAILED: {bad_runs} run(s) had verdicts unlike embedded's", 1)
    print("every verdict of every run equals embedded mode's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
