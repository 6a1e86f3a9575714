"""A/B of two checkouts' fleet workers on this machine, interleaved (issue 11).

    git worktree add /tmp/base <commit>
    python tests/bench/bench_fleet_ab.py /tmp/base . --rounds 6

This machine's speed drifts by 20% within minutes, so two `bench_overhead.py` runs
cannot tell a 5% change. Here both fleets (a private redis-server and two
`python -m workers` nodes each, one per checkout) are up at once; each round runs the
plain loop, then this checkout's `gradefleet grade --broker` against each fleet in
turn (the order alternates), on the same 60,760 unique real rollouts with the
fleet's result cache flushed. It prints each run's ratio to the round's plain loop
and the CPU each rollout cost the fleet's processes (workers, their sandbox
children, Redis; from /proc) and the producer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import (
    Fleet,
    _children,
    _children_cpu_s,
    _proc_cpu_s,
    cli_s,
    plain_loop_s,
    write_input,
)


def fleet_cpu_s(fleet: Fleet) -> float:
    """CPU seconds so far of a fleet's processes: worker nodes, their prefork
    children, the sandbox children (live ones, and those their parents reaped),
    redis-server."""
    total = _proc_cpu_s(fleet.redis.proc.pid)
    for worker in fleet.workers:
        total += _proc_cpu_s(worker.proc.pid)
        for child in _children(worker.proc.pid):
            total += _proc_cpu_s(child) + _proc_cpu_s(child, reaped=True)
            total += sum(_proc_cpu_s(kid) for kid in _children(child))
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs=2, type=Path, help="checkouts A and B")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rollouts", type=int, default=60_760)
    args = parser.parse_args()
    roots = [root.resolve() for root in args.roots]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src, out = work / "in.jsonl", work / "out.jsonl"
        write_input(src, args.rollouts)
        fleets: list[Fleet] = []
        try:
            for root in roots:
                fleets.append(Fleet(work, code_root=root))

            def run(fleet: Fleet) -> float:
                fleet.flush_cache()
                return cli_s(src, out, "--broker", fleet.redis.url)

            for fleet in fleets:  # connections, sandbox children, imports: warm
                run(fleet)
            ratios: list[list[float]] = [[], []]
            fleet_us: list[list[float]] = [[], []]
            producer_us: list[list[float]] = [[], []]
            for round_no in range(args.rounds):
                plain_s = plain_loop_s(src, work / "plain.jsonl")
                order = [0, 1] if round_no % 2 == 0 else [1, 0]
                for k in order:
                    fleet_before, producer_before = (
                        fleet_cpu_s(fleets[k]),
                        _children_cpu_s(),
                    )
                    ratios[k].append(plain_s / run(fleets[k]))
                    per_rollout = 1e6 / args.rollouts
                    fleet_us[k].append(
                        (fleet_cpu_s(fleets[k]) - fleet_before) * per_rollout
                    )
                    producer_us[k].append(
                        (_children_cpu_s() - producer_before) * per_rollout
                    )
                print(
                    f"  round {round_no + 1}: plain loop {plain_s:.2f} s; "
                    + "; ".join(
                        f"{'AB'[k]} {ratios[k][-1]:.2f}x, fleet {fleet_us[k][-1]:.0f} "
                        f"us, producer {producer_us[k][-1]:.0f} us a rollout"
                        for k in (0, 1)
                    ),
                    flush=True,
                )
        finally:
            for fleet in fleets:
                fleet.close()
    print(f"\nmedian of {args.rounds} rounds, {args.rollouts:,} rollouts:\n")
    print("| workers | vs the plain loop | fleet CPU us a rollout | producer |")
    print("|---|---|---|---|")
    for k, root in enumerate(roots):
        print(
            f"| {'AB'[k]}: {root} | {statistics.median(ratios[k]):.2f} "
            f"| {statistics.median(fleet_us[k]):.1f} "
            f"| {statistics.median(producer_us[k]):.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
