"""The `gradefleet` command line: `grade` a JSONL file, run a `worker`, show `status`.

Exit codes: 0 ok, 2 usage error, and `ProducerError.exit_code` otherwise (see
`producer.errors`): 3 some input lines malformed, 5 broker unreachable, 6 deadline,
8 the broker refused writes.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, NoReturn

import click

from producer.client.grader import Grader, line_runner, open_grader
from producer.commands.options import cache_dir_option_value, embedded_options
from producer.commands.report import (
    audit,
    check_broker_url,
    check_output_path,
    diff,
    report,
    response_gold_options,
    write_grade_report,
)
from producer.commands.serve import serve
from producer.commands.signals import exit_on_signals
from producer.commands.sweep import (
    Progress,
    deadline_error,
    deadline_verdict,
    grade_file,
    refused_verdict,
)
from producer.commands.watchdog import NoWorkerWatch
from producer.errors import (
    BrokerRefusedError,
    DeadlinePassedError,
    MalformedInputError,
    ProducerError,
)
from producer.extras import require
from producer.files.formats import require_format_extras
from producer.settings import ProducerSettings
from workers import __version__
from workers.code.item import (
    code_limits_from_env,
    code_uid_base_from_env,
    is_code_gold,
    set_code_limits,
)
from workers.errors import ConfigError, GraderError
from workers.lines.fields import FieldSpec, alias_table_text
from workers.lines.records import InputRow
from workers.lines.units import LineGrader
from workers.models import GradeOptions, Verdict
from workers.sizing import LOCAL_BATCH_SIZE, line_unit_lines_for
from workers.wire.signing import Keyring, keyring_from_env
from workers.wire.urls import connect_url, read_secret

__all__ = ["cli", "main"]

_DEFAULTS = ProducerSettings()


# The fleet CLI's threads mostly wait on Redis (publish, poll) while its reader and
# writer threads parse and encode rows; a thread whose round trip is answered then
# waits for the GIL up to the switch interval (5 ms by default) behind them, many
# times per batch, and the fleet waits with it (the first publish came ~0.55 s
# after the run began). A/B, 8 rounds, 60,760 rollouts, 2 workers: 5.53 s at 5 ms,
# 5.34 at 1 ms, 5.19 at 0.2 ms, the CLI's CPU unchanged (issue 11).
FLEET_SWITCH_INTERVAL_S = 0.0002


@contextmanager
def _switch_interval(interval_s: float | None) -> Iterator[None]:
    """Python's thread switch interval set to `interval_s` (if not None) for the
    block, then restored."""
    if interval_s is None:
        yield
        return
    before_s = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    try:
        yield
    finally:
        sys.setswitchinterval(before_s)


class _CliGroup(click.Group):
    """Turns expected failures into a one-line message and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ProducerError as exc:
            _exit_one_line(ctx, exc, exc.exit_code)
        except BrokenPipeError:
            raise  # `| head` closed stdout: click's main exits 1 quietly
        except (GraderError, OSError) as exc:
            # The local pool could not start, the disk is full, ...: no traceback.
            _exit_one_line(ctx, exc, ProducerError.exit_code)


def _exit_one_line(ctx: click.Context, exc: BaseException, exit_code: int) -> NoReturn:
    # Not a ClickException with a changed exit_code: click 8.5 made that a ClassVar.
    click.echo(f"Error: {str(exc) or type(exc).__name__}", err=True)
    ctx.exit(exit_code)


@click.group(cls=_CliGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="gradefleet")
def cli() -> None:
    """Grade LLM math rollouts: locally (embedded mode) or on a Celery fleet."""


def _watch(url: str | None) -> AbstractContextManager[NoWorkerWatch | None]:
    """On a fleet, a warning within seconds while no worker is alive."""
    if url and url.startswith(("redis://", "rediss://", "unix://")):
        return NoWorkerWatch(url)
    return nullcontext()


def _unit_lines(settings: ProducerSettings) -> dict[str, Any]:
    """A fleet's line units are its tasks: --batch-size lines, else
    `sizing.line_unit_lines_for` the chunk; the embedded pool's keep their own
    size."""
    if settings.broker_url is None:
        return {}
    return {"unit_lines": settings.batch_size or line_unit_lines_for}


