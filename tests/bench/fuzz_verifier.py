"""The verifier's fuzz properties, run longer than CI runs them (bounded by time).

    python tests/bench/fuzz_verifier.py                  # 5 minutes
    python tests/bench/fuzz_verifier.py --duration-s 60  # quicker

CI runs each property on a fixed seed with a few hundred examples
(`tests/unit/verifier/test_self_grade.py`); this script draws new examples round
after round until `--duration-s` has passed, over the same answer-like strategies
and over arbitrary text:
  - identical text never grades wrong: `grade(x, x)` and `grade_answer(x, x)` are
    correct or a refusal;
  - `grade(response, gold)` of any two texts returns a verdict (never raises).
Prints the examples tried per property and exits 1 with the failing example (shrunk
by hypothesis) if a property fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.unit.verifier.test_self_grade import _CHARS, _TEXTS, _never_wrong
from workers.models import Verdict
from workers.verifier import grade

_ANY_TEXT = st.one_of(_TEXTS, _CHARS, st.text(max_size=300))


def _round(examples: int) -> dict[str, Callable[[], None]]:
    """This round's properties, each to run `examples` fresh examples."""
    fresh = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )

    @fresh
    @given(text=_ANY_TEXT)
    def identical_text_never_wrong(text: str) -> None:
        _never_wrong(text)

    @fresh
    @given(response=_ANY_TEXT, gold=_ANY_TEXT)
    def any_pair_gets_a_verdict(response: str, gold: str) -> None:
        assert isinstance(grade(response, gold), Verdict)

    return {
        "identical text never wrong": identical_text_never_wrong,
        "any two texts get a verdict": any_pair_gets_a_verdict,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--examples-per-round", type=int, default=500)
    args = parser.parse_args(argv)
    tried = dict.fromkeys(_round(1), 0)
    started = time.monotonic()
    while time.monotonic() - started < args.duration_s:
        for name, prop in _round(args.examples_per_round).items():
            try:
                prop()
            except Exception as exc:  # an assertion, or grade() raising
                print(f"FAILED: {name}: {exc}")
                return 1
            tried[name] += args.examples_per_round
    elapsed_s = time.monotonic() - started
    for name, count in tried.items():
        print(f"{name}: {count:,} examples, all held")
    print(f"{elapsed_s:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
