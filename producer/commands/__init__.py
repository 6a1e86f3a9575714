"""The `gradefleet` commands behind `producer.cli`: the options shared by the commands
that grade on this machine (`options.py`), grading one rollout file (`sweep.py`),
`report`/`diff`/`audit` (`report.py`), `serve` (`serve.py`, the one importer of
uvicorn), stopping on signals (`signals.py`) and the no-live-worker warning
(`watchdog.py`).

It may import every other folder of `producer` and `workers`; only `producer.cli`
(the `gradefleet` console script) and `producer/__init__.py` sit above it (see
`tests/unit/test_import_graph.py`, `docs/architecture.md`).

Adding to it: a command's click function is registered in `producer.cli`; its work
lives in the folder that owns it, so this folder holds options, checks and wiring;
a bad input exits with the code its `producer.errors` class carries.
"""
