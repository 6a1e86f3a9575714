"""A tiny Inspect task over real Qwen2.5-Math outputs, scored by gradefleet (run with
the replay model of `replay_model.py`, see tests/integration/test_inspect.py)."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.solver import generate

from producer.adapters.inspect import math_verdict
from tests.inspect_task.replay_model import QUESTIONLESS, records


@task
def replay_math() -> Task:
    samples = [Sample(input=r["question"], target=r["gt"]) for r in records()]
    samples.append(Sample(input=QUESTIONLESS, target="\\frac{"))
    return Task(dataset=samples, solver=generate(), scorer=math_verdict())
