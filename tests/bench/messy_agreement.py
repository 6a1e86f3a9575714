"""Agreement of `workers.verifier.grade` with the labels of real model outputs.

Run on demand (not collected by pytest)::

    python3 tests/bench/messy_agreement.py [--math-verify] [--show PREFIX]

One row per set: `messy_dev.jsonl` by id prefix, Qwen2.5-Math CoT (800) and GPT-3
GSM8K (5,276). Columns count our verdict against the set's own label (TP: both
correct, FN: label correct and ours not, FP: ours correct and label not, TN: both not;
rows with a null label are counted apart as `null->ok` / `null->no`). `recall` is
TP / (TP + FN) and `precision` TP / (TP + FP) against the raw labels; the `adj`
columns use the reviewed lists in `tests/unit/verifier/*_disagreements.json` (where a
review says ours is right, the truth is ours) so the remaining misses are real.
`--math-verify` adds the same counts for Math-Verify; `--show PREFIX` prints our
disagreements with the label (and every null-label row we grade correct) for that
set, for review.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "tests" / "data"
REVIEWED_PATHS = [
    ROOT / "tests" / "unit" / "verifier" / name
    for name in ("real_output_disagreements.json", "messy_dev_disagreements.json")
]


@dataclass(frozen=True, slots=True)
class Row:
    item_id: str
    response: str
    gold: str
    label: bool | None


def _jsonl(name: str) -> Iterator[dict[str, object]]:
    with (DATA_DIR / name).open(encoding="utf-8") as handle:
        for line in handle:
            yield json.loads(line)


def messy_rows() -> Iterator[Row]:
    for record in _jsonl("messy_dev.jsonl"):
        label = record["label"]
        yield Row(
            str(record["id"]),
            str(record["response"]),
            str(record["gold"]),
            None if label is None else bool(label),
        )


def qwen_rows() -> Iterator[Row]:
    for record in _jsonl("qwen25math_math_cot_100.jsonl"):
        pairs = zip(record["code"], record["score"], strict=True)  # type: ignore[call-overload]
        for sample, (response, label) in enumerate(pairs):
            item_id = f"qwen:{record['idx']}:{sample}"
            yield Row(item_id, str(response), str(record["gt"]), bool(label))


def gsm8k_rows() -> Iterator[Row]:
    for number, record in enumerate(_jsonl("gsm8k_example_model_solutions.jsonl")):
        for model, output in sorted(record.items()):
            if isinstance(output, dict):
                item_id = f"gsm8k:{number}:{model}"
                gold = str(record["ground_truth"])
                yield Row(item_id, output["solution"], gold, bool(output["is_correct"]))


def set_name(item_id: str) -> str:
    """`sx-gsm8k-zs-00023` -> `sx-gsm8k-zs`; `qwen:3:1` -> `qwen`."""
    if ":" in item_id:
        return item_id.split(":", 1)[0]
    return item_id.rsplit("-", 1)[0]


def ours(row: Row) -> bool:
    from workers.verifier import grade

    return grade(row.response, row.gold).correct


def math_verify(row: Row) -> bool:
    from math_verify import parse, verify

    gold = row.gold
    if "####" in gold:
        gold = gold.rsplit("####", 1)[1].strip().replace(",", "")
    elif "\n" in gold and "A:" in gold:
        gold = gold.rsplit("A:", 1)[1].strip().replace(",", "")
    try:
        return bool(verify(parse(f"${gold}$"), parse(row.response)))
    except Exception:  # Math-Verify's own failures count as "not correct"
        return False


@dataclass
class Counts:
    tp: int = 0
    fn: int = 0
    fp: int = 0
    tn: int = 0
    null_ok: int = 0
    null_no: int = 0
    adj_tp: int = 0
    adj_fn: int = 0
    adj_fp: int = 0

    def add(self, verdict: bool, label: bool | None, truth: bool | None) -> None:
        if label is None:
            if verdict:
                self.null_ok += 1
            else:
                self.null_no += 1
        elif label and verdict:
            self.tp += 1
        elif label:
            self.fn += 1
        elif verdict:
            self.fp += 1
        else:
            self.tn += 1
        if truth is not None:
            self.adj_tp += truth and verdict
            self.adj_fn += truth and not verdict
            self.adj_fp += verdict and not truth

    def cells(self) -> str:
        recall = self.tp / max(1, self.tp + self.fn)
        precision = self.tp / max(1, self.tp + self.fp)
        adj_recall = self.adj_tp / max(1, self.adj_tp + self.adj_fn)
        return (
            f"{self.tp:>6}{self.fn:>6}{self.fp:>6}{self.tn:>6}"
            f"{self.null_ok:>9}{self.null_no:>9}{recall:>8.3f}{precision:>8.3f}"
            f"{adj_recall:>9.3f}{self.adj_fn:>8}{self.adj_fp:>8}"
        )


HEADER = (
    f"{'set':<14}{'grader':<8}{'TP':>6}{'FN':>6}{'FP':>6}{'TN':>6}{'null->ok':>9}"
    f"{'null->no':>9}{'recall':>8}{'prec':>8}{'adj rec':>9}{'adj FN':>8}{'adj FP':>8}"
)


def reviewed_truth() -> dict[str, bool]:
    """The adjudicated truth of every reviewed row (absent rows: the label holds)."""
    truth: dict[str, bool] = {}
    entries = []
    for path in REVIEWED_PATHS:
        if path.exists():
            entries.extend(json.loads(path.read_text(encoding="utf-8")))
    for entry in entries:
        ours_value, label = bool(entry["ours"]), entry["label"]
        if entry["right"] == "ours":
            truth[str(entry["id"])] = ours_value
        elif entry["right"] == "label" and label is not None:
            truth[str(entry["id"])] = bool(label)
    return truth


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--math-verify", action="store_true")
    parser.add_argument("--show", default="", help="print this set's disagreements")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    logging.disable(logging.WARNING)
    graders: list[tuple[str, Callable[[Row], bool]]] = [("ours", ours)]
    if args.math_verify:
        graders.append(("mathv", math_verify))
    truth = reviewed_truth()
    table: dict[tuple[str, str], Counts] = {}
    for rows in (messy_rows(), qwen_rows(), gsm8k_rows()):
        for row in rows:
            name = set_name(row.item_id)
            for grader, judge in graders:
                verdict = judge(row)
                row_truth = truth.get(row.item_id, row.label)
                table.setdefault((name, grader), Counts()).add(
                    verdict, row.label, row_truth
                )
                if (
                    grader == "ours"
                    and name == args.show
                    and (verdict != row.label and (row.label is not None or verdict))
                ):
                    _show(row, verdict)
    print(HEADER)
    messy_total: dict[str, Counts] = {}
    for (name, grader), counts in table.items():
        print(f"{name:<14}{grader:<8}{counts.cells()}")
        if not name.startswith(("qwen", "gsm8k")):
            total = messy_total.setdefault(grader, Counts())
            for field in vars(counts):
                setattr(total, field, getattr(total, field) + getattr(counts, field))
    for grader, counts in messy_total.items():
        print(f"{'messy (all)':<14}{grader:<8}{counts.cells()}")
    return 0


def _show(row: Row, verdict: bool) -> None:
    from workers.verifier import grade

    v = grade(row.response, row.gold)
    tail = row.response[-300:].replace("\n", "\\n")
    print(
        f"--- {row.item_id} label={row.label} ours={verdict} gold={row.gold!r}\n"
        f"    extracted={v.extracted!r} method={v.extraction_method.value} "
        f"status={v.status.value} reason={v.reason!r}\n    tail: {tail}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
