"""The `gradefleet` command line: `grade` a JSONL file, run a `worker`, show `status`.

Exit codes: 0 ok, 2 usage error, and `ProducerError.exit_code` otherwise (see
`producer.errors`): 3 some input lines malformed, 5 broker unreachable, 6 deadline.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import click

from producer.batching import (
    InputRow,
    LineError,
    Summary,
    atomic_output,
    chunked,
    dump_line,
    graded_record,
    read_rows,
)
from producer.errors import DeadlinePassedError, MalformedInputError, ProducerError
from producer.grader import Grader, open_grader
from producer.serve_cli import serve
from producer.settings import ProducerSettings, default_cache_dir
from producer.status import read_fleet_status
from workers.errors import ConfigError, GraderError
from workers.models import GradeOptions, Verdict
from workers.signing import Keyring, keyring_from_env
from workers.sizing import CHUNK_ROWS, LOCAL_BATCH_SIZE
from workers.urls import connect_url, read_secret

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar

__all__ = ["cli", "main"]

MAX_ERRORS_SHOWN = 20
_DEFAULTS = ProducerSettings()

Progress = Callable[[int], None]
GradeRows = Callable[[Sequence[InputRow], Progress], list[Verdict]]


class _CliGroup(click.Group):
    """Turns expected failures into a one-line message and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ProducerError as exc:
            _exit_one_line(ctx, exc, exc.exit_code)
        except (GraderError, OSError) as exc:
            # The local pool could not start, the disk is full, ...: no traceback.
            _exit_one_line(ctx, exc, ProducerError.exit_code)


def _exit_one_line(ctx: click.Context, exc: BaseException, exit_code: int) -> NoReturn:
    # Not a ClickException with a changed exit_code: click 8.5 made that a ClassVar.
    click.echo(f"Error: {str(exc) or type(exc).__name__}", err=True)
    ctx.exit(exit_code)


