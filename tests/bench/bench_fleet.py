"""Fleet benchmarks on real model outputs (run on demand, prints figures).

    python tests/bench/bench_fleet.py [--quick]           # sections 1-4 (~2 min)
    python tests/bench/bench_fleet.py --batch-sizes 16,32,64,128,256
    python tests/bench/bench_fleet.py --workers 1,2,4,8,16 --rollouts 100000  # scaling
    python tests/bench/bench_fleet.py --ceiling 1,16  # the machine's own, no fleet

Starts its own redis-server and `python -m workers` nodes (1 process each). The
result cache lives in Redis db 1 so it can be flushed between runs without touching
the broker's keys in db 0.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_procs import (
    HOSTILE,
    Worker,
    prompts_with_samples,
    real_rollouts,
    scaling_row,
    start_redis,
    start_workers,
)

from producer.client.fleet import GradingClient, Rollout
from workers import verifier
from workers.models import GradeOptions, Verdict
from workers.sizing import MAX_AUTO_BATCH_SIZE

HANG = "\\boxed{__gradefleet_test_hang__ %d}"


def ten_thousand(base: list[Rollout], n: int) -> list[Rollout]:
    out = (base * (n // len(base) + 1))[:n]
    random.Random(1).shuffle(out)
    return out


def rl_step(groups: list[list[Rollout]], prompts: int, samples: int) -> list[Rollout]:
    """`prompts` x `samples` rollouts; a prompt's samples cycle through its outputs."""
    rng = random.Random(2)
    chosen = rng.sample(groups, prompts)
    step = []
    for group in chosen:
        for j in range(samples):
            r = group[j % len(group)]
            # Distinct text per sample (as in GRPO); the final answer is unchanged.
            step.append(Rollout(f"[sample {j}] " + r.response, r.gold))
    return step


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


class Bench:
    def __init__(
        self,
        workdir: Path,
        workers: int,
        item_timeout_s: float,
        *,
        test_hooks: bool = True,
    ) -> None:
        """`test_hooks`: the hostile step sends a HANG answer; off, the workers grade
        as in production (from what they prepared), as the scaling figures want."""
        self.redis = start_redis(workdir)
        self.cache_url = self.redis.url[:-1] + "1"
        self.item_timeout_s = item_timeout_s
        self.test_hooks = test_hooks
        self.workers: list[Worker] = []
        self._clients: dict[int | None, GradingClient] = {}
        self.resize(workers)

    def resize(self, count: int) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = start_workers(
            self.redis.url,
            count,
            item_timeout_s=self.item_timeout_s,
            cache_url=self.cache_url,
            test_hooks=self.test_hooks,
        )
        for client in self._clients.values():  # every new worker gets warm too
            self._warm_up(client)

    def flush_cache(self) -> None:
        client = redis.Redis.from_url(self.cache_url)
        client.flushdb()
        client.close()

    def client(self, batch_size: int | None) -> GradingClient:
        """A connected, warmed-up client (created outside any timing); None: the
        client's own per-job batch size, as users get it."""
        if batch_size not in self._clients:
            client = GradingClient(
                self.redis.url,
                batch_size=batch_size,
                item_timeout_s=self.item_timeout_s,
                deadline_s=900,
            )
            self._warm_up(client)
            self._clients[batch_size] = client
        return self._clients[batch_size]

    def _warm_up(self, client: GradingClient) -> None:
        """Two batches per worker, so every worker has its connections and sandbox
        child before any timing (rounds then differ only in what they measure)."""
        count = (client.batch_size or MAX_AUTO_BATCH_SIZE) * 2 * len(self.workers)
        client.grade([Rollout(f"warm-up \\boxed{{{k}}}", "0") for k in range(count)])

    def grade(
        self, rollouts: Sequence[Rollout], batch_size: int | None = None
    ) -> list[Verdict]:
        return self.client(batch_size).grade(rollouts)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        for worker in self.workers:
            worker.stop()
        self.redis.stop()


def local_pool_s(
    rollouts: list[Rollout], processes: int, item_timeout_s: float
) -> float:
    """Seconds for the embedded pool to grade `rollouts`, measured in a fresh process.

    A process of its own, as the CLI's embedded mode runs: the pool's parent warms
    the verifier (SymPy, ~40k objects), and in this process those would make every
    later fleet round's producer pay for full garbage collections that a real
    producer, which never imports SymPy, does not.
    """
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return float(
            pool.apply(_local_pool_in_child, (rollouts, processes, item_timeout_s))
        )


