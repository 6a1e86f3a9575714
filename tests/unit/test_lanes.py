"""Priority lanes and rollout kinds: their names and queues, the order a worker takes
from them, and the kinds a worker consumes."""

from __future__ import annotations

import pytest
from kombu.utils.scheduling import cycle_by_name

from workers import kinds
from workers.__main__ import build_parser, decide_kinds, settings_from_args, worker_argv
from workers.errors import ConfigError
from workers.fleet.app import create_app
from workers.fleet.settings import WorkerSettings, parse_kinds, parse_lanes
from workers.wire.lanes import (
    BULK,
    CODE,
    INTERACTIVE,
    KINDS,
    LANE_QUEUES,
    MATH,
    QUEUES,
    LaneCycle,
    kind_of_queue,
    lane_of_queue,
    parse_kind,
    parse_lane,
    queue_for,
    queues_for,
)

IQ, BQ = queue_for(INTERACTIVE), queue_for(BULK)
ICQ, BCQ = queue_for(INTERACTIVE, CODE), queue_for(BULK, CODE)


def test_lanes_each_have_a_queue_of_their_own():
    assert len(set(LANE_QUEUES.values())) == len(LANE_QUEUES) == 2
    assert lane_of_queue(IQ) == INTERACTIVE
    assert lane_of_queue(BQ) == BULK
    assert lane_of_queue("celery") is None


def test_lanes_each_kind_has_a_queue_per_lane_math_keeps_the_old_names():
    assert (IQ, BQ) == ("gradefleet", "gradefleet.bulk")  # before kinds: the same
    assert (ICQ, BCQ) == ("gradefleet.code", "gradefleet.code.bulk")
    assert len(set(QUEUES.values())) == len(QUEUES) == 4
    assert LANE_QUEUES == {INTERACTIVE: IQ, BULK: BQ}
    for (lane, kind), queue in QUEUES.items():
        assert (lane_of_queue(queue), kind_of_queue(queue)) == (lane, kind)
    assert kind_of_queue("celery") is None
    # The kinds with queues are the kinds with a grader.
    assert sorted(KINDS) == kinds.kinds()


def test_lanes_queues_for_lanes_and_kinds():
    assert queues_for([INTERACTIVE, BULK], [MATH, CODE]) == [IQ, ICQ, BQ, BCQ]
    assert queues_for([INTERACTIVE, BULK], [CODE]) == [ICQ, BCQ]
    assert queues_for([INTERACTIVE], [MATH]) == [IQ]


def test_lanes_parse_kind_refuses_unknown_names():
    assert parse_kind("code") == CODE
    with pytest.raises(ValueError, match="math, code"):
        parse_kind("lean")


def test_lanes_parse_lane_refuses_unknown_names():
    assert parse_lane("bulk") == BULK
    with pytest.raises(ValueError, match="interactive, bulk"):
        parse_lane("urgent")


def test_lanes_cycle_takes_interactive_first_whatever_order_it_is_given():
    cycle = LaneCycle()
    cycle.update([BQ, "other", IQ])
    assert cycle.consume(3) == [IQ, BQ, "other"]


def test_lanes_cycle_tries_bulk_first_after_bulk_every_other_takes():
    cycle = LaneCycle()
    cycle.bulk_every = 3
    cycle.update([IQ, BQ])
    order = []
    for _ in range(8):
        first = cycle.consume(2)[0]
        order.append(first)
        cycle.rotate(first)  # both lanes have work: the first list delivers
    assert order == [IQ, IQ, IQ, BQ, IQ, IQ, IQ, BQ]


def test_lanes_cycle_bulk_taken_anyway_resets_the_count():
    cycle = LaneCycle()
    cycle.bulk_every = 2
    cycle.update([IQ, BQ])
    cycle.rotate(IQ)
    cycle.rotate(BQ)  # the interactive list was empty: bulk delivered
    cycle.rotate(IQ)
    assert cycle.consume(2) == [IQ, BQ]
    cycle.rotate(IQ)
    assert cycle.consume(2) == [BQ, IQ]


def test_lanes_cycle_of_a_node_dedicated_to_interactive_never_lists_bulk():
    cycle = LaneCycle()
    cycle.bulk_every = 1
    cycle.update([IQ])
    cycle.rotate(IQ)
    cycle.rotate(IQ)
    assert cycle.consume(1) == [IQ]


def test_lanes_cycle_takes_every_interactive_queue_before_bulk_whatever_the_kind():
    cycle = LaneCycle()
    cycle.update([BCQ, BQ, ICQ, IQ])
    first = cycle.consume(4)
    assert set(first[:2]) == {IQ, ICQ}
    assert set(first[2:]) == {BQ, BCQ}
    # Whichever kind delivers, interactive stays ahead of bulk.
    for taken in (IQ, ICQ, ICQ, IQ, IQ):
        cycle.rotate(taken)
        assert set(cycle.consume(4)[:2]) == {IQ, ICQ}


