"""Where a cold run with the cache on loses time against a run with it off (issue 11).

    python tests/bench/bench_cache_phases.py --pairs 20
    python tests/bench/bench_cache_phases.py --pairs 20 --without hash
    python tests/bench/bench_cache_phases.py --pairs 20 --without hash,held

`bench_overhead.py --cache-ab` gives the ratio; this says where the difference
sits. Each run is `gradefleet grade --processes 2` of the same 60,760 unique real
rollouts (as `bench_overhead.py` writes them), cache off and cold cache on in
alternating pairs, each run timed at its phases from inside the CLI process:
before the pool's verifier warm-up, the warm-up (one core idle), the pool's calls
(`run_line_units`: both cores grading), the gaps between them (the CLI writes a
chunk's output and reads the next, the workers idle: where they write the cache
rows they hold) and the tail after the last call (the last output written). With
each run's CPU per pool worker and its page faults.

`--without` takes a piece of the cache's work out of the cold runs, to tell what
it costs (bench only, by patching the workers, which are forked from the patched
CLI): `hash`, every unit key a random one in place of sha256 of the unit
(lookups miss, as they do in a cold run); `held`, no unit rows built or stored;
`checkpoint`, none of the workers' own WAL checkpoints between chunks (SQLite's
automatic one, once the WAL passes 1,000 pages, still runs in their commits).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import cli_run, write_input

# The CLI, with marks at its phases and each worker's CPU written at its exit. Runs
# as `python -c`: argv[1] is the comma-separated `--without` list, then the CLI's.
_DRIVER = r"""
import atexit, os, resource, sys, time

started = time.monotonic()
marks = []

def mark(name):
    marks.append((time.monotonic() - started, name))

def timed(owner, name):
    inner = getattr(owner, name)
    def wrapper(*args, **kwargs):
        mark(name + " start")
        try:
            return inner(*args, **kwargs)
        finally:
            mark(name + " end")
    setattr(owner, name, wrapper)

import producer.cli as cli
import producer.client.grader as grader
import workers.embedded.pool as local
from workers.cache.results import SqliteResultCache
from workers.cache.exact import ExactLayer

timed(grader._EmbeddedGrader, "run_line_units")
timed(local, "warm_up_verifier")
timed(cli, "grade_file")

without = set(filter(None, sys.argv.pop(1).split(",")))
if "hash" in without:
    ExactLayer.unit_key = lambda self, unit, body: os.urandom(16).hex()
if "held" in without:
    local._HeldRows.hold = lambda self, key, stored: None
if "checkpoint" in without:
    SqliteResultCache.checkpoint = lambda self: None

worker_main = local._worker_main

def counted_worker_main(*args, **kwargs):
    try:
        return worker_main(*args, **kwargs)
    finally:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = usage.ru_utime + usage.ru_stime
        os.write(2, f"WORKER {cpu_s:.4f} {usage.ru_minflt}\n".encode())

local._worker_main = counted_worker_main

@atexit.register
def report():
    for at_s, name in marks:
        sys.stderr.write(f"MARK {at_s:.6f} {name}\n")

cli.main()
"""

_MARK = re.compile(r"MARK ([0-9.]+) (\S+) (start|end)")
_WORKER = re.compile(r"WORKER ([0-9.]+) (\d+)")
_WITHOUT = ("hash", "held", "checkpoint")  # what the driver can take out
_PHASES = ("before warm-up", "warm-up", "grading", "gaps", "tail")


def run_phases(
    src: Path, out: Path, without: str, args: Sequence[str]
) -> dict[str, float]:
    """One CLI run: ms in each phase, ms of CPU and page faults per worker, wall."""
    driver = [sys.executable, "-c", _DRIVER, without]
    wall_s, stderr = cli_run(src, out, "--processes", "2", *args, program=driver)
    at: dict[str, list[float]] = {}
    for at_s, name, edge in _MARK.findall(stderr):
        at.setdefault(f"{name} {edge}", []).append(float(at_s) * 1000)
    starts, ends = at["run_line_units start"], at["run_line_units end"]
    warm_ms = at["warm_up_verifier end"][0] - at["warm_up_verifier start"][0]
    workers = [(float(cpu), int(faults)) for cpu, faults in _WORKER.findall(stderr)]
    return {
        "wall": wall_s * 1000,
        "before warm-up": at["warm_up_verifier start"][0],
        "warm-up": warm_ms,
        # The first call starts the pool: its warm-up is not grading.
        "grading": sum(e - s for s, e in zip(starts, ends, strict=True)) - warm_ms,
        "gaps": sum(s - e for s, e in zip(starts[1:], ends, strict=False)),
        "tail": at["grade_file end"][0] - ends[-1],
        "worker CPU": statistics.mean(cpu for cpu, _ in workers) * 1000,
        "worker faults": statistics.mean(faults for _, faults in workers),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=60_760)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument(
        "--without", default="", help=f"comma-separated: {', '.join(_WITHOUT)}"
    )
    args = parser.parse_args(argv)
    unknown = set(filter(None, args.without.split(","))) - set(_WITHOUT)
    if unknown:
        parser.error(f"unknown --without: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src, out, cache_dir = work / "in.jsonl", work / "out.jsonl", work / "cache"
        write_input(src, args.rollouts)
        modes = {
            "off": ("", ["--no-cache"]),
            "cold": (args.without, ["--cache-dir", str(cache_dir)]),
        }
        runs: dict[str, list[dict[str, float]]] = {"off": [], "cold": []}
        for pair in range(args.pairs):
            for mode in ("off", "cold") if pair % 2 == 0 else ("cold", "off"):
                shutil.rmtree(cache_dir, ignore_errors=True)
                without, flags = modes[mode]
                runs[mode].append(run_phases(src, out, without, flags))
    speed = [
        off["wall"] / cold["wall"] for off, cold in zip(*runs.values(), strict=True)
    ]
    label = f"cold{' without ' + args.without if args.without else ''}"
    print(
        f"{args.pairs} alternating pairs of {args.rollouts:,} rollouts, medians: "
        f"cache off against {label}; throughput {label} / off "
        f"{statistics.median(speed):.3f} (pairs {min(speed):.2f}-{max(speed):.2f})"
    )
    print(f"| | off | {label} | difference |\n|---|---|---|---|")
    for name in ("wall", *_PHASES, "worker CPU", "worker faults"):
        off = statistics.median(run[name] for run in runs["off"])
        cold = statistics.median(run[name] for run in runs["cold"])
        unit = "" if name == "worker faults" else " ms"
        cells = (f"{off:,.1f}{unit}", f"{cold:,.1f}{unit}", f"{cold - off:+,.1f}{unit}")
        print(f"| {name} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
