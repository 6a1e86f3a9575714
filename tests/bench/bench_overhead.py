"""What the machinery around the verifier costs (issue 11): one command, one table.

    python tests/bench/bench_overhead.py                  # the table, 3 rounds
    python tests/bench/bench_overhead.py --rollouts 20000 --rounds 1 --no-fleet
    python tests/bench/bench_overhead.py --profile        # + where each us goes
    python tests/bench/bench_overhead.py --hostile        # + the 8,192-rollout step

Every figure is a ratio to the plain loop measured in the same round (this machine is
shared and its speed drifts): `json.loads` -> `grade()` -> `to_dict` -> `json.dumps` on
one core, in a process of its own, against `gradefleet grade` on the same file (2
cores, per-item deadline and memory cap on, as users run it). The input is the real
rollouts of tests/data repeated with a distinct prefix per copy, so every line is a
unique response (no cache hit within a cold run); lines are shuffled. Round r runs the
rows in an order rotated by r. The CLI's wall time is the one its summary prints
(pool start-up and verifier warm-up included); the plain loop's excludes its imports.

`--profile` samples every process of one embedded run (and one fleet run) with
py-spy and charges each sample to a category by the innermost frame of ours it is
in: the per-process table of where each microsecond per rollout goes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_procs import (
    REPO_ROOT,
    prompts_with_samples,
    real_rollouts,
    start_redis,
    start_workers,
)

ITEM_TIMEOUT_S = 5.0
_CLI = [sys.executable, "-c", "from producer.cli import main; main()"]
_WALL = re.compile(r"wall time\s+([0-9.]+) s")


def write_input(path: Path, n: int) -> None:
    base = real_rollouts()
    rows = []
    for copy in range(n // len(base) + 1):
        rows += [
            {"response": f"[copy {copy}] {r.response}", "gold": r.gold} for r in base
        ]
    rows = rows[:n]
    random.Random(1).shuffle(rows)
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


_PLAIN = """
import json, sys, time
from workers import verifier
from workers.sandbox import warm_up_verifier
warm_up_verifier()
src, dst = sys.argv[1], sys.argv[2]
started = time.perf_counter()
with open(src, "rb") as lines, open(dst, "w") as out:
    for line in lines:
        record = json.loads(line)
        verdict = verifier.grade(record["response"], record["gold"])
        record.update(verdict.to_dict())
        out.write(json.dumps(record, ensure_ascii=False) + "\\n")
print(time.perf_counter() - started)
"""


def plain_loop_s(src: Path, dst: Path) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _PLAIN, str(src), str(dst)],
        env=_env(),
        check=True,
        capture_output=True,
        text=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def cli_s(src: Path, dst: Path, *args: str) -> float:
    """Wall seconds of `gradefleet grade` as its summary reports them."""
    command = [*_CLI, "grade", str(src), "-o", str(dst)]
    done = subprocess.run(
        [*command, "--item-timeout-s", str(ITEM_TIMEOUT_S), *args],
        env=_env(),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    match = _WALL.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"gradefleet failed ({done.returncode}):\n{done.stderr}")
    return float(match.group(1))


class Fleet:
    """A private redis-server and two `python -m workers` nodes (1 process each)."""

    def __init__(self, workdir: Path) -> None:
        self.redis = start_redis(workdir)
        self.cache_url = self.redis.url[:-1] + "1"
        self.workers = start_workers(
            self.redis.url, 2, item_timeout_s=ITEM_TIMEOUT_S, cache_url=self.cache_url
        )

    def flush_cache(self) -> None:
        import redis

        client = redis.Redis.from_url(self.cache_url)
        client.flushdb()
        client.close()

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.redis.stop()


def _children_cpu_s() -> float:
    """CPU seconds of every reaped descendant so far (a CLI's pool workers and
    sandbox children are reaped by their parents, so they count)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _rotated(src: Path, dst: Path, shift: int) -> None:
    lines = src.read_bytes().splitlines(keepends=True)
    shift %= len(lines)
    dst.write_bytes(b"".join(lines[shift:] + lines[:shift]))