def test_lanes_cycle_kinds_take_turns_within_a_lane():
    cycle = LaneCycle()
    cycle.bulk_every = 1_000
    cycle.update([IQ, ICQ, BQ, BCQ])
    order = []
    for _ in range(6):
        first = cycle.consume(4)[0]
        order.append(first)
        cycle.rotate(first)  # every queue has work: the first list delivers
    # A flood of interactive math never starves interactive code, nor the reverse.
    assert order in ([IQ, ICQ] * 3, [ICQ, IQ] * 3)


def test_lanes_cycle_tries_every_bulk_queue_first_after_bulk_every_other_takes():
    cycle = LaneCycle()
    cycle.bulk_every = 2
    cycle.update([IQ, ICQ, BQ, BCQ])
    cycle.rotate(IQ)
    cycle.rotate(ICQ)
    order = cycle.consume(4)
    assert set(order[:2]) == {BQ, BCQ}
    assert set(order[2:]) == {IQ, ICQ}
    cycle.rotate(BCQ)  # a bulk take of either kind resets the count
    assert set(cycle.consume(4)[:2]) == {IQ, ICQ}


def test_lanes_cycle_of_a_code_node_lists_only_code_queues():
    cycle = LaneCycle()
    cycle.bulk_every = 1
    cycle.update(queues_for([INTERACTIVE, BULK], [CODE]))
    assert cycle.consume(2) == [ICQ, BCQ]
    cycle.rotate(ICQ)
    assert cycle.consume(2) == [BCQ, ICQ]


def test_lanes_kombu_finds_the_cycle_by_the_name_the_app_gives():
    app = create_app(WorkerSettings(bulk_every=5))
    name = app.conf.broker_transport_options["queue_order_strategy"]
    assert cycle_by_name(name) is LaneCycle
    assert LaneCycle.bulk_every == 5
    LaneCycle.bulk_every = WorkerSettings().bulk_every


def test_lanes_worker_settings_read_lanes_and_bulk_every_from_env():
    settings = WorkerSettings.from_env(
        {"GRADEFLEET_LANES": "interactive", "GRADEFLEET_BULK_EVERY": "4"}
    )
    assert settings.lanes == (INTERACTIVE,)
    assert settings.bulk_every == 4
    assert WorkerSettings.from_env({}).lanes == (INTERACTIVE, BULK)
    assert parse_lanes("bulk, interactive") == (BULK, INTERACTIVE)
    with pytest.raises(ConfigError, match="urgent"):
        WorkerSettings.from_env({"GRADEFLEET_LANES": "urgent"})
    with pytest.raises(ConfigError, match="lanes"):
        WorkerSettings(lanes=(INTERACTIVE, INTERACTIVE))
    with pytest.raises(ConfigError, match="bulk_every"):
        WorkerSettings(bulk_every=0)


def test_lanes_worker_kinds_from_env_and_options():
    assert WorkerSettings.from_env({}).kinds is None  # decided at start
    assert WorkerSettings.from_env({"GRADEFLEET_KINDS": "code"}).kinds == (CODE,)
    assert parse_kinds("math, code") == (MATH, CODE)
    with pytest.raises(ConfigError, match="lean"):
        WorkerSettings.from_env({"GRADEFLEET_KINDS": "lean"})
    with pytest.raises(ConfigError, match="kinds"):
        WorkerSettings(kinds=(MATH, MATH))
    with pytest.raises(ConfigError, match="kinds"):
        WorkerSettings(kinds=())
    args = build_parser().parse_args(["--kinds", "code"])
    settings = settings_from_args(args, {"GRADEFLEET_KINDS": "math"})
    assert settings.kinds == (CODE,)  # the option wins
    assert f"--queues={ICQ},{BCQ}" in worker_argv(settings)
    for bad in ("lean", ","):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--kinds", bad])
    with pytest.raises(ValueError, match="decide_kinds"):
        worker_argv(WorkerSettings())


def _check(runs: bool):
    calls = []

    def check(**kwargs):
        calls.append(kwargs)
        return runs, "why: the probe said so"

    return check, calls


def test_lanes_worker_kinds_decided_by_the_code_sandbox_check():
    # Unset: both kinds where the sandbox runs, math only (and why) where it does not
    check, calls = _check(True)
    settings, notice = decide_kinds(WorkerSettings(code_uid_base=30_000), check)
    assert (settings.kinds, notice) == ((MATH, CODE), None)
    assert calls == [{"uid_base": 30_000}]  # the probe runs as the grader will
    settings, notice = decide_kinds(WorkerSettings(), _check(False)[0])
    assert settings.kinds == (MATH,)
    assert notice is not None
    assert "math only (why: the probe said so)" in notice
    # Given with code: kept, with a warning when the sandbox does not run
    settings, notice = decide_kinds(WorkerSettings(kinds=(CODE,)), _check(False)[0])
    assert settings.kinds == (CODE,)
    assert notice is not None
    assert "WARNING" in notice
    assert decide_kinds(WorkerSettings(kinds=(CODE,)), _check(True)[0])[1] is None
    # Math only: nothing to check
    check, calls = _check(False)
    assert decide_kinds(WorkerSettings(kinds=(MATH,)), check) == (
        WorkerSettings(kinds=(MATH,)),
        None,
    )
    assert calls == []


