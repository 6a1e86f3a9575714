"""Priority lanes: lane names and queues, and the order a worker takes from them."""

from __future__ import annotations

import pytest
from kombu.utils.scheduling import cycle_by_name

from workers.errors import ConfigError
from workers.fleet.app import create_app
from workers.fleet.settings import WorkerSettings, parse_lanes
from workers.wire.lanes import (
    BULK,
    INTERACTIVE,
    LANE_QUEUES,
    LaneCycle,
    lane_of_queue,
    parse_lane,
    queue_for,
)

IQ, BQ = queue_for(INTERACTIVE), queue_for(BULK)


def test_lanes_each_have_a_queue_of_their_own():
    assert len(set(LANE_QUEUES.values())) == len(LANE_QUEUES) == 2
    assert lane_of_queue(IQ) == INTERACTIVE
    assert lane_of_queue(BQ) == BULK
    assert lane_of_queue("celery") is None


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
