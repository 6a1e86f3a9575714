"""The Celery fleet: the app and its process signals, the `gradefleet.grade_batch`
task, each worker process's runtime, a batch's Redis bookkeeping and claim, line
units on a fleet, the broker transport and kombu fixes, the timer heap, worker
settings and every Prometheus metric.

It is the top of the worker side: it may import every other folder of `workers`
(it grades through the embedded engine and the line format), never the producer;
only `workers/__main__.py` (`python -m workers`) sits above it (see
`tests/unit/test_import_graph.py`, `docs/architecture.md`).

Adding to it: a task's name on the wire lives in `workers.wire.contract` and never
changes with a module's path; a new setting is read from the environment only in
`settings.WorkerSettings.from_env`; a new metric is built in `metrics.py` on the
injected registry, and its name added to deploy/'s dashboards and alerts.
"""