@click.group(cls=_CliGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Grade LLM math rollouts: locally (embedded mode) or on a Celery fleet."""


class _ChunkGrader:
    """Grades the file's chunks through one `Grader`; --deadline-s bounds the whole
    command, so each chunk gets what is left of it."""

    def __init__(self, grader: Grader, deadline_s: float) -> None:
        self._grader = grader
        self._deadline_s = deadline_s
        self._started_s = time.monotonic()

    def __call__(
        self, rows: Sequence[InputRow], on_progress: Progress
    ) -> list[Verdict]:
        left_s = self._deadline_s - (time.monotonic() - self._started_s)
        if left_s <= 0:
            raise DeadlinePassedError(f"deadline of {self._deadline_s:g} s passed")
        return self._grader.grade(rows, on_progress=on_progress, deadline_s=left_s)


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


def _count_rows(path: str) -> int | None:
    """Non-blank lines of a regular file (the progress bar's length), else None."""
    if path == "-" or not os.path.isfile(path):
        return None
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


@contextmanager
def _progress(total: int | None, enabled: bool) -> Iterator[Progress]:
    if not enabled:
        yield lambda _n: None
        return
    bar: ProgressBar[int] = click.progressbar(
        length=total, label="grading", file=sys.stderr, show_pos=True, width=30
    )
    with bar:
        yield bar.update


@contextmanager
def _open_input(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdin.buffer
        return
    with open(path, "rb") as handle:
        yield handle


class _ErrorReport:
    """Prints the first malformed lines to stderr and counts the rest."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.count = 0

    def __call__(self, error: LineError) -> None:
        self.count += 1
        if self.count <= MAX_ERRORS_SHOWN:
            click.echo(f"gradefleet: {self.source}: {error}", err=True)

    def finish(self) -> None:
        hidden = self.count - MAX_ERRORS_SHOWN
        if hidden > 0:
            click.echo(f"gradefleet: ... and {hidden} more malformed lines", err=True)


def _grade_file(
    input_path: str, output_path: str, grade_rows: GradeRows, show_progress: bool
) -> Summary:
    summary = Summary()
    errors = _ErrorReport("<stdin>" if input_path == "-" else input_path)
    total = _count_rows(input_path) if show_progress else None
    with (
        _open_input(input_path) as stream,
        atomic_output(output_path) as out,
        _progress(total, show_progress) as advance,
    ):
        for chunk in chunked(read_rows(stream), CHUNK_ROWS):
            rows = [row for row in chunk if isinstance(row, InputRow)]
            for bad in chunk:
                if isinstance(bad, LineError):
                    errors(bad)
                    advance(1)
            verdicts = grade_rows(rows, advance) if rows else []
            for row, verdict in zip(rows, verdicts, strict=True):
                out.write(dump_line(graded_record(row, verdict)))
                summary.add(verdict)
    errors.finish()
    summary.input_errors = errors.count
    return summary


@cli.command()
@click.argument(
    "input_path",
    metavar="INPUT.jsonl",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
)
@click.option(
    "-o",
    "--output",
    "output_path",
    required=True,
    metavar="OUTPUT.jsonl",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Where graded lines go (- for stdout); written atomically.",
)
@click.option(
    "--broker",
    envvar="GRADEFLEET_BROKER_URL",
    show_envvar=True,
    metavar="URL",
    help="Redis URL of a gradefleet fleet. Unset: embedded mode on this machine. "
    "A password goes in GRADEFLEET_REDIS_PASSWORD(_FILE), not in the URL.",
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
    help="Fail (exit 6) if grading takes longer.",
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    envvar="GRADEFLEET_PROCESSES",
    help="Embedded mode: grading processes [default: CPU count].",
)
@click.option(
    "--item-timeout-s",
    type=click.FloatRange(min=0, min_open=True),
    default=_DEFAULTS.item_timeout_s,
    envvar="GRADEFLEET_ITEM_TIMEOUT_S",
    show_default=True,
    help="Embedded mode: wall-clock limit per rollout.",
)
@click.option(
    "--item-memory-mb",
    type=click.IntRange(min=64),
    default=_DEFAULTS.item_memory_mb,
    envvar="GRADEFLEET_ITEM_MEMORY_MB",
    show_default=True,
    help="Embedded mode: memory cap per grading process.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="GRADEFLEET_CACHE_DIR",
    help="Embedded mode: result cache directory [default: $XDG_CACHE_HOME/gradefleet].",
)
@click.option(
    "--no-cache",
    is_flag=True,
    envvar="GRADEFLEET_NO_CACHE",
    help="Embedded mode: grade everything afresh, cache nothing.",
)
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
    processes: int | None,
    item_timeout_s: float,
    item_memory_mb: int,
    cache_dir: Path | None,
    no_cache: bool,
    no_fallback: bool,
    priority: str,
    quiet: bool,
) -> None:
    """Grade every rollout of INPUT.jsonl; write OUTPUT.jsonl in the same order.

    Each input line is a JSON object with a response (`response`, or `completion`,
    `output`, `solution_str`) and a gold answer (`gold`, or `ground_truth`, `answer`,
    `solution`, `expected_answer`, `reward_model.ground_truth`); the first field
    present wins. Each output line is the input object plus the verdict fields and
    `gradefleet_line` (the input line number). Malformed lines are reported on stderr
    and left out of the output; the exit code is then 3.
    """
    if output_path != "-" and not Path(output_path).absolute().parent.is_dir():
        raise click.BadParameter(
            f"directory of {output_path!r} does not exist", param_hint="'-o'"
        )
    settings = ProducerSettings(
        broker_url=_connect_url(broker) if broker else None,
        batch_size=batch_size,
        deadline_s=deadline_s,
        processes=processes,
        item_timeout_s=item_timeout_s,
        item_memory_mb=item_memory_mb,
        cache_dir=None if no_cache else (cache_dir or default_cache_dir(os.environ)),
        priority=priority,
        keyring=_keyring() if broker else None,
    )
    options = GradeOptions(allow_fallback=not no_fallback)
    started_s = time.monotonic()
    with open_grader(settings.broker_url, options=options, settings=settings) as grader:
        show_progress = not quiet and sys.stderr.isatty()
        grade_rows = _ChunkGrader(grader, settings.deadline_s)
        summary = _grade_file(input_path, output_path, grade_rows, show_progress)
    summary.wall_s = time.monotonic() - started_s
    if not quiet:
        click.echo(summary.render(), err=True, nl=False)
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
    workers and recent throughput of a fleet."""
    fleet = read_fleet_status(
        _connect_url(broker),
        timeout_s=timeout_s,
        window_s=window_s,
        metrics_urls=metrics_urls,
    )
    click.echo(fleet.to_json() if as_json else fleet.render())


cli.add_command(serve)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (`gradefleet = "producer.cli:main"`)."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="gradefleet")
