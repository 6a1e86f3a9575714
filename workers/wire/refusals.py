"""What a broker's refusal to write is, and how long a write it refused is retried.

A broker that answers but refuses to write: out of memory under `noeviction`, or a
replica made read-only by a failover. Both pass (memory is freed, a new master is
found), so workers and producers wait them out; a missing ACL permission
(NoPermissionError) never passes and stays fatal.
"""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff

# types-redis predates OutOfMemoryError (redis-py 4.6+).
from redis.exceptions import OutOfMemoryError, ReadOnlyError  # type: ignore[attr-defined]
from redis.retry import Retry

__all__ = ["BROKER_REFUSALS", "OUTLAST_REFUSALS", "broker_refusal"]

BROKER_REFUSALS: tuple[type[redis.ResponseError], ...] = (
    OutOfMemoryError,
    ReadOnlyError,
)
_MAX_CAUSES = 8
# A write the broker refuses is tried again after 0.1, 0.2, ... then every 2 s, about
# a minute in all: what an operator needs to raise `maxmemory` or a failover to end,
# while a running batch holds its verdicts instead of losing them.
OUTLAST_REFUSALS = Retry(
    ExponentialBackoff(cap=2.0, base=0.05), retries=40, supported_errors=BROKER_REFUSALS
)


def broker_refusal(exc: BaseException) -> BaseException | None:
    """The broker refusal in `exc` or its causes, else None (kombu and our own
    errors wrap Redis's)."""
    seen: BaseException | None = exc
    for _ in range(_MAX_CAUSES):
        if seen is None:
            return None
        if isinstance(seen, BROKER_REFUSALS):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
