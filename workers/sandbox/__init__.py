"""Killable child processes that grade: fork hygiene, the long-lived sandbox child
and its grading loop, item deadlines and memory caps, the shared progress slots a
parent watches, and the one builder of failure verdicts (error, timeout).

It may import `workers.models`, `workers.errors`, `workers.sizing`, the graders
(`workers.verifier`, through `workers.kinds`) and the standard library; never the
cache, the embedded pool, the fleet or the producer (see
`tests/unit/test_import_graph.py`, `docs/architecture.md`).

Adding to it: a new limit on a child is enforced in the parent (`process.py`, which
kills the child past it) and reported as a verdict built by `verdicts.py`, never as
an exception; the child's side of a new message goes in `child.py`, its frames through
`childproc.py`.
"""
