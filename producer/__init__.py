"""gradefleet producer side: client library and the `gradefleet` CLI (no SymPy here).

Names are imported on first use (PEP 562), so `import producer` stays light: the
Celery client is loaded only when `producer.GradingClient` is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from producer.aio import AsyncGradingClient, AsyncGradingJob
    from producer.batching import InputRow, LineError, read_rows
    from producer.client import GradingClient, GradingJob, Rollout
    from producer.errors import (
        BrokerUnavailableError,
        DeadlinePassedError,
        InvalidRolloutError,
        MalformedInputError,
        ProducerError,
    )
    from producer.settings import ProducerSettings

__all__ = [
    "AsyncGradingClient",
    "AsyncGradingJob",
    "BrokerUnavailableError",
    "DeadlinePassedError",
    "GradingClient",
    "GradingJob",
    "InputRow",
    "InvalidRolloutError",
    "LineError",
    "MalformedInputError",
    "ProducerError",
    "ProducerSettings",
    "Rollout",
    "read_rows",
]

_HOMES = {
    "AsyncGradingClient": "producer.aio",
    "AsyncGradingJob": "producer.aio",
    "GradingClient": "producer.client",
    "GradingJob": "producer.client",
    "Rollout": "producer.client",
    "InputRow": "producer.batching",
    "LineError": "producer.batching",
    "read_rows": "producer.batching",
    "ProducerSettings": "producer.settings",
    "BrokerUnavailableError": "producer.errors",
    "DeadlinePassedError": "producer.errors",
    "InvalidRolloutError": "producer.errors",
    "MalformedInputError": "producer.errors",
    "ProducerError": "producer.errors",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'producer' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
