"""Rollout files in and out, on the caller's side: JSONL, Parquet and Inspect `.eval`
logs told apart by name and content (`formats.py`), and reading ahead and writing
behind in threads so the CLI's JSON work overlaps grading (`overlap.py`). The line
format itself (fields, records, line units) is `workers.lines`, shared with the
fleet.

It may import `producer.errors`, `producer.settings` and `workers`; never the client,
the reports, the service, the adapters or the commands (see
`tests/unit/test_import_graph.py`, `docs/architecture.md`).

Adding to it: a new file format gets a reader and a writer in `formats.py`, picked by
its suffix or content, importing a heavy library (pyarrow, inspect-ai) only when a
file of its format is read.
"""