class _ChunkGrader:
    """Grades the file's chunks through one `Grader`; --deadline-s bounds the whole
    command, so each chunk gets what is left of it. Once the broker has refused
    writes past --refused-limit-s, the rest of the file is written as `error`
    stand-ins (`refused`), not sent."""

    def __init__(
        self, grader: Grader, deadline_s: float, watch: NoWorkerWatch | None
    ) -> None:
        self._grader = grader
        self._deadline_s = deadline_s
        self._started_s = time.monotonic()
        self._watch = watch
        self.refused: BrokerRefusedError | None = None
        self._frozen = False
        # Line mode, on the embedded pool or a fleet (`workers.lines.units`).
        self.run_units = line_runner(grader)

    def __call__(
        self, rows: Sequence[InputRow], on_progress: Progress
    ) -> list[Verdict]:
        # What has not arrived by the deadline is written as a `timeout` stand-in.
        left_s = self._deadline_s - (time.monotonic() - self._started_s)
        if left_s <= 0 or self.refused is not None:
            on_progress(len(rows))
            return [self._stand_in()] * len(rows)
        if self._watch is not None and any(is_code_gold(r.gold) for r in rows):
            self._watch.expect_code()
        try:
            return self._grader.grade(
                rows, on_progress=self._progress(on_progress), deadline_s=left_s
            )
        except (DeadlinePassedError, BrokerRefusedError) as exc:
            if isinstance(exc, BrokerRefusedError):
                self.refused = exc
            arrived = exc.partial or [None] * len(rows)
            on_progress(sum(v is None for v in arrived))
            return [self._stand_in() if v is None else v for v in arrived]
        finally:
            self._freeze_once()

    def units(
        self, units: Sequence[Any], weights: Sequence[int], on_progress: Progress
    ) -> list[Any]:
        """Line mode (`workers.lines.units`), in what is left of --deadline-s: a
        result per unit, None where none arrived in time (its lines are then
        written as rows, the `timeout` or `error` stand-ins of `__call__`)."""
        left_s = self._deadline_s - (time.monotonic() - self._started_s)
        if left_s <= 0 or self.run_units is None or self.refused is not None:
            return [None] * len(units)
        try:
            return self.run_units(
                units,
                weights,
                on_progress=self._progress(on_progress),
                deadline_s=left_s,
            )
        except (DeadlinePassedError, BrokerRefusedError) as exc:  # a fleet's
            if isinstance(exc, BrokerRefusedError):
                self.refused = exc
            return list(exc.partial or [None] * len(units))
        finally:
            self._freeze_once()

    def _freeze_once(self) -> None:
        """After the first chunk, the CLI's long-lived objects are all there (the
        embedded pool's warm-up has imported SymPy): moved out of the collector's
        reach, full collections stop walking them again and again (issue 11: 0.2 s
        of the CLI's 2.2 s of CPU on 60,760 rollouts). This process is the CLI's
        own, so nobody else's heap is frozen."""
        if not self._frozen:
            self._frozen = True
            gc.freeze()

    def _stand_in(self) -> Verdict:
        return deadline_verdict() if self.refused is None else refused_verdict()

    def _progress(self, on_progress: Progress) -> Progress:
        def advance(count: int) -> None:
            if self._watch is not None:
                self._watch.progress()
            on_progress(count)

        return advance


def _connect_url(url: str) -> str:
    """The broker URL with the password of `GRADEFLEET_REDIS_PASSWORD` (or the file
    named by `GRADEFLEET_REDIS_PASSWORD_FILE`): a password never has to be on the
    command line, where `ps` shows it."""
    try:
        password = read_secret(os.environ, "GRADEFLEET_REDIS_PASSWORD")
        return connect_url(url, password=password)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="'--broker'") from exc


def _keyring() -> Keyring | None:
    """The fleet key from `GRADEFLEET_SIGNING_KEY(_FILE)` (workers read the same)."""
    try:
        return keyring_from_env(os.environ)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="GRADEFLEET_SIGNING_KEY") from exc