def _local_pool_in_child(
    rollouts: list[Rollout], processes: int, item_timeout_s: float
) -> float:
    from workers.embedded.pool import LocalPool

    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalPool(
            processes=processes,
            item_timeout_s=item_timeout_s,
            item_memory_bytes=1024 * 1024 * 1024,
            cache_path=Path(tmp) / "cache.sqlite",
        ) as pool,
    ):
        # Warm up as the fleet: two batches per worker (64 items per local batch).
        warm = [Rollout(f"warm-up \\boxed{{{k}}}", "0") for k in range(128 * processes)]
        pool.grade(warm, GradeOptions())
        return timed(lambda: pool.grade(rollouts, GradeOptions()))


def section_overhead(bench: Bench, rollouts: list[Rollout], rounds: int) -> None:
    """[1] in `rounds` rounds, each with 2 fresh workers and a fresh LocalPool (so
    both start equally cold: new processes, empty result caches); then [2]."""
    n = len(rollouts)
    print(
        f"[1] fleet overhead, {n} real rollouts, cold caches, 2 processes each, "
        f"{rounds} rounds (fresh workers and pool each round):"
    )
    ratios = []
    for round_no in range(1, rounds + 1):
        if round_no > 1:
            bench.resize(len(bench.workers))
        bench.client(None)  # connect and warm up outside the timing
        bench.flush_cache()
        # Alternate which goes first: this machine's speed drifts within seconds.
        if round_no % 2:
            fleet_s = timed(lambda: bench.grade(rollouts))
            local_s = local_pool_s(rollouts, len(bench.workers), bench.item_timeout_s)
        else:
            local_s = local_pool_s(rollouts, len(bench.workers), bench.item_timeout_s)
            fleet_s = timed(lambda: bench.grade(rollouts))
        ratios.append(local_s / fleet_s)
        print(
            f"    round {round_no}: fleet (Redis, 2 workers) {n / fleet_s:7,.0f}/s, "
            f"embedded LocalPool (2) {n / local_s:7,.0f}/s, ratio {ratios[-1]:.2f}"
        )
    print(
        f"    median ratio fleet/local throughput = {statistics.median(ratios):.2f}"
        "  (target >= 0.8)"
    )
    section_cache_hits(bench, rollouts, rounds=rounds)


def section_cache_hits(bench: Bench, rollouts: list[Rollout], rounds: int) -> None:
    """[2]: re-grade the same rollouts (every answer cached), alternating with
    in-process grade() of them on one core: this machine's speed, measured next to
    each figure because it drifts (the ratio is the machine-independent figure)."""
    n = len(rollouts)
    bench.client(512)
    bench.grade(rollouts, batch_size=512)  # everything cached from here on
    hits, singles = [], []
    # In a process of its own, as the embedded pool (see `local_pool_s`).
    with multiprocessing.get_context("spawn").Pool(1) as baseline:
        baseline.apply(_in_process_s, (rollouts[:100],))  # imports and warm-up
        for _ in range(rounds):
            hits.append(timed(lambda: bench.grade(rollouts, batch_size=512)))
            singles.append(float(baseline.apply(_in_process_s, (rollouts,))))
    hit_s, single_s = statistics.median(hits), statistics.median(singles)
    ratio = statistics.median(s / h for s, h in zip(singles, hits, strict=True))
    print(
        f"[2] cache-hit path (re-grade, batch 512), median of {rounds}: "
        f"{n / hit_s:,.0f} rollouts/s end to end  (target >= 20,000); in-process "
        f"grade() on one core, alternating with it: {n / single_s:,.0f} rollouts/s; "
        f"hit path = {ratio:.2f}x that"
    )


def _in_process_s(rollouts: list[Rollout]) -> float:
    return timed(lambda: [verifier.grade(r.response, r.gold) for r in rollouts])


def section_rl_step(bench: Bench, step: list[Rollout], reps: int) -> list[Verdict]:
    times, verdicts = [], []
    for _ in range(reps):
        bench.flush_cache()  # cold cache each rep (in-step duplicates still hit)
        started = time.perf_counter()
        verdicts = bench.grade(step)
        times.append(time.perf_counter() - started)
    p50, p95 = _percentiles(times)
    print(
        f"[3] RL step {len(step)} rollouts (512 prompts x 16), cold cache per rep, "
        f"{reps} reps: p50 {p50:.2f} s  p95 {p95:.2f} s  (all: "
        + ", ".join(f"{t:.2f}" for t in times)
        + ")"
    )
    return verdicts


