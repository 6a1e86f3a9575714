"""The rollout-file line format both sides share: which fields of a record hold the
response(s), gold(s) and id (`fields.py`), JSONL records in and graded records out
(`records.py`: line errors, chunking, output lines), and line-mode units of raw
lines graded whole by a pool and rendered there (`units.py`).

The CLI writes these lines and a fleet worker renders them byte for byte alike, so
the format has this one definition, below both: it may import the embedded engine,
the caches, `workers.wire`, the shared value types and the standard library plus
orjson; never the fleet or the producer (see `tests/unit/test_import_graph.py`,
`docs/architecture.md`).

Adding to it: a new input alias goes in `fields.py` (and docs/grading.md's alias table),
a new output field in `workers.models.VERDICT_FIELDS`; an output line must stay byte
for byte what `records.dump_line` writes, in item mode and line mode alike.
"""
