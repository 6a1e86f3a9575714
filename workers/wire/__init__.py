"""What crosses Redis between producers and workers: Redis URLs and clients, the fleet
key's signatures, every Redis key and the result envelope, the task message, the
queues of each priority lane and rollout kind, and what a broker's refusal to write is.

Both sides speak through this folder, so it holds no Celery, no grader and no
producer code: it may import `workers.models`, `workers.errors`, `workers.sizing`
and the standard library plus redis-py, nothing above them (see
`tests/unit/test_import_graph.py`, `docs/architecture.md`).

Adding to it: a new Redis key gets its builder in `protocol.py` (the one list of
keys, checked by tests/unit/test_protocol.py) and a line in docs/operations.md's key
table; a field of the task message goes in `contract.py` with its bound, and anything
a worker trusts from Redis is signed through `signing.py`.
"""