def section_hostile(
    bench: Bench, step: list[Rollout], clean: list[Verdict], reps: int
) -> None:
    rng = random.Random(3)
    hostile_at = sorted(rng.sample(range(len(step)), len(step) // 100))
    mixed = list(step)
    for k, index in enumerate(hostile_at):
        text = HANG % k if k == 0 else HOSTILE[k % len(HOSTILE)]
        mixed[index] = Rollout(text, step[index].gold)
    times, verdicts = [], []
    for _ in range(reps):
        bench.flush_cache()
        started = time.perf_counter()
        verdicts = bench.grade(mixed)
        times.append(time.perf_counter() - started)
    p50, p95 = _percentiles(times)
    skip = set(hostile_at)
    changed = [
        i
        for i, (a, b) in enumerate(zip(verdicts, clean, strict=True))
        if i not in skip and a.replace(cached=False) != b.replace(cached=False)
    ]
    statuses = sorted({verdicts[i].status.value for i in hostile_at})
    print(
        f"[4] same step with {len(hostile_at)} hostile items (1 hang + real "
        f"power towers / huge inputs): p50 {p50:.2f} s  p95 {p95:.2f} s; "
        f"hostile statuses {statuses}; other verdicts changed: {len(changed)}; "
        f"item deadline {bench.item_timeout_s:.0f} s"
    )


def _percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    p95_index = min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))
    return statistics.median(ordered), ordered[p95_index]


def batch_size_table(bench: Bench, rollouts: list[Rollout], sizes: list[int]) -> None:
    print(
        f"batch size table: {len(rollouts)} real rollouts, "
        f"{len(bench.workers)} workers, cold cache"
    )
    for size in sizes:
        bench.client(size)
        bench.flush_cache()
        seconds = timed(lambda: bench.grade(rollouts, batch_size=size))  # noqa: B023
        print(
            f"    batch {size:4d}: {seconds:6.2f} s  "
            f"{len(rollouts) / seconds:8.0f} rollouts/s"
        )


def unique_rollouts(base: list[Rollout], n: int) -> list[Rollout]:
    """`n` rollouts, no two alike (copies of the real ones get a prefix), so no
    rollout of a cold run is a cache hit and every worker count grades the same work."""
    out = [
        Rollout(f"[copy {copy}] {r.response}", r.gold)
        for copy in range(n // len(base) + 1)
        for r in base
    ][:n]
    random.Random(1).shuffle(out)
    return out


def _cpu_s(pids: Sequence[int]) -> float:
    """User+system CPU seconds of these processes and their descendants, read from
    /proc: a worker's sandbox child does the grading, and a child it recycled (every
    RECYCLE_AFTER_ITEMS) is in its parent's reaped-children times."""
    stats = _process_table()
    return sum(stats[pid][1] for pid in process_tree(pids, stats))


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of it and its reaped children), from /proc."""
    stats: dict[int, tuple[int, float]] = {}
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError, ValueError, IndexError):
            # Fields after the command name, which may hold spaces: man 5 proc.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            stats[int(entry.name)] = (
                int(fields[1]),
                sum(int(value) for value in fields[11:15]) * tick_s,
            )
    return stats


def process_tree(
    pids: Sequence[int], stats: dict[int, tuple[int, float]] | None = None
) -> list[int]:
    """These processes and all their descendants that are alive (`stats`: a
    `_process_table` already read)."""
    stats = _process_table() if stats is None else stats
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        if pid in stats:
            found.append(pid)
        todo += children.get(pid, [])
    return found


def _machine_ticks() -> tuple[int, int]:
    """(busy, all) CPU ticks of the whole machine since boot (/proc/stat)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


