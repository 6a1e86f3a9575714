"""Drop-in reward functions and scorers for RL trainers and eval frameworks.

One module per framework (`verl`, `trl`, `openrlhf`, `inspect`, `nemo_gym`), all on
the same coalescing grader (`producer.client.grading`) and the same reward mapping
(`reward`). Each grades on the service named by `grader_url=` or `GRADEFLEET_URL`
(`http(s)://`), or on a fleet (`redis://`, also `GRADEFLEET_BROKER_URL`), or in an
embedded pool when given neither. No module imports its framework at import time
except `inspect`, whose scorer must be built with Inspect's decorators. Beside them,
`reward.py` (a verdict's reward, pure) and `compat.py` (OpenRLHF's and NeMo Gym's
request and reply shapes), which the service answers with too.

It may import the client, `producer.errors`, `producer.settings` and `workers`; never
the reports, the service or the commands (see `tests/unit/test_import_graph.py`,
`docs/architecture.md`).

Adding a framework: one module here, importing the framework lazily, grading through
`_common` (one coalescing grader a process and loop), its reward from `reward.py`,
and a shape test in tests/unit/test_adapter_shapes.py.
"""

from __future__ import annotations