def table(work: Path, n: int, rounds: int, fleet: Fleet | None) -> None:
    src = work / "in.jsonl"
    write_input(src, n)
    out = work / "out.jsonl"
    runs: dict[str, Callable[[Path, Path], float]] = {
        "plain loop, 1 core (json.loads -> grade -> to_dict -> json.dumps)": (
            plain_loop_s
        ),
        "embedded --processes 1 --no-cache": lambda s, d: cli_s(
            s, d, "--processes", "1", "--no-cache"
        ),
        "embedded --processes 2 --no-cache": lambda s, d: cli_s(
            s, d, "--processes", "2", "--no-cache"
        ),
    }
    cache_dir = work / "cache"

    def cold(s: Path, d: Path) -> float:
        shutil.rmtree(cache_dir, ignore_errors=True)
        return cli_s(s, d, "--processes", "2", "--cache-dir", str(cache_dir))

    def hit(s: Path, d: Path) -> float:  # the cold run just filled the cache
        return cli_s(s, d, "--processes", "2", "--cache-dir", str(cache_dir))

    runs["embedded --processes 2, cache on, cold"] = cold
    runs["embedded --processes 2, cache on, re-grade (all hits)"] = hit
    if fleet is not None:

        def fleet_run(s: Path, d: Path) -> float:
            fleet.flush_cache()
            return cli_s(s, d, "--broker", fleet.redis.url)

        fleet_run(src, out)  # connections, sandbox children, imports: warm
        runs["fleet --broker, 2 workers (producer + Redis on the same cores)"] = (
            fleet_run
        )
    names = list(runs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(rounds):
        rotated = work / f"in{round_no}.jsonl"
        _rotated(src, rotated, round_no * 997)
        # Alternate the order of the runs (the cache-hit run must follow the cold one).
        order = names if round_no % 2 == 0 else [names[0], *reversed(names[1:])]
        if round_no % 2:
            order = [name for name in order if "re-grade" not in name]
            at = order.index("embedded --processes 2, cache on, cold")
            order.insert(
                at + 1, "embedded --processes 2, cache on, re-grade (all hits)"
            )
        for name in order:
            before = _children_cpu_s()
            seconds[name].append(runs[name](rotated, out))
            cpu[name].append(_children_cpu_s() - before)
        plain = seconds[names[0]][-1]
        for name in names:
            ratios[name].append(plain / seconds[name][-1])
        print(
            f"  round {round_no + 1}: "
            + ", ".join(f"{ratios[name][-1]:.2f}" for name in names),
            flush=True,
        )
    print(f"\n{n:,} unique real rollouts, median of {rounds} rounds:\n")
    print(
        "| run | wall | rollouts/s | vs the plain loop | CPU us per rollout (all "
        "processes, start-up included) |\n|---|---|---|---|---|"
    )
    for name in names:
        wall = statistics.median(seconds[name])
        print(
            f"| {name} | {wall:.2f} s | {n / wall:,.0f} "
            f"| {statistics.median(ratios[name]):.2f} "
            f"| {statistics.median(cpu[name]) / n * 1e6:.0f} |"
        )
    cold_name = "embedded --processes 2, cache on, cold"
    hit_name = "embedded --processes 2, cache on, re-grade (all hits)"
    nocache_name = "embedded --processes 2 --no-cache"
    cold_s, hit_s = seconds[cold_name], seconds[hit_name]
    hit_vs_cold = [c / h for c, h in zip(cold_s, hit_s, strict=True)]
    cold_vs_off = [o / c for o, c in zip(seconds[nocache_name], cold_s, strict=True)]
    print(
        f"\ncache on, cold / cache off throughput: "
        f"{statistics.median(cold_vs_off):.2f} (target >= 1.0); "
        f"re-grade / cold: {statistics.median(hit_vs_cold):.2f} (target >= 3)"
    )


# --- --profile: py-spy over every process of one run ---

_CATEGORIES: Sequence[tuple[str, tuple[str, ...]]] = (
    ("write", ("graded_record", "dump_line", "atomic_output")),
    ("read", ("read_rows", "parse_line", "_count_rows")),
    ("cache", ("workers/cache.py", "sqlite")),
    ("prepare", ("prepare (workers/verifier", "failure_verdict")),
    ("grade", ("_child_grade", "grade (workers/verifier", "decide (workers/verifier")),
    ("Redis", ("redis/", "hiredis")),
    ("Celery", ("celery/", "kombu/", "billiard/")),
    ("IPC", ("childproc.py", "sandbox.py", "sandbox_child.py", "local.py", "json/")),
)


def _category(stack: str) -> str:
    # Idle waits first; then the first category (in this order) any frame names: a
    # verifier frame under `prepare` is preparing, a Redis call under the cache is
    # the cache's.
    frames = stack.split(";")
    if frames and any(w in frames[-1] for w in ("poll", "select", "sleep", "wait")):
        return "idle"
    for name, needles in _CATEGORIES:
        if any(needle in frame for frame in frames for needle in needles):
            return name
    return "other"


def _role(stack: str, pid: str, roles: dict[str, str]) -> str:
    if pid in roles:
        return roles[pid]
    if "_child_loop" in stack:
        return "sandbox child"
    if "_worker_loop" in stack:
        return "pool worker"
    if "BatchRun" in stack or "tasks.py" in stack:
        return "fleet worker"
    if "producer/cli.py" in stack or "producer/" in stack:
        return "CLI"
    return ""


def profile(work: Path, n: int, fleet: Fleet | None) -> None:
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        print("--profile needs py-spy (pip install py-spy)")
        return
    src = work / "in.jsonl"
    if not src.exists():
        write_input(src, n)
    runs = [("embedded --processes 2 --no-cache", ["--processes", "2", "--no-cache"])]
    if fleet is not None:
        fleet.flush_cache()
        runs.append(("fleet, 2 workers", ["--broker", fleet.redis.url]))
    for title, args in runs:
        raw = work / "profile.txt"
        command = [*_CLI, "grade", str(src)]
        command += ["-o", str(work / "out.jsonl"), "-q", *args]
        target = ["--", *command]
        pids: list[int] = []
        if args[0] == "--broker":  # sample the running workers, not just the CLI
            pids = [w.proc.pid for w in fleet.workers] if fleet else []
        spy = [py_spy, "record", "-r", "250", "-s", "-f", "raw"]
        spies = [
            subprocess.Popen(
                [*spy, "-p", str(pid), "-o", str(work / f"worker{pid}.txt")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for pid in pids
        ]
        time.sleep(1.0 if spies else 0.0)
        started = time.perf_counter()
        subprocess.run(
            [*spy, "-o", str(raw), *target],
            env=_env(),
            cwd=REPO_ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wall_s = time.perf_counter() - started
        for spy in spies:
            spy.send_signal(2)
            spy.wait(timeout=60)
        files = [raw, *(work / f"worker{pid}.txt" for pid in pids)]
        _print_profile(title, files, n, wall_s, rate_hz=250)


def _print_profile(
    title: str, files: list[Path], n: int, wall_s: float, rate_hz: int
) -> None:
    samples: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for path in files:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            pid_match = re.search(r"process (\d+)", stack)
            pid = pid_match.group(1) if pid_match else ""
            role = _role(stack, pid, {}) or "other process"
            samples[role][_category(stack)] += int(count)
    cats = ["read", "prepare", "cache", "IPC", "grade", "write", "Celery", "Redis"]
    cats += ["other", "idle"]
    print(
        f"\n{title}: CPU us per rollout by process (py-spy at {rate_hz} Hz, "
        f"{n:,} rollouts, {wall_s:.1f} s under the profiler)\n"
    )
    print("| process | " + " | ".join(cats) + " | total |")
    print("|---" * (len(cats) + 2) + "|")
    for role, counter in sorted(samples.items()):
        per = {c: counter.get(c, 0) / rate_hz / n * 1e6 for c in cats}
        busy = sum(v for c, v in per.items() if c != "idle")
        print(
            f"| {role} | "
            + " | ".join(f"{per[c]:.0f}" for c in cats)
            + f" | {busy:.0f} |"
        )


# --- --hostile: the 8,192-rollout step with hostile items ---

HOSTILE = [
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "\\boxed{1000000!}",
    "\\boxed{10^{10^{100}}}",
    "\\boxed{" + "(" * 5_000 + "1" + ")" * 5_000 + "}",
    "\\boxed{" + "9" * 200_000 + "}",
    "\\boxed{" + "x+" * 20_000 + "1}",
    "\\boxed{\\frac{" * 2_000 + "1" + "}{2}" * 2_000 + "}",
]


def hostile_step(work: Path, fleet: Fleet | None, reps: int) -> None:
    from workers import verifier
    from workers.models import Verdict

    rng = random.Random(2)
    step = []
    for group in rng.sample(prompts_with_samples(), 512):
        for j in range(16):
            r = group[j % len(group)]
            step.append({"response": f"[sample {j}] {r.response}", "gold": r.gold})
    hostile_at = sorted(random.Random(3).sample(range(len(step)), len(step) // 100))
    mixed = [dict(row) for row in step]
    for k, index in enumerate(hostile_at):
        mixed[index]["response"] = HOSTILE[k % len(HOSTILE)]
    clean_src, mixed_src = work / "step.jsonl", work / "step_hostile.jsonl"
    for path, rows in ((clean_src, step), (mixed_src, mixed)):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    expected = [verifier.grade(row["response"], row["gold"]) for row in mixed]
    modes = [("embedded --processes 2 --no-cache", ["--processes", "2", "--no-cache"])]
    if fleet is not None:
        modes.append(("fleet, 2 workers", ["--broker", fleet.redis.url]))
    for title, args in modes:
        clean_s, mixed_s = [], []
        for _ in range(reps):
            if fleet is not None:
                fleet.flush_cache()
            clean_s.append(cli_s(clean_src, work / "o.jsonl", *args))
            if fleet is not None:
                fleet.flush_cache()
            mixed_s.append(cli_s(mixed_src, work / "o.jsonl", *args))
        got = [
            Verdict.from_dict(json.loads(line))
            for line in (work / "o.jsonl").read_text().splitlines()
        ]
        differ = [
            i
            for i, (a, b) in enumerate(zip(got, expected, strict=True))
            if a.replace(cached=False) != b
        ]
        grew = statistics.median(mixed_s) - statistics.median(clean_s)
        print(
            f"\n[hostile] {title}: 8,192-rollout step, {len(hostile_at)} hostile; "
            f"clean {statistics.median(clean_s):.2f} s, hostile "
            f"{statistics.median(mixed_s):.2f} s: grew {grew:+.2f} s (item deadline "
            f"{ITEM_TIMEOUT_S:g} s); verdicts differing from in-process grade(): "
            f"{len(differ)} {differ[:5]}"
        )


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # so `finally` stops the fleet's processes


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=60_760)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-fleet", action="store_true")
    parser.add_argument("--no-table", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--hostile", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fleet = None if args.no_fleet else Fleet(work)
        try:
            if not args.no_table:
                table(work, args.rollouts, args.rounds, fleet)
            if args.profile:
                profile(work, args.rollouts, fleet)
            if args.hostile:
                hostile_step(work, fleet, reps=3)
        finally:
            if fleet is not None:
                fleet.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
