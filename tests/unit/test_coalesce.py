"""The coalescer on a real event loop with an in-process batch function."""

from __future__ import annotations

import asyncio

import pytest

from producer.client.coalesce import Coalescer, OverloadedError, wait_for_items
from workers.code.item import CODE_GOLD_PREFIX
from workers.models import ExtractionMethod, GradeOptions, Status, Verdict
from workers.wire.contract import MAX_BATCH_TEXT_CHARS
from workers.wire.lanes import BULK, INTERACTIVE, Lane

OPTIONS = GradeOptions()


def _verdict(response: str, gold: str) -> Verdict:
    ok = response == gold
    return Verdict(
        correct=ok,
        status=Status.CORRECT if ok else Status.WRONG,
        format_valid=True,
        extracted=response,
        extraction_method=ExtractionMethod.BOXED,
        grader_version="test-1",
    )


class Recorder:
    """A batch function that records each batch and can be held or made to fail."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, str]]] = []
        self.lanes: list[Lane] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def __call__(
        self, pairs: list[tuple[str, str]], options: GradeOptions, lane: Lane
    ) -> list[Verdict]:
        self.batches.append(pairs)
        self.lanes.append(lane)
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("broker went away")
        return [_verdict(r, g) for r, g in pairs]


def test_concurrent_single_calls_share_batches_and_keep_order() -> None:
    async def run() -> tuple[list[list[Verdict]], Recorder, Coalescer]:
        recorder = Recorder()
        coalescer = Coalescer(recorder, max_batch_items=50, max_delay_s=5.0)
        calls = [coalescer.grade([(str(i), str(i % 3))], OPTIONS) for i in range(200)]
        return await asyncio.gather(*calls), recorder, coalescer

    results, recorder, coalescer = asyncio.run(run())
    assert [r[0].extracted for r in results] == [str(i) for i in range(200)]
    assert [r[0].correct for r in results] == [i == i % 3 for i in range(200)]
    assert len(recorder.batches) == 4  # 200 calls, 50 per batch
    assert coalescer.batch_sizes == {50: 4}
    assert coalescer.backlog_items == 0


def test_a_batch_stops_at_the_text_budget() -> None:
    # Code rollouts with 3 MB of tests each: a batch by count alone (50) would hold
    # 150 MB, past what a worker reads of a batch.
    big = CODE_GOLD_PREFIX + "x" * 3_000_000

    async def run() -> tuple[list[Verdict], Recorder]:
        recorder = Recorder()
        coalescer = Coalescer(recorder, max_batch_items=50, max_delay_s=0.001)
        verdicts = await coalescer.grade([(str(i), big) for i in range(5)], OPTIONS)
        return verdicts, recorder

    verdicts, recorder = asyncio.run(run())
    assert [v.extracted for v in verdicts] == [str(i) for i in range(5)]
    assert [len(b) for b in recorder.batches] == [2, 2, 1]
    texts = [sum(len(r) + len(g) for r, g in b) for b in recorder.batches]
    assert max(texts) <= MAX_BATCH_TEXT_CHARS


def test_a_lone_call_is_flushed_after_the_delay() -> None:
    async def run() -> list[Verdict]:
        coalescer = Coalescer(Recorder(), max_batch_items=1000, max_delay_s=0.001)
        return await coalescer.grade([("1", "1")], OPTIONS)

    assert asyncio.run(run())[0].status is Status.CORRECT


def test_cancelled_caller_loses_nobody_else() -> None:
    async def run() -> tuple[list[Verdict], Recorder, Coalescer]:
        recorder = Recorder()
        coalescer = Coalescer(recorder, max_batch_items=10, max_delay_s=0.05)
        doomed = asyncio.ensure_future(coalescer.grade([("a", "a")] * 3, OPTIONS))
        survivor = asyncio.ensure_future(coalescer.grade([("b", "b")], OPTIONS))
        await asyncio.sleep(0)
        doomed.cancel()  # before the flush: its items must not be graded
        result = await survivor
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return result, recorder, coalescer

    result, recorder, coalescer = asyncio.run(run())
    assert result[0].status is Status.CORRECT
    assert recorder.batches == [[("b", "b")]]
    assert coalescer.backlog_items == 0


def test_deadline_turns_unfinished_items_into_timeouts_only_for_that_caller() -> None:
    async def run() -> tuple[list[Verdict], list[Verdict]]:
        recorder = Recorder()
        recorder.gate.clear()  # the backend holds every batch
        coalescer = Coalescer(recorder, max_batch_items=10, max_delay_s=0.001)
        hurried = asyncio.ensure_future(
            coalescer.grade([("x", "x"), ("y", "z")], OPTIONS, deadline_s=0.05)
        )
        patient = asyncio.ensure_future(coalescer.grade([("p", "p")], OPTIONS))
        first = await hurried
        recorder.gate.set()
        return first, await patient

    hurried, patient = asyncio.run(run())
    assert [v.status for v in hurried] == [Status.TIMEOUT, Status.TIMEOUT]
    assert "deadline of 0.05 s" in hurried[0].reason
    assert patient[0].status is Status.CORRECT


def test_backend_failure_becomes_error_verdicts() -> None:
    async def run() -> list[Verdict]:
        recorder = Recorder()
        recorder.fail = True
        coalescer = Coalescer(recorder, max_delay_s=0.001)
        return await coalescer.grade([("1", "1"), ("2", "2")], OPTIONS)

    verdicts = asyncio.run(run())
    assert [v.status for v in verdicts] == [Status.ERROR, Status.ERROR]
    assert "broker went away" in verdicts[0].reason


def test_full_backlog_refuses_without_queueing() -> None:
    async def run() -> Coalescer:
        recorder = Recorder()
        recorder.gate.clear()
        coalescer = Coalescer(recorder, max_delay_s=0.001, max_backlog_items=3)
        held = asyncio.ensure_future(coalescer.grade([("1", "1")] * 3, OPTIONS))
        await asyncio.sleep(0.01)
        with pytest.raises(OverloadedError) as refused:
            await coalescer.grade([("2", "2")], OPTIONS)
        assert refused.value.retry_after_s > 0
        recorder.gate.set()
        await held
        return coalescer

    assert asyncio.run(run()).backlog_items == 0


def test_one_batch_in_flight_lets_the_next_grow() -> None:
    async def run() -> Recorder:
        recorder = Recorder()
        recorder.gate.clear()
        coalescer = Coalescer(
            recorder, max_batch_items=100, max_delay_s=0.001, max_in_flight=1
        )
        first = asyncio.ensure_future(coalescer.grade([("0", "0")], OPTIONS))
        await asyncio.sleep(0.01)  # the first batch is running
        rest = [
            asyncio.ensure_future(coalescer.grade([(str(i), "0")], OPTIONS))
            for i in range(1, 31)
        ]
        await asyncio.sleep(0.01)
        recorder.gate.set()
        await asyncio.gather(first, *rest)
        return recorder

    recorder = asyncio.run(run())
    assert [len(b) for b in recorder.batches] == [1, 30]


def test_options_never_share_a_batch() -> None:
    async def run() -> Recorder:
        recorder = Recorder()
        coalescer = Coalescer(recorder, max_delay_s=0.005)
        strict = GradeOptions(allow_fallback=False)
        await asyncio.gather(
            coalescer.grade([("1", "1")], OPTIONS),
            coalescer.grade([("2", "2")], strict),
        )
        return recorder

    assert sorted(len(b) for b in asyncio.run(run()).batches) == [1, 1]


def test_lanes_never_share_a_batch_and_reach_the_backend() -> None:
    async def run() -> Recorder:
        recorder = Recorder()
        coalescer = Coalescer(recorder, max_delay_s=0.005)
        await asyncio.gather(
            coalescer.grade([("1", "1")], OPTIONS),
            coalescer.grade([("2", "2")], OPTIONS, lane=BULK),
            coalescer.grade([("3", "3")], OPTIONS, lane=BULK),
        )
        return recorder

    recorder = asyncio.run(run())
    batches = sorted(zip(recorder.lanes, recorder.batches, strict=True))
    assert batches == [(BULK, [("2", "2"), ("3", "3")]), (INTERACTIVE, [("1", "1")])]


class HeldCode(Recorder):
    """Holds code batches (their golds are encoded tests) until `code_gate`."""

    def __init__(self) -> None:
        super().__init__()
        self.code_gate = asyncio.Event()

    async def __call__(
        self, pairs: list[tuple[str, str]], options: GradeOptions, lane: Lane
    ) -> list[Verdict]:
        if pairs[0][1].startswith(CODE_GOLD_PREFIX):
            await self.code_gate.wait()
        return await super().__call__(pairs, options, lane)


def test_a_running_code_batch_never_holds_math_items() -> None:
    code_gold = CODE_GOLD_PREFIX + "{}"

    async def run() -> tuple[Recorder, bool, list[Verdict]]:
        recorder = HeldCode()
        # One batch in flight (the embedded pool's bound) still lets math through:
        # kinds never share a batch or a slot.
        coalescer = Coalescer(recorder, max_delay_s=0.001, max_in_flight=1)
        mixed = asyncio.ensure_future(
            coalescer.grade([("p", code_gold), ("1", "1"), ("q", code_gold)], OPTIONS)
        )
        await asyncio.sleep(0.01)  # the code batch is running, held
        math = await coalescer.grade([("2", "2")], OPTIONS)
        code_still_pending = not mixed.done()
        recorder.code_gate.set()
        return recorder, code_still_pending, [*math, *await mixed]

    recorder, code_still_pending, verdicts = asyncio.run(run())
    assert code_still_pending
    assert [v.extracted for v in verdicts] == ["2", "p", "1", "q"]  # in order
    kinds = [{g.startswith(CODE_GOLD_PREFIX) for _, g in b} for b in recorder.batches]
    assert all(len(k) == 1 for k in kinds)  # no batch mixes kinds


def test_a_submitter_that_stops_waiting_frees_its_items_only() -> None:
    """`submit` + `wait_for_items(unless=...)` + `collect`, as the HTTP route uses
    them: the watched future ends the wait at once, nothing else is cancelled, and
    collecting drops the leaver's items from their batch."""

    async def run() -> tuple[list[Verdict], list[Verdict], Recorder, Coalescer]:
        recorder = Recorder()
        coalescer = Coalescer(recorder, max_batch_items=10, max_delay_s=0.05)
        leaver = coalescer.submit([("a", "a"), ("b", "b")], OPTIONS)
        stayer = coalescer.submit([("c", "c")], OPTIONS)
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.001, gone.set_result, None)
        await wait_for_items(leaver, 10.0, unless=gone)
        assert not any(future.done() for future in leaver + stayer)
        left = coalescer.collect(leaver, 10.0)
        await wait_for_items(stayer, 10.0)
        return left, coalescer.collect(stayer, 10.0), recorder, coalescer

    left, stayed, recorder, coalescer = asyncio.run(run())
    assert [v.status for v in left] == [Status.TIMEOUT, Status.TIMEOUT]
    assert [v.status for v in stayed] == [Status.CORRECT]
    assert recorder.batches == [[("c", "c")]]
    assert coalescer.backlog_items == 0


def test_waiting_for_items_ends_at_the_timeout() -> None:
    async def run() -> float:
        recorder = Recorder()
        recorder.gate.clear()  # the backend holds every batch
        coalescer = Coalescer(recorder, max_delay_s=0.001)
        futures = coalescer.submit([("x", "x")], OPTIONS)
        started = asyncio.get_running_loop().time()
        await wait_for_items(futures, 0.05)
        waited_s = asyncio.get_running_loop().time() - started
        assert not futures[0].done()
        coalescer.collect(futures, 0.05)
        return waited_s

    assert 0.04 <= asyncio.run(run()) < 5.0
