"""verl's reward loop on code rows: per-sample `compute_score` calls against one
`compute_score_batch` call, both measured in this run (issue 40, "Must show").

Run on demand (not collected by pytest)::

    python3 tests/bench/bench_code_adapters.py [--rows 120] [--repeat 2] [--url URL]

The rows are MBPP's reference programs (tests/data/code/mbpp_sanitized.jsonl,
microsoft/CodeT @35f54d6): the prompt's signature plus the body re-indented, as a
fenced program; `ground_truth` is verl's `sandbox_fusion` shape, a JSON string with
one `assert_case` (the row's `def check(candidate)` and `check(<entry point>)`),
`data_source="mbpp"`. Every program runs in a fresh sandbox.

Two ways verl calls a reward function, alternated `--repeat` times each:
- reward loop: `await compute_score(data_source=..., solution_str=...,
  ground_truth=..., extra_info=...)` per sample, all gathered at once (verl's
  naive reward-loop manager); our coalescer merges them into batches;
- batch manager: one `compute_score_batch(data_sources=..., ...)` call a step.

Each pass appends its own comment (a fresh run id and the pass) to every program,
so no pass is served from the result cache of an earlier pass or run. Printed:
rollouts/s of each (best pass), the ratio per-sample / batch (target >= 0.5), and
whether both gave the same verdicts.
Grading is on the embedded pool unless `--url` names a service or fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from producer.adapters import verl
from producer.client.grading import close_graders

MBPP = Path(__file__).resolve().parents[1] / "data" / "code" / "mbpp_sanitized.jsonl"


def verl_rows(count: int) -> list[dict[str, str]]:
    rows = []
    with MBPP.open(encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            body = textwrap.indent(textwrap.dedent(row["canonical_solution"]), "    ")
            check = f"{row['test']}\ncheck({row['entry_point']})\n"
            rows.append(
                {
                    "program": f"{row['prompt']}{body}",
                    "ground_truth": json.dumps({"assert_case": [check]}),
                }
            )
            if len(rows) == count:
                break
    return rows


def _responses(rows: list[dict[str, str]], tag: str) -> list[str]:
    return [f"```python\n{row['program']}\n# {tag}\n```" for row in rows]


async def per_sample(
    rows: list[dict[str, str]], tag: str, kwargs: dict[str, Any]
) -> tuple[float, list[str]]:
    """One step of the reward loop (on the caller's long-lived event loop, as
    verl's reward-loop worker keeps one)."""
    responses = _responses(rows, tag)
    started = time.perf_counter()
    results = await asyncio.gather(
        *[
            verl.compute_score(
                data_source="mbpp",
                solution_str=response,
                ground_truth=row["ground_truth"],
                extra_info={"index": i},
                **kwargs,
            )
            for i, (row, response) in enumerate(zip(rows, responses, strict=True))
        ]
    )
    return time.perf_counter() - started, [r["status"] for r in results]


def batch(
    rows: list[dict[str, str]], tag: str, kwargs: dict[str, Any]
) -> tuple[float, list[str]]:
    responses = _responses(rows, tag)
    started = time.perf_counter()
    results = verl.compute_score_batch(
        data_sources=["mbpp"] * len(rows),
        solution_strs=responses,
        ground_truths=[row["ground_truth"] for row in rows],
        extra_infos=[{"index": i} for i in range(len(rows))],
        **kwargs,
    )
    return time.perf_counter() - started, [r["status"] for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--url", default=None, help="http(s):// or redis:// grader")
    args = parser.parse_args()
    kwargs: dict[str, Any] = {"grader_url": args.url} if args.url else {}
    rows = verl_rows(args.rows)
    run = uuid.uuid4().hex[:12]
    per_sample_s, batch_s = [], []
    statuses: dict[str, list[str]] = {}
    with asyncio.Runner() as runner:
        # Warm-up: the pools and the sandboxes' zygotes start (not measured).
        runner.run(per_sample(rows[:8], f"{run}-warm-a", kwargs))
        batch(rows[:8], f"{run}-warm-b", kwargs)
        for n in range(args.repeat):
            took_s, statuses["per_sample"] = runner.run(
                per_sample(rows, f"{run}-s{n}", kwargs)
            )
            per_sample_s.append(took_s)
            took_s, statuses["batch"] = batch(rows, f"{run}-b{n}", kwargs)
            batch_s.append(took_s)
        runner.run(close_graders())
    count = len(rows)
    sample_rate = count / min(per_sample_s)
    batch_rate = count / min(batch_s)
    correct = statuses["batch"].count("correct")
    print(
        f"rows: {count} MBPP reference programs ({correct} correct); grader: "
        f"{args.url or 'embedded pool'}"
    )
    print(
        f"per-sample compute_score (reward loop): {sample_rate:8.1f} rollouts/s "
        f"(passes: {', '.join(f'{s:.2f}' for s in per_sample_s)} s)"
    )
    print(
        f"compute_score_batch (batch manager):    {batch_rate:8.1f} rollouts/s "
        f"(passes: {', '.join(f'{s:.2f}' for s in batch_s)} s)"
    )
    print(f"ratio per-sample / batch: {sample_rate / batch_rate:.2f} (target >= 0.5)")
    same = statuses["per_sample"] == statuses["batch"]
    print(f"same verdicts both ways: {same}")


if __name__ == "__main__":
    main()