def test_lanes_producer_splits_a_job_into_batches_of_one_kind():
    from producer.client.fleet import _kind_batches
    from workers.code.item import encode_code_gold

    # Given a job of math and code rollouts, interleaved
    code_gold = encode_code_gold({"test_list": ["assert f() == 1"]})
    triples = [(n, f"r{n}", code_gold if n % 3 == 0 else str(n)) for n in range(10)]
    # When it is cut into batches of 2
    batches = _kind_batches("job", triples, 2)
    # Then each batch holds one kind, and every rollout is in one batch once, with
    # its index (verdicts come back in input order)
    for batch in batches:
        assert batch.kind == (CODE if batch.items[0][2] == code_gold else MATH)
        assert all(
            (gold == code_gold) == (batch.kind == CODE) for *_, gold in batch.items
        )
    assert sorted(t for b in batches for t in b.items) == triples
    assert [b.batch_id for b in batches] == [f"job.{n}" for n in range(len(batches))]
    # And the kinds alternate while both have batches (both pools start at once)
    assert [b.kind for b in batches] == [MATH, CODE, MATH, CODE, MATH]
    # And a job of one kind is cut as before kinds (sized for the job)
    math = [(n, "r", "1") for n in range(100)]
    assert [len(b.items) for b in _kind_batches("j", math, None)] == [16] * 6 + [4]


def test_lanes_batches_stop_at_the_text_budget_code_tests_included():
    from producer.client.fleet import _kind_batches
    from workers.code.item import encode_code_gold
    from workers.wire.contract import (
        MAX_BATCH_TEXT_CHARS,
        MAX_CODE_GOLD_CHARS,
        MAX_TEXT_CHARS,
        text_error,
    )

    # Given code rollouts whose tests are 3 MB each (over a math text's bound,
    # within a code gold's)
    big = encode_code_gold({"tests": {"inputs": ["x" * 3_000_000], "outputs": ["1"]}})
    assert MAX_TEXT_CHARS < len(big) <= MAX_CODE_GOLD_CHARS
    assert text_error("r", big) is None
    assert text_error("r", "1" * len(big)) is not None  # a math gold that long
    assert text_error("r", big + "x" * MAX_CODE_GOLD_CHARS) is not None
    triples = [(n, "r", big) for n in range(7)]
    # When a job of them is cut (64 a batch by count)
    batches = _kind_batches("job", triples, 64)
    # Then no batch holds more text than the budget (its stored JSON would pass
    # what a worker reads), and every rollout is in one batch once, in order
    sizes = [sum(len(r) + len(g) for _, r, g in b.items) for b in batches]
    assert max(sizes) <= MAX_BATCH_TEXT_CHARS
    assert [len(b.items) for b in batches] == [2, 2, 2, 1]
    assert [t for b in batches for t in b.items] == triples
    # And a rollout over the budget on its own is a batch of one, never dropped
    huge = [(0, "r" * MAX_TEXT_CHARS, big), (1, "r", big), (2, "r", "1")]
    cut = _kind_batches("j", huge * 3, 64)
    assert sorted(t for b in cut for t in b.items) == sorted(huge * 3)


def test_lanes_library_callers_default_to_interactive_the_cli_to_bulk():
    from producer.client.grader import Grader, open_grader, register_scheme
    from producer.settings import ProducerSettings
    from workers.models import GradeOptions

    seen: list[str] = []

    def factory(
        url: str | None, options: GradeOptions, settings: ProducerSettings
    ) -> Grader:
        seen.append(settings.priority)
        return open_grader(None, options=options, settings=settings)

    register_scheme("lane-test", factory)
    open_grader("lane-test://x").close()  # a program: interactive
    open_grader("lane-test://x", settings=ProducerSettings()).close()  # the CLI's
    assert seen == [INTERACTIVE, BULK]


def test_lanes_client_and_cli_refuse_an_unknown_priority_before_connecting():
    from click.testing import CliRunner

    from producer.cli import cli
    from producer.client.fleet import GradingClient

    nowhere = "redis://127.0.0.1:1/0"  # never reached: the arguments fail first
    with pytest.raises(ValueError, match="priority"):
        GradingClient(nowhere, priority="urgent")
    with pytest.raises(ValueError, match="max_batches_in_flight"):
        GradingClient(nowhere, max_batches_in_flight=0)
    with pytest.raises(ValueError, match="on_deadline"):
        GradingClient(nowhere, on_deadline="ignore")  # type: ignore[arg-type]
    args = ["grade", "-", "-o", "-", "--broker", nowhere, "--priority", "urgent"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert "urgent" in result.output
