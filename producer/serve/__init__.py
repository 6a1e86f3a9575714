"""`gradefleet serve`, the grading service: the FastAPI app (`service.py`), the hot
path of `POST /v1/grade` graded without FastAPI (`grade_route.py`), its request and
response bodies (`schemas.py`) and per-route metrics (`http_metrics.py`).

It may import the client (the coalescing graders), the adapters' reward and request
shapes, `producer.errors`, `producer.settings` and `workers`; never the reports or
the commands (see `tests/unit/test_import_graph.py`, `docs/architecture.md`).
uvicorn is imported only by `producer.commands.serve`.

Adding to it: a new route gets its body in `schemas.py` and its metrics name in
`http_metrics.py`; a well-formed request must be answered byte for byte as the
FastAPI path answers it.
"""
