"""MBPP's reference programs (../shared/data/code/mbpp_sanitized.jsonl) through
`grade_code`: how many are correct, and each other one with its verdict's reason.

Run on demand::

    python3 tests/bench/mbpp_code_references.py                   # the references
    python3 tests/bench/mbpp_code_references.py --body "    return None"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.code.grade import grade_code

MBPP = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "code"
    / "mbpp_sanitized.jsonl"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--body", help="grade this body instead of each reference")
    args = parser.parse_args()
    rows = [json.loads(line) for line in MBPP.read_text().splitlines()]
    started = time.perf_counter()
    correct = 0
    for row in rows:
        response = row["canonical_solution"] if args.body is None else args.body
        verdict = grade_code(response, row, prompt=row["prompt"],
                             entry_point=row["entry_point"])  # fmt: skip
        correct += verdict.correct
        if not verdict.correct and args.body is None:
            print(row["task_id"], verdict.status.value, verdict.reason, verdict.failure)
    print(f"correct {correct}/{len(rows)} ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
