"""`gradefleet report` speed and memory, run on demand (not in CI).

1. The 10,000-rollout bench file (the real Qwen2.5-Math and GSM8K outputs that
   bench_fleet.py grades, graded here in-process, with their prompts' ids): wall time
   of the whole `gradefleet report` command (a fresh process: interpreter start,
   imports, reading, statistics), median of 5. Target: under 2 s.
2. A 1,000,000-line graded file (125,000 prompts x 8 samples, 5 groups): wall time and
   the peak resident memory (ru_maxrss) of the report process, next to the file size.

    python3 tests/bench/bench_report.py [--lines 1000000]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.helpers import real_rollouts  # noqa: E402
from workers.lines.records import dump_line  # noqa: E402
from workers.verifier import grade  # noqa: E402

RUN = "import sys; from producer.cli import main; main(sys.argv[1:])"


def bench_file(path: Path, n: int = 10_000) -> None:
    """The bench's 10,000 real rollouts, graded, as `gradefleet grade` writes them;
    rollouts of one source text share a prompt id (uid)."""
    base = real_rollouts()
    out = (base * (n // len(base) + 1))[:n]
    random.Random(1).shuffle(out)
    uids: dict[str, int] = {}
    with path.open("w") as handle:
        for line_no, rollout in enumerate(out, start=1):
            verdict = grade(rollout.response, rollout.gold)
            uid = uids.setdefault(rollout.gold, len(uids))
            record = {
                "uid": uid,
                "data_source": "math" if "\\boxed" in rollout.response else "gsm8k",
                "response": rollout.response,
                "gold": rollout.gold,
                **verdict.to_dict(),
                "gradefleet_line": line_no,
            }
            handle.write(dump_line(record))


def million_file(path: Path, lines: int) -> None:
    rng = random.Random(3)
    statuses = ["correct"] * 6 + ["wrong"] * 3 + ["no_answer"]
    with path.open("w") as handle:
        for i in range(lines):
            status = rng.choice(statuses)
            answer = str(rng.randrange(4)) if status != "no_answer" else None
            record = {
                "uid": f"p{i // 8}",
                "sample_idx": i % 8,
                "data_source": f"source{(i // 8) % 5}",
                "response": f"... so the answer is \\boxed{{{answer}}}",
                "gold": "1",
                "correct": status == "correct",
                "status": status,
                "format_valid": status != "no_answer",
                "extracted": answer,
                "canonical_pred": answer,
                "grader_version": "gradefleet-bench",
                "cached": False,
                "gradefleet_line": i + 1,
            }
            handle.write(json.dumps(record) + "\n")


def run_report(*args: str) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (KiB) of one
    `gradefleet report` process. CPU time is printed too because the wall time of a
    shared machine includes waiting for a core."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu_before = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", RUN, "report", *args],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=REPO_ROOT,
    )
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = usage.ru_utime + usage.ru_stime - cpu_before
    return seconds, cpu_s, max(usage.ru_maxrss, before)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lines", type=int, default=1_000_000, help="of the big file; 0 skips it"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "bench10k.jsonl"
        bench_file(small)
        runs = [run_report(str(small), "--by", "data_source") for _ in range(5)]
        times = [wall for wall, _, _ in runs]
        cpu = [cpu_s for _, cpu_s, _ in runs]
        size_mb = small.stat().st_size / 1e6
        print(
            f"report, 10,000 graded rollouts ({size_mb:.1f} MB): "
            f"wall median {statistics.median(times):.2f} s of 5 "
            f"(min {min(times):.2f}, max {max(times):.2f}), "
            f"CPU median {statistics.median(cpu):.2f} s; target < 2 s"
        )
        if args.lines <= 0:
            return 0
        big = Path(tmp) / "big.jsonl"
        million_file(big, args.lines)
        size_mb = big.stat().st_size / 1e6
        # A fresh process per measurement: ru_maxrss of children is a running max,
        # so the small runs above (lower) cannot hide the big one.
        seconds, cpu_s, peak_kib = run_report(str(big), "--by", "data_source")
        print(
            f"report, {args.lines:,} graded lines ({size_mb:,.0f} MB, "
            f"{args.lines // 8:,} prompts x 8): wall {seconds:.1f} s, "
            f"CPU {cpu_s:.1f} s, peak RSS {peak_kib / 1024:.0f} MB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
