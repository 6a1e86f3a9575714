"""Drop-in reward functions and scorers for RL trainers and eval frameworks.

One module per framework (`verl`, `trl`, `openrlhf`, `inspect`, `nemo_gym`), all on
the same coalescing grader (`producer.client.grading`) and the same reward mapping
(`reward`). Each grades on the service named by `grader_url=` or `GRADEFLEET_URL`
(`http(s)://`), or on a fleet (`redis://`, also `GRADEFLEET_BROKER_URL`), or in an
embedded pool when given neither. No module imports its framework at import time
except `inspect`, whose scorer must be built with Inspect's decorators.
"""

from __future__ import annotations
