"""gradefleet producer side: client library and the `gradefleet` CLI (no SymPy here).

Grade through `open_grader(url)`: the embedded pool (no URL), a fleet (redis://) or a
grading service (http://), with the same verdicts.

Names are imported on first use (PEP 562), so `import producer` stays light: the
Celery client is loaded only when `producer.GradingClient` is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from producer.client.aio import AsyncGradingClient, AsyncGradingJob
    from producer.client.fleet import GradingClient, GradingJob, Rollout
    from producer.client.grader import Grader, GraderBase, open_grader, register_scheme
    from producer.client.rollouts import code_rollout
    from producer.errors import (
        BrokerUnavailableError,
        DeadlinePassedError,
        InvalidRolloutError,
        MalformedInputError,
        ProducerError,
    )
    from producer.settings import ProducerSettings
    from workers.lines.records import InputRow, LineError, read_rows
    from workers.models import GradeOptions

__all__ = [
    "AsyncGradingClient",
    "AsyncGradingJob",
    "BrokerUnavailableError",
    "DeadlinePassedError",
    "GradeOptions",
    "Grader",
    "GraderBase",
    "GradingClient",
    "GradingJob",
    "InputRow",
    "InvalidRolloutError",
    "LineError",
    "MalformedInputError",
    "ProducerError",
    "ProducerSettings",
    "Rollout",
    "code_rollout",
    "open_grader",
    "read_rows",
    "register_scheme",
]

_HOMES = {
    "AsyncGradingClient": "producer.client.aio",
    "AsyncGradingJob": "producer.client.aio",
    "GradingClient": "producer.client.fleet",
    "GradingJob": "producer.client.fleet",
    "Rollout": "producer.client.fleet",
    "Grader": "producer.client.grader",
    "GraderBase": "producer.client.grader",
    "open_grader": "producer.client.grader",
    "register_scheme": "producer.client.grader",
    "code_rollout": "producer.client.rollouts",
    "InputRow": "workers.lines.records",
    "LineError": "workers.lines.records",
    "read_rows": "workers.lines.records",
    "ProducerSettings": "producer.settings",
    "GradeOptions": "workers.models",
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
