"""What the machinery around the verifier costs (issue 11): one command, one table.

    python tests/bench/bench_overhead.py                  # the table, 3 rounds
    python tests/bench/bench_overhead.py --rollouts 20000 --rounds 1 --no-fleet
    python tests/bench/bench_overhead.py --profile        # + where each us goes
    python tests/bench/bench_overhead.py --hostile        # + the 8,192-rollout step
    python tests/bench/bench_overhead.py --no-table --no-fleet --cache-ab 20
    python tests/bench/bench_overhead.py --no-table --no-fleet --fleet-workers 1,16 \
        --rollouts 200000                                # many cores: fleet scaling

Every figure is a ratio to the plain loop measured in the same round (this machine is
shared and its speed drifts): `json.loads` -> `grade()` -> `to_dict` -> `json.dumps` on
one core, in a process of its own, against `gradefleet grade` on the same file (2
cores, per-item deadline and memory cap on, as users run it). The input is the real
rollouts of tests/data repeated with a distinct prefix per copy, so every line is a
unique response (no cache hit within a cold run); lines are shuffled. Round r runs the
rows in an order rotated by r. The CLI's wall time is the one its summary prints
(pool start-up and verifier warm-up included); the plain loop's excludes its imports.

`--profile` prints where each microsecond per rollout goes: the CPU of each process
of an embedded run (CLI, pool workers, which grade in process; a run of 3n minus one
of n, so start-up drops out) and of a fleet run (producer, Celery main process, prefork
child, sandbox child, redis-server, read from /proc), and each step of the path
(read, prepare, grade, cache, IPC, write) timed alone on the same rollouts.
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
    HOSTILE,
    REPO_ROOT,
    prompts_with_samples,
    real_rollouts,
    scaling_row,
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
    env = {**os.environ, "PYTHONPATH": path}
    # As a user's install runs: with bytecode caches. Where the environment turns
    # them off (some sandboxes do), every CLI run compiled ~40 of our modules again,
    # 50-100 ms of a 0.7 s re-grade (the plain loop's imports are not timed).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


_PLAIN = """
import json, sys, time
from workers import verifier
from workers.sandbox.process import warm_up_verifier
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
    return cli_run(src, dst, *args)[0]


def cli_run(
    src: Path, dst: Path, *args: str, program: Sequence[str] = _CLI
) -> tuple[float, str]:
    """`gradefleet grade` (started as `program`): wall seconds as its summary
    reports them, and its stderr."""
    command = [*program, "grade", str(src), "-o", str(dst)]
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
    return float(match.group(1)), done.stderr


