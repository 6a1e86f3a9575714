"""What a graded file says: `gradefleet report` (accuracy, pass@k and maj@k per group)
in text and HTML, `diff` between two gradings, `audit` against trusted labels, and
the statistics behind them (pure stdlib).

It may import `producer.errors`, `producer.files` and `workers` (the line format and
value types); never the client, the service, the adapters or the commands (see
`tests/unit/test_import_graph.py`, `docs/architecture.md`).

Adding to it: a new figure is computed in `report.py` (or `stats.py`, tested against
a reference implementation) and drawn by each form (`report_text.py`,
`report_html.py`); its command options live in `producer.commands.report`.
"""