@cli.command(epilog="Field aliases, first present wins:\n\n" + alias_table_text())
@click.argument(
    "input_path",
    metavar="INPUT",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
)
@click.option(
    "-o",
    "--output",
    "output_path",
    required=True,
    metavar="OUTPUT",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Where graded rows go: JSONL, or Parquet if it ends in .parquet "
    "(- for stdout); written atomically.",
)
@click.option(
    "--broker",
    envvar="GRADEFLEET_BROKER_URL",
    show_envvar=True,
    metavar="URL",
    callback=check_broker_url,
    help="Redis URL of a gradefleet fleet. Unset: embedded mode on this machine. "
    "A password goes in GRADEFLEET_REDIS_PASSWORD(_FILE), not in the URL.",
)
@response_gold_options
@click.option(
    "--resume",
    is_flag=True,
    help="Reuse the final verdicts already in OUTPUT (same input); grade the rest "
    "and the timeout/error ones.",
)
@click.option(
    "--report",
    "report_path",
    metavar="REPORT.json",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Also write `gradefleet report --json` of the output there.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=_DEFAULTS.batch_size,
    envvar="GRADEFLEET_BATCH_SIZE",
    show_default=True,
    help="Rollouts per task [default: on a fleet, sized per file chunk (16 to 512); "
    f"embedded: {LOCAL_BATCH_SIZE}]",
)
@click.option(
    "--deadline-s",
    type=click.FloatRange(min=0, min_open=True),
    default=_DEFAULTS.deadline_s,
    envvar="GRADEFLEET_DEADLINE_S",
    show_default=True,
    help="Results not graded by then are written as `timeout` (their input lines "
    "on stderr) and the exit code is 6; --resume grades just those later.",
)
@click.option(
    "--refused-limit-s",
    type=click.FloatRange(min=0, min_open=True),
    default=_DEFAULTS.refused_limit_s,
    envvar="GRADEFLEET_REFUSED_LIMIT_S",
    show_default=True,
    help="On a fleet: how long to wait for a broker that refuses writes (out of "
    "memory, read-only replica). Then what arrived is written, the rest as "
    "`error`, and the exit code is 8; --resume grades the rest later.",
)
@embedded_options
@click.option(
    "--no-fallback",
    is_flag=True,
    help="Only answers with an explicit marker (\\boxed{}, 'Answer:') can be correct.",
)
@click.option(
    "--priority",
    type=click.Choice(["interactive", "bulk"]),
    default=_DEFAULTS.priority,
    envvar="GRADEFLEET_PRIORITY",
    show_default=True,
    help="On a fleet: the lane of this file's jobs. Workers take interactive work "
    "(RL steps) first; bulk (sweeps) gets the rest and never starves.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
def grade(
    input_path: str,
    output_path: str,
    broker: str | None,
    batch_size: int,
    deadline_s: float,
    refused_limit_s: float,
    processes: int | None,
    item_timeout_s: float,
    item_memory_mb: int,
    cache_dir: Path | None,
    no_cache: bool,
    no_fallback: bool,
    priority: str,
    quiet: bool,
    response_field: str | None,
    gold_field: str | None,
    resume: bool,
    report_path: str | None,
) -> None:
    """Grade every rollout of INPUT; write OUTPUT in the same order.

    INPUT is JSONL (lm-eval's samples_*.jsonl too), Parquet (verl's layout) or an
    Inspect .eval log, told apart by content. Each record has a response and a gold
    (aliases below; a list of responses is one rollout per sample, with
    `sample_idx`; a list of golds means any of them). Each output row is the input
    object plus the verdict fields and `gradefleet_line` (the input line number).
    Malformed lines are reported on stderr and left out; the exit code is then 3.
    """
    check_output_path(input_path, output_path)
    require_format_extras(input_path, output_path)  # before the pool starts
    if report_path is not None:
        require("report", "numpy")
    # Embedded mode's code limits (a fleet's workers read their own environment).
    if (code_limits := code_limits_from_env(os.environ)) is not None:
        set_code_limits(code_limits)
    if (uid_base := code_uid_base_from_env(os.environ)) is not None:
        from workers.code.grade import configure_default_sandbox  # on a code row's need

        configure_default_sandbox(uid_base=uid_base)
    settings = ProducerSettings(
        broker_url=_connect_url(broker) if broker else None,
        batch_size=batch_size,
        deadline_s=deadline_s,
        processes=processes,
        item_timeout_s=item_timeout_s,
        item_memory_mb=item_memory_mb,
        cache_dir=cache_dir_option_value(cache_dir, no_cache),
        priority=priority,
        keyring=_keyring() if broker else None,
        refused_limit_s=refused_limit_s,
    )
    options = GradeOptions(allow_fallback=not no_fallback)
    started_s = time.monotonic()
    spec = FieldSpec(response=response_field, gold=gold_field)
    with (
        _switch_interval(FLEET_SWITCH_INTERVAL_S if settings.broker_url else None),
        open_grader(settings.broker_url, options=options, settings=settings) as grader,
        _watch(settings.broker_url) as watch,
    ):
        show_progress = not quiet and sys.stderr.isatty()
        grade_rows = _ChunkGrader(grader, settings.deadline_s, watch)
        grade_lines = None
        if grade_rows.run_units is not None:
            grade_lines = LineGrader(
                grade_rows.units, spec, options, **_unit_lines(settings)
            )
        summary = grade_file(
            input_path,
            output_path,
            grade_rows,
            spec=spec,
            show_progress=show_progress,
            resume=resume,
            overlap=settings.broker_url is not None,
            grade_lines=grade_lines,
        )
    summary.wall_s = time.monotonic() - started_s
    if not quiet:
        click.echo(summary.render(), err=True, nl=False)
    if report_path is not None:
        write_grade_report(output_path, report_path, spec)
    if grade_rows.refused is not None:
        raise BrokerRefusedError(
            f"{grade_rows.refused}; every row is written, those without a result "
            "as `error` (--resume grades them once the broker accepts writes)"
        )
    if summary.late_lines:
        raise deadline_error(summary)
    if summary.input_errors:
        raise MalformedInputError(
            f"{summary.input_errors} malformed input line(s) left out; "
            f"the other {summary.graded} were graded"
        )


@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("worker_args", nargs=-1, type=click.UNPROCESSED)
def worker(worker_args: tuple[str, ...]) -> None:
    """Start a grading worker (all options go to it; see `gradefleet worker --help`)."""
    from workers.__main__ import main as worker_main

    sys.exit(worker_main(list(worker_args)))


@cli.command()
@click.option(
    "--broker",
    envvar="GRADEFLEET_BROKER_URL",
    show_envvar=True,
    required=True,
    metavar="URL",
    help="Redis URL of the fleet.",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="How long to wait for workers to answer.",
)
@click.option(
    "--window-s",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Throughput is measured over this window.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object instead of a table."
)
@click.option(
    "--metrics",
    "metrics_urls",
    multiple=True,
    metavar="URL",
    envvar="GRADEFLEET_METRICS_URLS",
    help="A worker's metrics endpoint (repeat per node; env: space-separated). "
    "Adds rollouts by status, rollouts/s, cache hit rate, sandbox restarts.",
)
def status(
    broker: str,
    timeout_s: float,
    window_s: float,
    as_json: bool,
    metrics_urls: tuple[str, ...],
) -> None:
    """Show each lane's queue depth, running jobs by lane with their progress, live
    workers (and whether each holds the fleet key) and recent throughput of a fleet."""
    # Here, not at the top: urllib.request is 20 ms of every CLI start (issue 11:
    # a re-graded file takes ~0.7 s in all), and only this command reads metrics.
    from producer.client.status import read_fleet_status

    keyring = _keyring()
    fleet = read_fleet_status(
        _connect_url(broker),
        timeout_s=timeout_s,
        window_s=window_s,
        metrics_urls=metrics_urls,
        client_key_id=None if keyring is None else keyring.signing_id,
    )
    click.echo(fleet.to_json() if as_json else fleet.render())


cli.add_command(report)
cli.add_command(diff)
cli.add_command(audit)
cli.add_command(serve)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (`gradefleet = "producer.cli:main"`)."""
    with exit_on_signals():
        cli.main(args=list(argv) if argv is not None else None, prog_name="gradefleet")
