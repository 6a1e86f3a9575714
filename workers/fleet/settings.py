"""Worker settings: a frozen dataclass; env is read only in `from_env`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from workers.code.item import code_limits_from_env, code_uid_base_from_env
from workers.errors import ConfigError
from workers.sizing import MAX_AUTO_BATCH_SIZE, RECYCLE_AFTER_ITEMS
from workers.wire.lanes import (
    CODE,
    DEFAULT_BULK_EVERY,
    LANES,
    Kind,
    Lane,
    parse_kind,
    parse_lane,
)
from workers.wire.signing import Keyring, keyring_from_env
from workers.wire.urls import connect_url, read_secret

if TYPE_CHECKING:
    from workers.code.grade import CodeLimits

__all__ = ["WorkerSettings", "parse_kinds", "parse_lanes"]

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """Everything a worker node needs; documented defaults, no env reads here.

    Attributes:
        broker_url: Redis URL of the Celery broker (must not evict keys).
        result_backend: Redis URL for task results; None means the broker URL.
        cache_url: Redis URL of the result cache; None disables the cache.
        concurrency: prefork processes (each with its own sandbox child).
        item_timeout_s: wall-clock limit for one item in the sandbox.
        item_memory_mb: address-space cap of the sandbox child.
        cache_ttl_s: lifetime of a cached verdict.
        metrics_port: port of the Prometheus endpoint; 0 turns it off.
        metrics_addr: address the endpoint binds: loopback by default, so that
            nothing outside the machine can scrape (or load the broker through) it;
            the container image sets 0.0.0.0 (`GRADEFLEET_METRICS_ADDR`).
        metrics_dir: prometheus_client multiprocess directory (None: a temp dir).
        max_attempts: deliveries of one batch that may die before its remaining
            items are answered `error` (poison batch).
        recycle_after_items: the sandbox child is replaced after this many items.
        max_batch_size: largest batch the time limits are sized for (producers
            make batches of at most 512 unless told otherwise).
        lanes: the priority lanes this node consumes, in the order it takes them
            (`workers.wire.lanes`; all of them unless the node is dedicated to one).
        bulk_every: after this many batches in a row from other lanes, the next
            take tries the bulk lane first (bulk never starves).
        kinds: the rollout kinds whose queues this node consumes (`math`, `code`;
            `workers.wire.lanes`); None: decided at start (`workers.__main__`):
            both where this machine can run the code sandbox, else math only.
        hostname: Celery node name (None: Celery's default).
        loglevel: Celery log level.
        keyring: the fleet's signing keys (`workers.wire.signing`), from
            `GRADEFLEET_SIGNING_KEY` or the file `GRADEFLEET_SIGNING_KEY_FILE` (one
            key per line, the first signs); None: nothing is authenticated.
        code_limits: the code grader's limits (`workers.code.grade.CodeLimits`), from
            `GRADEFLEET_CODE_TIME_LIMIT_S` (per test), `GRADEFLEET_CODE_WALL_S` (a
            rollout) and `GRADEFLEET_CODE_MEMORY_MB`; None: its defaults.
        code_uid_base: the first uid of the code sandbox's slots
            (`GRADEFLEET_CODE_UID_BASE`; None: the sandbox's own, 1,600,000): one
            inside the worker's user namespace where it maps few ids.
        test_hooks_path: a Python file whose `hooked_grade` replaces the verifier
            in the sandbox: the test tree's misbehaving grader (never in production).
    """

    broker_url: str = DEFAULT_BROKER_URL
    result_backend: str | None = None
    cache_url: str | None = DEFAULT_BROKER_URL
    concurrency: int = 2
    item_timeout_s: float = 5.0
    item_memory_mb: int = 1024
    cache_ttl_s: int = 86_400
    metrics_port: int = 0
    metrics_addr: str = "127.0.0.1"
    metrics_dir: str | None = None
    max_attempts: int = 3
    recycle_after_items: int = RECYCLE_AFTER_ITEMS
    max_batch_size: int = MAX_AUTO_BATCH_SIZE
    lanes: tuple[Lane, ...] = LANES
    bulk_every: int = DEFAULT_BULK_EVERY
    kinds: tuple[Kind, ...] | None = None
    hostname: str | None = None
    loglevel: str = "INFO"
    keyring: Keyring | None = None
    code_limits: CodeLimits | None = None
    code_uid_base: int | None = None
    test_hooks_path: str | None = None

    def __post_init__(self) -> None:
        checks = {
            "concurrency": self.concurrency >= 1,
            "item_timeout_s": self.item_timeout_s > 0,
            "item_memory_mb": self.item_memory_mb >= 64,
            "cache_ttl_s": self.cache_ttl_s >= 1,
            "metrics_port": 0 <= self.metrics_port <= 65_535,
            "max_attempts": self.max_attempts >= 1,
            "recycle_after_items": self.recycle_after_items >= 1,
            "max_batch_size": self.max_batch_size >= 1,
            "lanes": bool(self.lanes) and len(set(self.lanes)) == len(self.lanes),
            "bulk_every": self.bulk_every >= 1,
            "kinds": self.kinds is None
            or (bool(self.kinds) and len(set(self.kinds)) == len(self.kinds)),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"invalid worker settings: {', '.join(bad)}")

    @property
    def backend_url(self) -> str:
        """Where Celery stores results (the broker's Redis unless set)."""
        return self.result_backend or self.broker_url

    @property
    def grades_code(self) -> bool:
        """Whether this node takes code rollouts (kinds undecided: as before kinds,
        it grades whatever it is given)."""
        return self.kinds is None or CODE in self.kinds

    @property
    def item_memory_bytes(self) -> int:
        return self.item_memory_mb * 1024 * 1024

    @property
    def longest_batch_s(self) -> float:
        """Worst case for one batch: every item runs to its deadline, plus respawns.

        A code item's deadline is its first test's time limit plus the program's
        start (`grade_code` runs no test after a timeout); a code item whose every
        test passes just under its limit can take up to the code wall budget, and a
        batch of many such is answered `timeout` past the soft limit (never cached).
        """
        item_s = self.item_timeout_s
        if self.code_limits is not None:
            code = self.code_limits
            item_s = max(item_s, code.time_limit_s + code.startup_s)
        return self.max_batch_size * (item_s + 0.5)

    @property
    def visibility_timeout_s(self) -> int:
        """Redis re-delivers an unacked task after this; keep it ≫ the longest batch."""
        return max(3_600, int(2 * self.longest_batch_s))

    def replace(self, **changes: object) -> WorkerSettings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        """Read `GRADEFLEET_*` variables (the only env reader on the worker side).

        The Redis password comes from `GRADEFLEET_REDIS_PASSWORD` or the file named
        by `GRADEFLEET_REDIS_PASSWORD_FILE` (never argv) and goes into every URL
        that has none (`urls.connect_url`, which also sets `rediss://` defaults).
        """
        env = os.environ if environ is None else environ
        password = read_secret(env, "GRADEFLEET_REDIS_PASSWORD")

        def url(raw: str) -> str:
            return connect_url(raw, password=password)

        broker = env.get("GRADEFLEET_BROKER_URL", DEFAULT_BROKER_URL)
        cache = env.get("GRADEFLEET_CACHE_URL", broker)
        backend = env.get("GRADEFLEET_RESULT_BACKEND") or None
        return cls(
            broker_url=url(broker),
            result_backend=None if backend is None else url(backend),
            cache_url=None if cache.strip().lower() in ("", "none") else url(cache),
            concurrency=_int(env, "GRADEFLEET_CONCURRENCY", 2),
            item_timeout_s=_float(env, "GRADEFLEET_ITEM_TIMEOUT_S", 5.0),
            item_memory_mb=_int(env, "GRADEFLEET_ITEM_MEMORY_MB", 1024),
            cache_ttl_s=_int(env, "GRADEFLEET_CACHE_TTL_S", 86_400),
            metrics_port=_int(env, "GRADEFLEET_METRICS_PORT", 0),
            metrics_addr=env.get("GRADEFLEET_METRICS_ADDR") or "127.0.0.1",
            keyring=keyring_from_env(env),
            metrics_dir=env.get("GRADEFLEET_METRICS_DIR") or None,
            max_attempts=_int(env, "GRADEFLEET_MAX_ATTEMPTS", 3),
            recycle_after_items=_int(
                env, "GRADEFLEET_RECYCLE_AFTER_ITEMS", RECYCLE_AFTER_ITEMS
            ),
            max_batch_size=_int(env, "GRADEFLEET_MAX_BATCH_SIZE", MAX_AUTO_BATCH_SIZE),
            lanes=parse_lanes(env.get("GRADEFLEET_LANES") or ",".join(LANES)),
            bulk_every=_int(env, "GRADEFLEET_BULK_EVERY", DEFAULT_BULK_EVERY),
            kinds=parse_kinds(env.get("GRADEFLEET_KINDS") or "") or None,
            hostname=env.get("GRADEFLEET_HOSTNAME") or None,
            loglevel=env.get("GRADEFLEET_LOGLEVEL", "INFO"),
            test_hooks_path=env.get("GRADEFLEET_TEST_HOOKS") or None,
            code_limits=code_limits_from_env(env),
            code_uid_base=code_uid_base_from_env(env),
        )


_Name = TypeVar("_Name", bound=str)


def _comma_list(
    text: str, parse: Callable[[str], _Name], setting: str
) -> tuple[_Name, ...]:
    try:
        return tuple(parse(part.strip()) for part in text.split(",") if part)
    except ValueError as exc:
        raise ConfigError(f"{setting}: {exc}") from exc


def parse_lanes(text: str) -> tuple[Lane, ...]:
    """Comma-separated lane names (`interactive,bulk`), in the order given.

    Raises:
        ConfigError: an unknown lane name.
    """
    return _comma_list(text, parse_lane, "GRADEFLEET_LANES / --lanes")


def parse_kinds(text: str) -> tuple[Kind, ...]:
    """Comma-separated kind names (`math,code`), in the order given.

    Raises:
        ConfigError: an unknown kind name.
    """
    return _comma_list(text, parse_kind, "GRADEFLEET_KINDS / --kinds")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not an integer") from exc


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a number") from exc
