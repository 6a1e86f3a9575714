"""The `Grader` seam: `open_grader(url)` picks the transport by URL scheme."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from producer.client.grader import (
    Grader,
    GraderBase,
    ProgressFn,
    open_grader,
    register_scheme,
)
from producer.errors import DeadlinePassedError, InvalidRolloutError, ProducerError
from producer.settings import ProducerSettings
from workers import verifier
from workers.models import GradeOptions, Rollout, RolloutLike, Verdict

SETTINGS = ProducerSettings(processes=2, cache_dir=None)
ROLLOUTS = [Rollout(f"so \\boxed{{{n}}}", str(n % 3)) for n in range(40)]


def test_grader_without_url_grades_embedded_in_order_with_progress() -> None:
    ticks: list[int] = []
    with open_grader(None, settings=SETTINGS) as grader:
        got = grader.grade(ROLLOUTS, on_progress=ticks.append, deadline_s=60)
    assert got == [verifier.grade(r.response, r.gold) for r in ROLLOUTS]
    assert sum(ticks) == len(ROLLOUTS)


def test_grader_embedded_applies_options() -> None:
    rollout = Rollout("the result is 7", "7")
    with open_grader(
        None, options=GradeOptions(allow_fallback=False), settings=SETTINGS
    ) as grader:
        (verdict,) = grader.grade([rollout])
    assert not verdict.correct


def test_grader_embedded_deadline_raises_and_grader_stays_usable() -> None:
    with open_grader(None, settings=SETTINGS) as grader:
        with pytest.raises(DeadlinePassedError):
            grader.grade(ROLLOUTS * 50, deadline_s=1e-9)
        assert len(grader.grade(ROLLOUTS[:3])) == 3


def test_grader_embedded_refuses_oversized_text_naming_the_rollout() -> None:
    with (
        open_grader(None, settings=SETTINGS) as grader,
        pytest.raises(InvalidRolloutError, match="rollout 1"),
    ):
        grader.grade([ROLLOUTS[0], Rollout("x" * 1_000_001, "1")])


def test_grader_unknown_scheme_is_a_producer_error() -> None:
    with pytest.raises(ProducerError, match="ftp"):
        open_grader("ftp://example.invalid/")


class _EchoGrader(GraderBase):
    """A grader of another transport, as a registered scheme would provide."""

    def __init__(self, url: str | None) -> None:
        self.url = url

    def grade(
        self,
        rollouts: Sequence[RolloutLike],
        *,
        on_progress: ProgressFn | None = None,
        deadline_s: float | None = None,
        options: GradeOptions | None = None,
    ) -> list[Verdict]:
        return [verifier.grade(r.response, r.gold, options=options) for r in rollouts]

    def close(self) -> None:
        pass


def test_grader_registered_scheme_gets_the_url() -> None:
    def factory(
        url: str | None, options: GradeOptions, settings: ProducerSettings
    ) -> Grader:
        return _EchoGrader(url)

    register_scheme("echo-test", factory)
    with open_grader("ECHO-TEST://somewhere:1/") as grader:
        assert isinstance(grader, _EchoGrader)
        assert grader.url == "ECHO-TEST://somewhere:1/"
        assert grader.grade([ROLLOUTS[0]]) == [verifier.grade("so \\boxed{0}", "0")]
