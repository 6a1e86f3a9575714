"""Sandbox per-item limits with real child processes: deadline, memory cap, crashes."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.helpers import MIB, hostile_grade, misbehave_while_prepared
from workers import verifier
from workers.models import GradeOptions, Status
from workers.sandbox.process import Sandbox

OPTIONS = GradeOptions()


def make_sandbox(**kw: object) -> Sandbox:
    args: dict[str, object] = {
        "item_timeout_s": 1.0,
        "item_memory_bytes": 256 * MIB,
        "grade_fn": hostile_grade,
        "warm_up": False,  # keeps the first timing in this process free of warm-up
    }
    args.update(kw)
    return Sandbox(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("so the answer is \\boxed{4}", "4"),
        ("\\boxed{5}", "4"),
        ("no marker here", "4"),
        ("unicode \\boxed{½} \ud800", "\\frac{1}{2}"),
    ],
    ids=["correct", "wrong", "no-answer", "unicode-and-lone-surrogate"],
)
def test_sandbox_grades_like_in_process(response: str, gold: str) -> None:
    with Sandbox(item_timeout_s=5.0, item_memory_bytes=256 * MIB) as sandbox:
        assert sandbox.grade(response, gold, OPTIONS) == verifier.grade(
            response, gold, options=OPTIONS
        )


def test_sandbox_timeout_then_next_item_is_fine() -> None:
    restarts: list[str] = []
    with make_sandbox(item_timeout_s=0.3, on_restart=restarts.append) as sandbox:
        started = time.monotonic()
        verdict = sandbox.grade("hang", "4", OPTIONS)
        elapsed_s = time.monotonic() - started
        assert verdict.status is Status.TIMEOUT
        assert not verdict.correct
        assert verdict.grader_version == verifier.GRADER_VERSION
        assert 0.3 <= elapsed_s < 2.0
        assert restarts == ["timeout"]
        good = sandbox.grade("\\boxed{4}", "4", OPTIONS)
        assert good.status is Status.CORRECT


def test_sandbox_failure_verdict_keeps_extraction() -> None:
    with make_sandbox(item_timeout_s=0.2) as sandbox:
        verdict = sandbox.grade("hang", "4", OPTIONS)
    prepared = verifier.prepare("hang", "4", options=OPTIONS)
    assert verdict.extracted == prepared.extracted
    assert verdict.extraction_method == prepared.extraction_method
    assert verdict.format_valid == prepared.format_valid


@pytest.mark.parametrize("response", ["alloc-at-once", "alloc-slowly"])
def test_sandbox_memory_bomb_gives_memory_limit(response: str) -> None:
    restarts: list[str] = []
    with make_sandbox(item_timeout_s=20.0, on_restart=restarts.append) as sandbox:
        verdict = sandbox.grade(response, "4", OPTIONS)
        assert verdict.status is Status.MEMORY_LIMIT, verdict.reason
        assert restarts == ["memory"]
        assert sandbox.grade("\\boxed{4}", "4", OPTIONS).status is Status.CORRECT


def test_sandbox_rss_cap_kills_when_address_space_is_unlimited() -> None:
    # Given RLIMIT_AS far above the cap, only the parent's RSS sampling can stop it.
    with make_sandbox(
        item_timeout_s=20.0, item_memory_bytes=128 * MIB, address_space_bytes=1 << 40
    ) as sandbox:
        verdict = sandbox.grade("alloc-slowly", "4", OPTIONS)
    assert verdict.status is Status.MEMORY_LIMIT
    assert "memory cap" in verdict.reason


@pytest.mark.parametrize(
    ("response", "signal_name"), [("abort", "SIGABRT"), ("segv", "SIGSEGV")]
)
def test_sandbox_crash_gives_error_with_signal(response: str, signal_name: str) -> None:
    restarts: list[str] = []
    with make_sandbox(on_restart=restarts.append) as sandbox:
        verdict = sandbox.grade(response, "4", OPTIONS)
        assert verdict.status is Status.ERROR
        assert signal_name in verdict.reason
        assert restarts == ["crash"]
        assert sandbox.grade("\\boxed{4}", "4", OPTIONS).status is Status.CORRECT


def test_sandbox_grader_exception_is_error_and_child_survives() -> None:
    restarts: list[str] = []
    with make_sandbox(on_restart=restarts.append) as sandbox:
        pid = sandbox.child_pid
        verdict = sandbox.grade("raise", "4", OPTIONS)
        assert verdict.status is Status.ERROR
        assert "KeyError" in verdict.reason
        assert sandbox.grade("\\boxed{4}", "4", OPTIONS).correct
        assert restarts == []
        assert pid is None or sandbox.child_pid == pid


def test_sandbox_grade_many_keeps_order_and_bounds_each_item() -> None:
    pairs = [("\\boxed{1}", "1"), ("hang", "1"), ("\\boxed{2}", "3"), ("abort", "1")]
    with make_sandbox(item_timeout_s=0.3) as sandbox:
        statuses = [v.status for v in sandbox.grade_many(pairs, OPTIONS)]
    assert statuses == [Status.CORRECT, Status.TIMEOUT, Status.WRONG, Status.ERROR]


def test_sandbox_each_item_of_a_chunk_gets_its_own_deadline() -> None:
    # Given a chunk with two hanging items among quick ones
    pairs = [("hang", "1"), *[(f"\\boxed{{{i}}}", str(i)) for i in range(5)]]
    pairs.append(("hang", "1"))
    restarts: list[str] = []
    with make_sandbox(item_timeout_s=0.3, on_restart=restarts.append) as sandbox:
        started = time.monotonic()
        timed = sandbox.grade_many_timed(pairs, OPTIONS)
        elapsed_s = time.monotonic() - started
    # Then each hang costs one deadline, and the items after it are still graded
    statuses = [v.status for v, _ in timed]
    assert statuses == [Status.TIMEOUT, *[Status.CORRECT] * 5, Status.TIMEOUT]
    assert restarts == ["timeout", "timeout"]
    assert 0.6 <= elapsed_s < 3.0
    assert all(0.3 <= d < 1.5 for (v, d) in timed if v.status is Status.TIMEOUT)


def test_sandbox_deadline_runs_from_each_item_start_answers_sent_are_kept() -> None:
    # Given a chunk of two slow but legal items (0.5 s each, deadline 0.8 s: both
    # together outlast it), then one that hangs
    pairs = [("nap", "1"), ("nap", "1"), ("hang", "1"), ("\\boxed{2}", "2")]
    with make_sandbox(item_timeout_s=0.8) as sandbox:
        started = time.monotonic()
        timed = sandbox.grade_many_timed(pairs, OPTIONS)
        elapsed_s = time.monotonic() - started
    # Then neither slow item is blamed, each reports its own time, the hang is
    # the one answered `timeout`, and the slow items (sent back before the kill)
    # are not decided again by the fresh child: 0.5 + 0.5 + 0.8 s, not 1 s more
    expected = verifier.grade("nap", "1").status
    statuses = [v.status for v, _s in timed]
    assert statuses == [expected, expected, Status.TIMEOUT, Status.CORRECT]
    assert all(0.5 <= seconds < 0.8 for _v, seconds in timed[:2])
    assert 1.8 <= elapsed_s < 2.6


def test_sandbox_grade_many_recycles_across_chunks() -> None:
    restarts: list[str] = []
    with make_sandbox(recycle_after_items=4, on_restart=restarts.append) as sandbox:
        verdicts = sandbox.grade_many([("\\boxed{2}", "2")] * 10, OPTIONS)
    assert all(v.correct for v in verdicts)
    assert restarts == ["recycle", "recycle"]


class Interrupted(Exception):
    """Stands in for Celery's SoftTimeLimitExceeded raised by a signal handler."""


def raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted


def test_sandbox_interrupted_mid_item_never_misreads_a_late_answer() -> None:
    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        with make_sandbox(item_timeout_s=30.0) as sandbox:
            # Given a grade interrupted by an exception from a signal handler
            timer.start()
            with pytest.raises(Interrupted):
                sandbox.grade("nap", "1", OPTIONS)  # answers at 0.5 s, too late
            # Then the next item gets its own answer from a fresh child
            assert sandbox.child_pid is None
            time.sleep(0.5)  # let a leftover child (if any) send the late answer
            verdict = sandbox.grade("\\boxed{5}", "6", OPTIONS)
            assert (verdict.status, verdict.extracted) == (Status.WRONG, "5")
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


def test_sandbox_item_too_big_to_receive_is_memory_limit_for_it_alone() -> None:
    # Given a chunk whose third response is too big for the child to even receive
    huge = "9" * (80 * MIB)
    pairs = [("\\boxed{1}", "1"), ("\\boxed{2}", "2"), (huge, "9"), ("\\boxed{3}", "3")]
    restarts: list[str] = []
    with make_sandbox(
        item_timeout_s=30.0, item_memory_bytes=32 * MIB, on_restart=restarts.append
    ) as sandbox:
        verdicts = sandbox.grade_many(pairs, OPTIONS)
    # Then the child dies of MemoryError (exit status): memory_limit for that item only
    statuses = [v.status for v in verdicts]
    assert statuses == [Status.CORRECT] * 2 + [Status.MEMORY_LIMIT, Status.CORRECT]
    assert "out of memory" in verdicts[2].reason
    assert restarts == ["memory", "memory"]  # the whole chunk, then the item alone


def test_sandbox_item_failing_while_prepared_is_answered_without_preparing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given an item whose preparing (extraction) raises, here and in the child
    # forked from here
    misbehave_while_prepared(monkeypatch)
    pairs = [("\\boxed{1}", "1"), ("raise while prepared", "2"), ("\\boxed{3}", "3")]
    with make_sandbox() as box:
        verdicts = box.grade_many(pairs, GradeOptions())
    # Then it is `error` without an extraction (the parent does not prepare it again,
    # which would raise here too) and its neighbours are graded
    assert verdicts[1].status is Status.ERROR
    assert verdicts[1].reason == "grader raised KeyError"
    assert verdicts[1].extracted is None
    assert verdicts[0].correct
    assert verdicts[2].correct
