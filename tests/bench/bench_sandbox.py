"""Sandbox per-item overhead and embedded-mode (LocalPool) throughput vs in-process.

Run on demand (not collected by pytest)::

    python3 tests/bench/bench_sandbox.py [--processes 2] [--repeat 1]

1. Sandbox overhead: µs per item with a trivial grade function (the verifier's time
   excluded), one `grade()` call per item and streamed through `grade_many()`.
2. Real rollouts (Qwen2.5-Math MATH outputs + GSM8K model solutions): in-process
   `grade()` vs `LocalPool(processes=N)` without cache, then with a cold and a warm
   SQLite cache. Verdicts are checked equal to in-process grading.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The repository root, for `tests.helpers` (a script has only its folder on the path).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers import GSM8K_FILE, QWEN_FILE
from workers import verifier
from workers.embedded.batch import GradeItem
from workers.embedded.pool import LocalPool
from workers.models import ExtractionMethod, GradeOptions, Status, Verdict
from workers.sandbox.process import Sandbox

OPTIONS = GradeOptions()
TRIVIAL = Verdict(
    correct=True,
    status=Status.CORRECT,
    format_valid=True,
    extracted="4",
    extraction_method=ExtractionMethod.BOXED,
)
GSM8K_MODELS = (
    "175b_verification",
    "6b_finetuning",
    "6b_verification",
    "175b_finetuning",
)


def trivial_grade(
    response: str, gold: str, *, options: GradeOptions | None = None
) -> Verdict:
    return TRIVIAL


def rollouts(repeat: int) -> list[GradeItem]:
    pairs: list[tuple[str, str]] = []
    with QWEN_FILE.open() as f:
        for line in f:
            record = json.loads(line)
            pairs += [(code, record["gt"]) for code in record["code"]]
    with GSM8K_FILE.open() as f:
        for line in f:
            record = json.loads(line)
            pairs += [
                (record[m]["solution"], record["ground_truth"])
                for m in GSM8K_MODELS
                if m in record
            ]
    pairs *= repeat
    return [GradeItem(i, response, gold) for i, (response, gold) in enumerate(pairs)]


def bench_overhead(n_items: int = 5000, runs: int = 5) -> None:
    response = "Let me think step by step. " * 40 + "\\boxed{4}"  # ~1 KB
    with Sandbox(
        item_timeout_s=5.0,
        item_memory_bytes=256 << 20,
        grade_fn=trivial_grade,
        recycle_after_items=10**9,
    ) as sandbox:
        sandbox.grade(response, "4", OPTIONS)
        single, streamed = [], []
        for _ in range(runs):
            started = time.perf_counter()
            for _ in range(n_items):
                sandbox.grade(response, "4", OPTIONS)
            single.append((time.perf_counter() - started) / n_items * 1e6)
            started = time.perf_counter()
            sandbox.grade_many([(response, "4")] * n_items, OPTIONS)
            streamed.append((time.perf_counter() - started) / n_items * 1e6)
    print(
        f"sandbox overhead per item (trivial grade_fn, 1 KB response): "
        f"grade() {statistics.median(single):.1f} µs, "
        f"grade_many() {statistics.median(streamed):.1f} µs (median of {runs})"
    )


def bench_pool(items: list[GradeItem], processes: int) -> None:
    n = len(items)
    started = time.perf_counter()
    expected = [verifier.grade(it.response, it.gold, options=OPTIONS) for it in items]
    inproc_s = time.perf_counter() - started
    print(f"{n} rollouts: in-process grade() {inproc_s:.2f} s = {n / inproc_s:,.0f}/s")
    with LocalPool(
        processes=processes,
        item_timeout_s=5.0,
        item_memory_bytes=1 << 30,
        cache_path=None,
    ) as pool:
        pool.grade(items[:10], OPTIONS)  # workers started and warm
        started = time.perf_counter()
        verdicts = pool.grade(items, OPTIONS)
        pool_s = time.perf_counter() - started
    assert verdicts == expected, "LocalPool verdicts differ from in-process grade()"
    print(
        f"LocalPool({processes}) no cache: {pool_s:.2f} s = {n / pool_s:,.0f}/s, "
        f"{inproc_s / pool_s:.2f}x in-process"
    )
    with tempfile.TemporaryDirectory() as tmp:
        cache_path = Path(tmp) / "cache.sqlite3"
        with LocalPool(
            processes=processes,
            item_timeout_s=5.0,
            item_memory_bytes=1 << 30,
            cache_path=cache_path,
        ) as pool:
            for label in ("cold", "warm"):
                started = time.perf_counter()
                verdicts = pool.grade(items, OPTIONS)
                elapsed_s = time.perf_counter() - started
                hits = sum(v.cached for v in verdicts)
                print(
                    f"LocalPool({processes}) SQLite {label}: {n / elapsed_s:,.0f}/s "
                    f"(cache hits {hits}/{n})"
                )
                assert [v.replace(cached=False) for v in verdicts] == expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="repeat the data N times")
    args = parser.parse_args()
    bench_overhead()
    bench_pool(rollouts(args.repeat), args.processes)


if __name__ == "__main__":
    main()
