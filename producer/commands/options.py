"""Click options shared by the commands that can grade on this machine (`grade`,
`serve`): the embedded pool's processes, per-item limits and result cache, each with
its env var and `ProducerSettings`' default, declared once so both commands accept
the same flags and variables."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from producer.settings import ProducerSettings, default_cache_dir

__all__ = ["cache_dir_option_value", "embedded_options"]

F = TypeVar("F", bound=Callable[..., object])
_DEFAULTS = ProducerSettings()

_OPTIONS = (
    click.option(
        "--processes",
        type=click.IntRange(min=1),
        envvar="GRADEFLEET_PROCESSES",
        help="Embedded mode: grading processes [default: CPU count].",
    ),
    click.option(
        "--item-timeout-s",
        type=click.FloatRange(min=0, min_open=True),
        default=_DEFAULTS.item_timeout_s,
        envvar="GRADEFLEET_ITEM_TIMEOUT_S",
        show_default=True,
        help="Embedded mode: wall-clock limit per rollout.",
    ),
    click.option(
        "--item-memory-mb",
        type=click.IntRange(min=64),
        default=_DEFAULTS.item_memory_mb,
        envvar="GRADEFLEET_ITEM_MEMORY_MB",
        show_default=True,
        help="Embedded mode: memory cap per grading process.",
    ),
    click.option(
        "--cache-dir",
        type=click.Path(file_okay=False, path_type=Path),
        envvar="GRADEFLEET_CACHE_DIR",
        help="Embedded mode: result cache directory "
        "[default: $XDG_CACHE_HOME/gradefleet].",
    ),
    click.option(
        "--no-cache",
        is_flag=True,
        envvar="GRADEFLEET_NO_CACHE",
        help="Embedded mode: grade everything afresh, cache nothing.",
    ),
)


def embedded_options(command: F) -> F:
    """Adds `--processes`, `--item-timeout-s`, `--item-memory-mb`, `--cache-dir` and
    `--no-cache` (parameters `processes`, `item_timeout_s`, `item_memory_mb`,
    `cache_dir`, `no_cache`)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def cache_dir_option_value(cache_dir: Path | None, no_cache: bool) -> Path | None:
    """The cache directory those options name (None: no cache). Reads the
    environment: call it in a command, the entry point."""
    if no_cache:
        return None
    return cache_dir or default_cache_dir(os.environ)