class Fleet:
    """A private redis-server and `python -m workers` nodes (1 process each)."""

    def __init__(
        self, workdir: Path, code_root: Path = REPO_ROOT, *, workers: int = 2
    ) -> None:
        self.redis = start_redis(workdir)
        self.cache_url = self.redis.url[:-1] + "1"
        self.workers = start_workers(
            self.redis.url,
            workers,
            item_timeout_s=ITEM_TIMEOUT_S,
            cache_url=self.cache_url,
            code_root=code_root,
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
    """CPU seconds of every reaped descendant so far (a CLI's pool workers, a fleet
    worker's sandbox children: reaped by their parents, so they count)."""
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
    _cache_size(cache_dir, n)
    print(
        f"\ncache on, cold / cache off throughput: "
        f"{statistics.median(cold_vs_off):.2f} (target >= 1.0); "
        f"re-grade / cold: {statistics.median(hit_vs_cold):.2f} (target >= 3)"
    )


def cache_ab(work: Path, n: int, rounds: int) -> None:
    """Cache on (cold) against off, run side by side in pairs (order alternating):
    the table's rounds put other runs between the two, and this machine's speed
    drifts by 10-20% from run to run, more than the difference asked about."""
    src = work / "in-ab.jsonl"
    write_input(src, n)
    out, cache_dir = work / "out-ab.jsonl", work / "cache-ab"
    modes = {"off": ["--no-cache"], "cold": ["--cache-dir", str(cache_dir)]}
    walls: dict[str, list[float]] = {"off": [], "cold": []}
    cpus: dict[str, list[float]] = {"off": [], "cold": []}
    for round_no in range(rounds):
        for mode in ("off", "cold") if round_no % 2 == 0 else ("cold", "off"):
            shutil.rmtree(cache_dir, ignore_errors=True)
            before = _children_cpu_s()
            walls[mode].append(cli_s(src, out, "--processes", "2", *modes[mode]))
            cpus[mode].append(_children_cpu_s() - before)
    speed = [o / c for o, c in zip(walls["off"], walls["cold"], strict=True)]
    cpu = [c / o for o, c in zip(cpus["off"], cpus["cold"], strict=True)]
    print(
        f"\ncache on, cold / off, {rounds} side-by-side pairs of {n:,} rollouts: "
        f"throughput median {statistics.median(speed):.3f} (mean "
        f"{statistics.mean(speed):.3f}, pairs {min(speed):.2f}-{max(speed):.2f}); "
        f"CPU cold / off median {statistics.median(cpu):.3f}"
    )


def _cache_size(cache_dir: Path, n: int) -> None:
    """What the cache holds after the runs: rows by layer, and file bytes."""
    import sqlite3

    path = cache_dir / "cache.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows = conn.execute("SELECT value FROM results").fetchall()
    conn.close()
    # A row of whole verdicts (a unit of lines, as the CLI stores them, or one
    # rollout, as `Grader.grade` does) holds `extraction_method`; an answer row not.
    whole = sum('"extraction_method"' in value for (value,) in rows)
    units = sum(value.startswith('{"unit"') for (value,) in rows)
    size = path.stat().st_size
    print(
        f"\ncache file after the runs: {len(rows):,} rows ({units:,} units of lines, "
        f"{whole - units:,} single rollouts, {len(rows) - whole:,} answers), "
        f"{size / 2**20:.1f} MiB: "
        f"{size / max(len(rows), 1):.0f} bytes a row, {size / n:.0f} a rollout"
    )


# --- --profile: CPU per rollout by process, and by step ---

_ROLES = """
import os, resource, sys
import workers.embedded.pool as local
inner = local._worker_main
def counted(*args):
    try:
        return inner(*args)
    finally:
        me = resource.getrusage(resource.RUSAGE_SELF)
        os.write(2, f"ROLE pool {me.ru_utime + me.ru_stime}\\n".encode())
local._worker_main = counted
from producer.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
me = resource.getrusage(resource.RUSAGE_SELF)
print(f"ROLE cli {me.ru_utime + me.ru_stime}", file=sys.stderr)
"""


def _embedded_roles(src: Path, dst: Path) -> dict[str, float]:
    """CPU seconds of the CLI and its pool workers (which grade in process)."""
    args = ["--processes", "2", "--no-cache", "--item-timeout-s", str(ITEM_TIMEOUT_S)]
    done = subprocess.run(
        [sys.executable, "-c", _ROLES, "grade", str(src), "-o", str(dst), "-q", *args],
        env=_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    roles = {"CLI": 0.0, "pool worker": 0.0}
    for line in done.stderr.splitlines():
        parts = line.split()
        if parts[:2] == ["ROLE", "cli"]:
            roles["CLI"] += float(parts[2])
        elif parts[:2] == ["ROLE", "pool"]:
            roles["pool worker"] += float(parts[2])
    return roles


def _plain_cpu_s(src: Path, dst: Path) -> float:
    before = _children_cpu_s()
    plain_loop_s(src, dst)
    return _children_cpu_s() - before


def profile(work: Path, n: int) -> None:
    """Per process: the CPU each rollout costs (the difference of a run of 3n and
    of n rollouts, so start-up drops out); per step: each step timed alone on the
    same rollouts in this process."""
    small, large = work / "p1.jsonl", work / "p3.jsonl"
    write_input(large, 3 * n)
    small.write_bytes(b"".join(large.read_bytes().splitlines(keepends=True)[:n]))
    out = work / "out.jsonl"
    per: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(3):
        one, three = _embedded_roles(small, out), _embedded_roles(large, out)
        for role in one:
            per[role].append((three[role] - one[role]) / (2 * n) * 1e6)
        one_s, three_s = _plain_cpu_s(small, out), _plain_cpu_s(large, out)
        per["plain loop (1 process)"].append((three_s - one_s) / (2 * n) * 1e6)
    print(
        f"\nCPU us per rollout by process, embedded --processes 2 --no-cache "
        f"(runs of {3 * n:,} minus {n:,} rollouts, median of 3):\n"
    )
    print("| process | CPU us per rollout |\n|---|---|")
    total = 0.0
    for role, values in per.items():
        value = statistics.median(values)
        if role in ("CLI", "pool worker"):
            total += value
        print(f"| {role} | {value:.1f} |")
    print(f"| embedded, all processes | {total:.1f} |")
    _steps(large, n)


def _steps(src: Path, n: int) -> None:
    """Each step of the embedded path timed alone (CPU, best of 3) on n rollouts."""
    import orjson

    from workers import verifier
    from workers.cache.exact import ExactLayer
    from workers.cache.results import SqliteResultCache, cache_entry, cache_keyer
    from workers.lines.records import InputRow, dump_line, graded_record, parse_line
    from workers.models import GradeOptions, Verdict
    from workers.sandbox.childproc import FrameBuffer, encode_frame
    from workers.sandbox.process import warm_up_verifier
    from workers.sizing import CACHE_WRITE_BEHIND_ROWS

    warm_up_verifier()
    lines = src.read_bytes().splitlines(keepends=True)[:n]
    rows: list[InputRow] = []
    for i, line in enumerate(lines):
        parsed = parse_line(line, i + 1)  # one row, or one row per sample
        rows += parsed if isinstance(parsed, list) else [parsed]  # type: ignore[list-item]
    rows = [row for row in rows if isinstance(row, InputRow)]
    options = GradeOptions()
    preps = [verifier.prepare(r.response, r.gold, options=options) for r in rows]
    verdicts = [verifier.decide(p, options=options) for p in preps]
    key_of = cache_keyer(verifier.GRADER_VERSION, options)
    pairs = list(zip(rows, verdicts, strict=True))

    def best(step: Callable[[], object]) -> float:
        times = []
        for _ in range(3):
            started = time.process_time()
            step()
            times.append(time.process_time() - started)
        return min(times) / len(rows) * 1e6

    def frames_round_trip() -> None:
        # What one rollout crosses: CLI -> pool worker (a batch), pool worker ->
        # CLI (the batch's verdicts).
        buffer = FrameBuffer()
        for start in range(0, len(rows), 64):
            batch = rows[start : start + 64]
            wire = [[i, r.response, r.gold] for i, r in enumerate(batch)]
            buffer.feed(encode_frame({"items": wire, "options": options.to_dict()}))
            buffer.pop()
            replies = verdicts[start : start + 64]
            buffer.feed(encode_frame([[k, v.to_dict()] for k, v in enumerate(replies)]))
            for _k, verdict in buffer.pop():
                Verdict.from_dict(verdict)

    with tempfile.TemporaryDirectory() as tmp:
        cache = SqliteResultCache(
            Path(tmp) / "c.sqlite", write_behind_rows=CACHE_WRITE_BEHIND_ROWS
        )
        exact = ExactLayer(cache, verifier.GRADER_VERSION)
        pairs_in = [(r.response, r.gold) for r in rows]
        exact.store(pairs_in, verdicts, options)
        cache.flush()
        keys = [key_of(p.decision_key) for p in preps if p.decision_key]
        entries = {
            k: cache_entry(v)
            for k, v in zip(keys, verdicts, strict=False)
            if v.status.value not in ("timeout", "memory_limit", "error")
        }

        def cache_round() -> None:
            for start in range(0, len(keys), 64):
                chunk = keys[start : start + 64]
                cache.get_many(chunk)
                cache.set_many({k: entries[k] for k in chunk if k in entries})

        steps = [
            ("read (parse_line)", lambda: [parse_line(x, 1) for x in lines]),
            (
                "prepare (extract + parse, in a pool worker)",
                lambda: [verifier.prepare(r.response, r.gold) for r in rows],
            ),
            (
                "grade (decide, in a pool worker)",
                lambda: [verifier.decide(p) for p in preps],
            ),
            (
                "cache key (sha256)",
                lambda: [key_of(p.decision_key or "") for p in preps],
            ),
            ("cache (SQLite lookup + store, 64 per batch)", cache_round),
            (
                "exact-response lookup (hash + SQLite + verdict, a re-grade's)",
                lambda: exact.lookup(pairs_in, options),
            ),
            ("IPC (every frame one rollout crosses, orjson)", frames_round_trip),
            (
                "write (graded_record + dump_line)",
                lambda: [dump_line(graded_record(r, v)) for r, v in pairs],
            ),
            (
                "write, stdlib json.dumps instead of orjson",
                lambda: [
                    json.dumps(graded_record(r, v), ensure_ascii=False)
                    for r, v in zip(rows, verdicts, strict=True)
                ],
            ),
            (
                "IPC frames with the stdlib instead of orjson (one verdict reply)",
                lambda: [json.loads(json.dumps({"v": v.to_dict()})) for v in verdicts],
            ),
            (
                "IPC frames with orjson (one verdict reply)",
                lambda: [
                    orjson.loads(orjson.dumps({"v": v.to_dict()})) for v in verdicts
                ],
            ),
        ]
        print(f"\nCPU us per rollout by step, each alone ({len(rows):,} rollouts):\n")
        print("| step | CPU us per rollout |\n|---|---|")
        for name, step in steps:
            print(f"| {name} | {best(step):.1f} |")
        cache.close()


def fleet_roles(work: Path, n: int, fleet: Fleet) -> None:
    """CPU per rollout of each fleet process (from /proc), one cold run of n."""
    src = work / "in.jsonl"
    if not src.exists():
        write_input(src, n)
    pids: dict[int, str] = {fleet.redis.proc.pid: "redis-server"}
    prefork: list[int] = []
    for worker in fleet.workers:
        pids[worker.proc.pid] = "Celery worker main process"
        for child in _children(worker.proc.pid):
            pids[child] = "prefork child (task, Redis bookkeeping, the unit in and out)"
            prefork.append(child)

    def grading_cpu_s() -> dict[int, float]:
        # Live grading children, and (per prefork child) those it has reaped:
        # they are recycled during the run, so their pids come and go.
        cpu = {-pid: _proc_cpu_s(pid, reaped=True) for pid in prefork}
        for pid in prefork:
            cpu.update({kid: _proc_cpu_s(kid) for kid in _children(pid)})
        return cpu

    fleet.flush_cache()
    before = {pid: _proc_cpu_s(pid) for pid in pids}
    grading_before = grading_cpu_s()
    cli_before = _children_cpu_s()
    cli_s(src, work / "out.jsonl", "--broker", fleet.redis.url)
    cli_cpu = _children_cpu_s() - cli_before
    grading_after = grading_cpu_s()
    per: dict[str, float] = collections.defaultdict(float)
    for pid, role in pids.items():
        per[role] += _proc_cpu_s(pid) - before[pid]
    # A child replaced during the run leaves the live set, and its whole life's CPU
    # joins its parent's reaped total: its CPU before the run is taken off too.
    per["grading child (line pool worker: parse, grade, render)"] = sum(
        grading_after.get(pid, 0.0) - grading_before.get(pid, 0.0)
        for pid in grading_before.keys() | grading_after.keys()
    )
    per["producer (gradefleet grade --broker)"] = cli_cpu
    print(f"\nfleet, 2 workers, {n:,} rollouts: CPU us per rollout by process\n")
    print("| process | CPU us per rollout |\n|---|---|")
    for role, seconds in per.items():
        print(f"| {role} | {seconds / n * 1e6:.1f} |")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _proc_cpu_s(pid: int, *, reaped: bool = False) -> float:
    """CPU seconds of `pid` itself, or (`reaped`) of the children it has reaped."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    first = 13 if reaped else 11  # cutime, cstime / utime, stime
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


def fleet_scaling(work: Path, n: int, counts: list[int], rounds: int) -> None:
    """`gradefleet grade --broker` on 1..N worker nodes (fresh ones per count, cold
    cache each run): the median of `rounds` runs per count and its ratio to the
    first count's. In line mode the CLI's one process only moves bytes, so it should
    not cap a big fleet the way a `GradingClient` does (`bench_fleet.py --workers`).
    For a many-core machine: the 16-worker target is >= 12x one worker."""
    src = work / "in.jsonl"
    write_input(src, n)
    out = work / "out.jsonl"
    print(
        f"fleet scaling, gradefleet grade --broker: {n:,} unique real rollouts, "
        f"cold cache, median of {rounds}; {os.cpu_count()} CPUs",
        flush=True,
    )
    first_rate = None
    for count in counts:
        fleet = Fleet(work, workers=count)
        try:
            cli_s(src, out, "--broker", fleet.redis.url)  # every worker warm
            walls, cli_cpu_s = [], []
            for _ in range(rounds):
                fleet.flush_cache()
                before = _children_cpu_s()  # the CLI's, once it is reaped
                walls.append(cli_s(src, out, "--broker", fleet.redis.url))
                cli_cpu_s.append(_children_cpu_s() - before)
        finally:
            fleet.close()
        rate = n / statistics.median(walls)
        first_rate = first_rate or rate
        print(
            scaling_row(count, rate, first_rate, walls)
            + f"; the CLI's CPU {statistics.median(cli_cpu_s) / n * 1e6:.1f} us "
            "a rollout)",
            flush=True,
        )


# --- --hostile: the 8,192-rollout step with hostile items ---


def hostile_step(work: Path, fleet: Fleet | None, reps: int) -> None:
    from workers import verifier

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
        got = [json.loads(line) for line in (work / "o.jsonl").read_text().splitlines()]
        differ = []
        for i, (line, want) in enumerate(zip(got, expected, strict=True)):
            # The fields an output line carries (not `cached`: it depends on order).
            wanted = {k: v for k, v in want.to_dict().items() if k in line}
            wanted.pop("cached", None)
            if any(line[k] != v for k, v in wanted.items()):
                differ.append(i)
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
    parser.add_argument("--hostile-reps", type=int, default=3)
    parser.add_argument(
        "--fleet-workers",
        metavar="COUNTS",
        help="e.g. 1,16: gradefleet grade --broker on that many worker nodes each",
    )
    parser.add_argument(
        "--cache-ab",
        type=int,
        default=0,
        metavar="PAIRS",
        help="also run cache on (cold) and off side by side, PAIRS times",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.cache_ab:  # first: the fleet's idle processes would be beside it
            cache_ab(work, args.rollouts, args.cache_ab)
        if args.fleet_workers:
            counts = [int(x) for x in args.fleet_workers.split(",")]
            fleet_scaling(work, args.rollouts, counts, args.rounds)
        fleet = None if args.no_fleet else Fleet(work)
        try:
            if not args.no_table:
                table(work, args.rollouts, args.rounds, fleet)
            if args.profile:
                profile(work, min(args.rollouts, 5_000))
                if fleet is not None:
                    fleet_roles(work, args.rollouts, fleet)
            if args.hostile:
                hostile_step(work, fleet, reps=args.hostile_reps)
        finally:
            if fleet is not None:
                fleet.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