def _redis_cpu_s(url: str) -> float:
    client = redis.Redis.from_url(url)
    try:
        info = client.info("cpu")
    finally:
        client.close()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def scaling(
    bench: Bench,
    rollouts: list[Rollout],
    counts: list[int],
    batch_size: int | None,
    rounds: int,
    producers: int,
) -> None:
    """Cold runs of the same unique rollouts on 1..N worker nodes; per count, the
    median of `rounds` runs and where the CPU went (is the producer or Redis the
    limit once there are many workers?). `producers` > 1: that many processes, each
    with its own client, grade a share each at once (a sweep over a cluster)."""
    print(
        f"scaling: {len(rollouts)} unique real rollouts, cold cache, 1 process per "
        f"worker, batch {batch_size or 'per job (client default)'}, {producers} "
        f"producer process(es), median of {rounds}; {os.cpu_count()} CPUs; CPU in "
        "microseconds a rollout"
    )
    n = len(rollouts)
    base_rate = None
    context = multiprocessing.get_context("spawn")
    pool = None
    if producers > 1:
        initargs = (bench.redis.url, batch_size, bench.item_timeout_s, n)
        pool = context.Pool(producers, _producer_init, initargs)
    try:
        for count in counts:
            bench.resize(count)
            bench.client(batch_size)
            if pool is not None:  # connect every producer's client outside timing
                pool.map(_producer_grade, [(-1, producers)] * producers, chunksize=1)
            runs = [
                _scaling_run(bench, rollouts, batch_size, pool, producers)
                for _ in range(rounds)
            ]
            rate = print_scaling_row(count, runs, n, base_rate)
            base_rate = base_rate or rate
    finally:
        if pool is not None:
            pool.terminate()


