"""Throughput and latency of `workers.verifier.grade` against Math-Verify, same run.

Run on demand (not collected by pytest)::

    python3 tests/bench/bench_verifier.py [--quick] [--sets math500-correct,qwen]

Prints items/s and p50/p99 per-item latency for ours and Math-Verify on each set,
the ratio ours/theirs, how often the two agree, and (where the data has labels) each
grader's agreement with the labels. Math-Verify runs in the main thread with its
default signal-based timeouts, exactly as its README shows.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "tests" / "data"
QUICK_ITEMS = 100


@dataclass(frozen=True, slots=True)
class Item:
    response: str
    gold: str  # what our grader receives (any gold form it accepts)
    gold_latex: str  # the bare answer, for Math-Verify's parse("$...$")
    label: bool | None


@dataclass(frozen=True, slots=True)
class Run:
    verdicts: list[bool]
    latencies_s: list[float]

    @property
    def items_per_s(self) -> float:
        return len(self.latencies_s) / max(sum(self.latencies_s), 1e-12)

    def percentile_ms(self, fraction: float) -> float:
        ordered = sorted(self.latencies_s)
        index = min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))
        return ordered[index] * 1000


def _jsonl(name: str) -> list[dict[str, object]]:
    path = DATA_DIR / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def math500_items(*, wrong: bool) -> list[Item]:
    """Correct boxed answers, or (wrong=True) the next problem's gold as the answer."""
    records = _jsonl("math500_test.jsonl")
    answers = [str(record["answer"]) for record in records]
    items = []
    for index, gold in enumerate(answers):
        answer = answers[(index + 1) % len(answers)] if wrong else gold
        response = f"So the final answer is $\\boxed{{{answer}}}$."
        items.append(Item(response, gold, gold, None))
    return items


def qwen_items() -> list[Item]:
    items = []
    for record in _jsonl("qwen25math_math_cot_100.jsonl"):
        gold = str(record["gt"])
        for response, label in zip(record["code"], record["score"], strict=True):  # type: ignore[call-overload]
            items.append(Item(str(response), gold, gold, bool(label)))
    return items


_GSM8K_FINAL = re.compile(r"(?:####|A:)\s*(\S+)\s*$")


def gsm8k_items() -> list[Item]:
    items = []
    for record in _jsonl("gsm8k_example_model_solutions.jsonl"):
        ground_truth = str(record["ground_truth"])
        match = _GSM8K_FINAL.search(ground_truth)
        gold_latex = match.group(1).replace(",", "") if match else ground_truth
        for _model, output in sorted(record.items()):
            if isinstance(output, dict):
                label = bool(output["is_correct"])
                items.append(Item(output["solution"], ground_truth, gold_latex, label))
    return items


SETS: dict[str, Callable[[], list[Item]]] = {
    "math500-correct": lambda: math500_items(wrong=False),
    "math500-wrong": lambda: math500_items(wrong=True),
    "qwen-800": qwen_items,
    "gsm8k-5276": gsm8k_items,
}


def run_ours(items: Sequence[Item]) -> Run:
    from workers.verifier import grade

    verdicts, latencies = [], []
    for item in items:
        started = time.perf_counter()
        verdict = grade(item.response, item.gold)
        latencies.append(time.perf_counter() - started)
        verdicts.append(verdict.correct)
    return Run(verdicts, latencies)


def run_math_verify(items: Sequence[Item]) -> Run:
    from math_verify import parse, verify

    verdicts, latencies = [], []
    for item in items:
        started = time.perf_counter()
        try:
            gold = parse(f"${item.gold_latex}$")
            correct = bool(verify(gold, parse(item.response)))
        except Exception:  # Math-Verify's own failures count as "not correct"
            correct = False
        latencies.append(time.perf_counter() - started)
        verdicts.append(correct)
    return Run(verdicts, latencies)


def _warm_up() -> None:
    """Import and exercise both graders once so imports are not timed (ours imports
    SymPy lazily: the second item reaches it, as Math-Verify's parse does)."""
    warm = [Item("\\boxed{\\frac{1}{2}}", "0.5", "0.5", None)] * 3
    warm += [Item("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", "2\\sqrt{2}", None)] * 3
    run_ours(warm)
    run_math_verify(warm)


def _label_agreement(run: Run, items: Sequence[Item]) -> str:
    labelled = [(v, i.label) for v, i in zip(run.verdicts, items, strict=True)]
    pairs = [(v, label) for v, label in labelled if label is not None]
    if not pairs:
        return "-"
    return f"{sum(v == label for v, label in pairs) / len(pairs):.4f}"


def report(name: str, items: Sequence[Item]) -> None:
    gc.collect()
    ours = run_ours(items)
    gc.collect()
    theirs = run_math_verify(items)
    same = sum(a == b for a, b in zip(ours.verdicts, theirs.verdicts, strict=True))
    print(f"\n== {name}: {len(items)} items")
    print(f"{'grader':<12}{'items/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}"
          f"{'correct':>9}{'=label':>8}")  # fmt: skip
    for label, run in (("ours", ours), ("math-verify", theirs)):
        print(
            f"{label:<12}{run.items_per_s:>12.1f}{run.percentile_ms(0.5):>10.3f}"
            f"{run.percentile_ms(0.99):>10.3f}{max(run.latencies_s) * 1000:>10.1f}"
            f"{sum(run.verdicts):>9}{_label_agreement(run, items):>8}"
        )
    ratio = ours.items_per_s / max(theirs.items_per_s, 1e-12)
    print(f"ratio ours/theirs: {ratio:.1f}x; verdicts agree: {same / len(items):.4f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first 100 of each set")
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    logging.disable(logging.WARNING)  # Math-Verify logs every unparsable answer
    _warm_up()
    for name in args.sets.split(","):
        items = SETS[name]()
        if args.quick:
            items = items[:: max(1, len(items) // QUICK_ITEMS)][:QUICK_ITEMS]
        report(name, items)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
