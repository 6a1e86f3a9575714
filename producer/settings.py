"""Producer settings: a frozen dataclass, built by its one reader of `GRADEFLEET_*`
variables, the CLI (each field is an option with its env var and the same default)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workers.wire.signing import Keyring
from workers.wire.urls import redact_url

__all__ = [
    "CACHE_FILE_NAME",
    "DEFAULT_REFUSED_LIMIT_S",
    "ProducerSettings",
    "default_cache_dir",
    "redact_url",
]

CACHE_FILE_NAME = "cache.sqlite3"
# How long a fleet job waits for a broker that refuses writes (maxmemory, a
# read-only replica) before it ends with what arrived: long enough for an operator
# to raise `maxmemory` or for a failover, short enough that a stuck run says why.
DEFAULT_REFUSED_LIMIT_S = 60.0


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """`$XDG_CACHE_HOME/gradefleet`, else `~/.cache/gradefleet` (nothing is created)."""
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "gradefleet"
    home = environ.get("HOME", "").strip() or str(Path.home())
    return Path(home) / ".cache" / "gradefleet"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerSettings:
    """How the producer grades a file.

    Attributes:
        broker_url: Redis URL of the fleet; None means embedded mode (a local pool).
        batch_size: rollouts per Celery task (or per local pool batch); None: sized
            per job on a fleet (`sizing.batch_size_for`), 64 in embedded mode.
        deadline_s: give up (DeadlinePassedError) if results take longer than this.
        processes: embedded mode only: grading processes; None means os.cpu_count().
        item_timeout_s: embedded mode only: wall-clock limit per rollout.
        item_memory_mb: embedded mode only: memory cap per grading process.
        cache_dir: embedded mode only: where the SQLite result cache lives;
            None disables the cache.
        priority: on a fleet, the lane of the file's jobs: `bulk` (a sweep: workers
            take interactive work, such as RL steps, first) or `interactive`.
        keyring: fleet mode: the fleet's signing keys (tasks signed, results
            verified; see `workers.wire.signing`).
        refused_limit_s: fleet mode: how long a job waits for a broker that
            refuses writes (maxmemory, read-only replica) before the run ends,
            writing what arrived (exit 8).
    """

    broker_url: str | None = None
    batch_size: int | None = None
    deadline_s: float = 3600.0
    processes: int | None = None
    item_timeout_s: float = 5.0
    item_memory_mb: int = 1024
    cache_dir: Path | None = None
    priority: str = "bulk"
    keyring: Keyring | None = None
    refused_limit_s: float = DEFAULT_REFUSED_LIMIT_S

    def __post_init__(self) -> None:
        checks = {
            "batch_size": self.batch_size is None or self.batch_size >= 1,
            "deadline_s": self.deadline_s > 0,
            "refused_limit_s": self.refused_limit_s > 0,
            "processes": self.processes is None or self.processes >= 1,
            "item_timeout_s": self.item_timeout_s > 0,
            "item_memory_mb": self.item_memory_mb >= 64,
            "priority": self.priority in ("interactive", "bulk"),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid producer settings: {', '.join(bad)}")

    @property
    def cache_path(self) -> Path | None:
        """The SQLite file inside `cache_dir` (None when the cache is off)."""
        return None if self.cache_dir is None else self.cache_dir / CACHE_FILE_NAME