def print_scaling_row(
    count: int,
    runs: list[tuple[float, list[float]]],
    n: int,
    first_rate: float | None,
    unit: str = "us",
) -> float:
    """Print a scaling table's row for `count` workers from its `runs` (each
    `measured_run`'s figures for `n` rollouts): the median run's rollouts/s, its ratio
    to `first_rate` (None: this is the first row), every wall, and where the CPU went
    per rollout, in `unit` ("us" or "ms"). Returns the median run's rollouts/s."""
    ordered = sorted(runs, key=lambda run: run[0])
    seconds, (producer_s, redis_s, workers_s, busy) = ordered[len(ordered) // 2]
    rate = n / seconds
    scale = 1e6 if unit == "us" else 1e3
    print(
        scaling_row(count, rate, first_rate or rate, [run[0] for run in ordered])
        + f")  CPU/rollout ({unit}): producers {scale * producer_s / n:5.1f}  redis "
        f"{scale * redis_s / n:5.1f}  workers {scale * workers_s / n:6.1f}"
        f"  (producers busy {producer_s / seconds:.0%} of a core, redis "
        f"{redis_s / seconds:.0%}; all CPUs {busy:.0%} busy)",
        flush=True,
    )
    return rate


def measured_run(bench: Bench, grade: Callable[[], float]) -> tuple[float, list[float]]:
    """(seconds, [producer, redis, worker CPU seconds, share of all CPUs busy]) of
    one cold run (the cache flushed first); `grade` grades and returns the CPU
    seconds the producers spent."""
    worker_pids = [worker.proc.pid for worker in bench.workers]
    bench.flush_cache()
    before = (_redis_cpu_s(bench.redis.url), _cpu_s(worker_pids), *_machine_ticks())
    started = time.perf_counter()
    producer_s = grade()
    seconds = time.perf_counter() - started
    after = (_redis_cpu_s(bench.redis.url), _cpu_s(worker_pids), *_machine_ticks())
    machine_busy = (after[2] - before[2]) / max(1, after[3] - before[3])
    return seconds, [
        producer_s,
        after[0] - before[0],
        after[1] - before[1],
        machine_busy,
    ]


def _scaling_run(
    bench: Bench,
    rollouts: list[Rollout],
    batch_size: int | None,
    pool: Any,
    producers: int,
) -> tuple[float, list[float]]:
    """`measured_run` of one cold run of `rollouts`: one client, or a share each in
    the `pool`'s producer processes."""

    def grade() -> float:
        if pool is None:
            producer_before = _producer_cpu_s()
            bench.grade(rollouts, batch_size)
            return _producer_cpu_s() - producer_before
        shares = [(k, producers) for k in range(producers)]
        return float(sum(pool.map(_producer_grade, shares, chunksize=1)))

    return measured_run(bench, grade)


_PRODUCER: dict[str, Any] = {}


def _producer_init(
    broker_url: str, batch_size: int | None, item_timeout_s: float, n: int
) -> None:
    """A producer process's client and the whole run's rollouts (built here, not
    sent: the same list as the parent's, from the same seed)."""
    _PRODUCER["client"] = GradingClient(
        broker_url, batch_size=batch_size, item_timeout_s=item_timeout_s, deadline_s=900
    )
    _PRODUCER["rollouts"] = unique_rollouts(real_rollouts(), n)


def _producer_grade(share: tuple[int, int]) -> float:
    """Grade share k of `producers` (k = -1: one rollout, to connect); the CPU
    seconds it took."""
    k, producers = share
    rollouts = _PRODUCER["rollouts"]
    mine = rollouts[:1] if k < 0 else rollouts[k::producers]
    before = _producer_cpu_s()
    _PRODUCER["client"].grade(mine)
    return _producer_cpu_s() - before


def plain_ceiling(counts: list[int], rounds: int) -> None:
    """What this machine gives any CPU-bound Python: `count` independent in-process
    grading loops at once (no fleet, 20,000 unique rollouts each) against one.
    Shared cores (SMT), clocks and the kernel bound the fleet's scaling to this."""
    context = multiprocessing.get_context("spawn")
    base_rate = None
    for count in counts:
        with context.Pool(count, _plain_init, (_PLAIN_ROLLOUTS,)) as pool:
            pool.map(_plain_grade, [200] * count, chunksize=1)  # warm, every process
            tasks = [_PLAIN_ROLLOUTS] * count
            walls = [
                timed(partial(pool.map, _plain_grade, tasks, chunksize=1))
                for _ in range(rounds)
            ]
        rate = count * _PLAIN_ROLLOUTS / statistics.median(walls)
        base_rate = base_rate or rate
        print(
            f"    {count:3d} plain loops at once: {rate:9,.0f} rollouts/s  "
            f"{rate / base_rate:5.2f}x one  (walls: "
            + ", ".join(f"{wall:.2f}" for wall in walls)
            + ")",
            flush=True,
        )


_PLAIN_ROLLOUTS = 20_000
_PLAIN: list[Rollout] = []


def _plain_init(n: int) -> None:
    """Build the rollouts here (sending them would time the pickling) and warm up."""
    from workers.sandbox.process import warm_up_verifier

    _PLAIN[:] = unique_rollouts(real_rollouts(), n)
    warm_up_verifier()


def _plain_grade(n: int) -> None:
    for rollout in _PLAIN[:n]:
        verifier.grade(rollout.response, rollout.gold)


def _producer_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller, fewer reps")
    parser.add_argument("--batch-sizes", help="e.g. 16,32,64,128,256: table only")
    parser.add_argument("--workers", help="e.g. 1,2,4,8,16: scaling only")
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="batch size for --workers (default: the client's, sized per job)",
    )
    parser.add_argument("--item-timeout-s", type=float, default=5.0)
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs per count for --workers"
    )
    parser.add_argument(
        "--ceiling",
        help="e.g. 1,16: that many in-process grading loops at once (no fleet)",
    )
    parser.add_argument(
        "--producers",
        type=int,
        default=1,
        help="for --workers: processes that grade a share each at once",
    )
    args = parser.parse_args(argv)
    n = args.rollouts or (4_000 if args.quick else 10_000)
    reps = 2 if args.quick else 5
    base = real_rollouts()
    rollouts = unique_rollouts(base, n) if args.workers else ten_thousand(base, n)
    if args.ceiling:
        print(f"machine ceiling: {os.cpu_count()} CPUs, median of {args.rounds}")
        plain_ceiling([int(x) for x in args.ceiling.split(",")], args.rounds)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), 2, args.item_timeout_s, test_hooks=not args.workers)
        try:
            if args.batch_sizes:
                batch_size_table(
                    bench, rollouts, [int(x) for x in args.batch_sizes.split(",")]
                )
            elif args.workers:
                counts = [int(x) for x in args.workers.split(",")]
                scaling(
                    bench,
                    rollouts,
                    counts,
                    args.batch_size,
                    args.rounds,
                    args.producers,
                )
            else:
                section_overhead(bench, rollouts, rounds=1 if args.quick else 5)
                step = rl_step(prompts_with_samples(), 512, 16)
                clean = section_rl_step(bench, step, reps)
                section_hostile(bench, step, clean, reps)
        finally:
            bench.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
