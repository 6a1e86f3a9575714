"""A tiny Inspect code task scored by gradefleet's unit-test scorer (run with the
replay model of `replay_model.py`, see tests/integration/test_inspect.py)."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.solver import generate

from producer.adapters.inspect import unit_tests
from tests.inspect_task.code_samples import code_samples


@task
def replay_code() -> Task:
    samples = [
        Sample(id=s.sid, input=s.question, target=s.target, metadata=s.metadata)
        for s in code_samples()
    ]
    return Task(dataset=samples, solver=generate(), scorer=unit_tests())
