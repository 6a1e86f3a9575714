"""The grading engine of one machine: a batch graded through the cache and the
sandbox (`batch.py`), the embedded pool of local grading processes (`pool.py`, the
default when no broker is configured, and what each fleet worker runs inside), and
grading in the pool process itself, watched from outside (`inline.py`).

It may import the sandbox, the caches, the graders, `workers.wire`, the shared
value types and the standard library; never the line format, the fleet or the
producer (see `tests/unit/test_import_graph.py`, `docs/architecture.md`).

Adding to it: work a pool process does gets a frame in `pool.py` and keeps the item
deadline and memory cap of the sandbox; a verdict never depends on which process
graded it (the embedded and fleet verdicts are compared byte for byte in tests).
"""
