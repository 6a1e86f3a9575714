"""Grading from a caller's process: `open_grader(url)` and the `Grader` seam, the
fleet client (`fleet.GradingClient`: batches to Redis, verdicts back in input order)
and its jobs and job board, its asyncio twin, the client of a running `gradefleet
serve`, the coalescing asyncio graders behind the service and the adapters, and
what `gradefleet status` reads.

It may import `producer.errors`, `producer.settings` and any of `workers` (the wire
format, the embedded engine, the line format); never the reports, the service, the
adapters or the commands (see `tests/unit/test_import_graph.py`,
`docs/architecture.md`). Importing it pulls in no SymPy until a grader is opened.

Adding to it: a new transport registers its URL schemes with
`grader.register_scheme` ("module:function", imported only when a URL needs it) and
returns verdicts byte for byte equal to the embedded pool's.
"""
