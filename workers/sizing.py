"""How grading work is cut up, at every level, in one place (pure).

From the outside in: the CLI reads a file `CHUNK_ROWS` rows at a time; a job is split
into tasks of `batch_size_for(rollouts)` rollouts on a fleet (`LOCAL_BATCH_SIZE` in
the embedded pool); a task grades its batch in chunks that grow while they are fast
(`next_chunk_items`); the sandbox streams a chunk to its child at most
`SANDBOX_FRAME_ITEMS` items per frame. `tests/bench/bench_fleet.py --batch-sizes`
prints the rollouts/s table behind the task sizes.
"""

from __future__ import annotations

__all__ = [
    "CACHE_WRITE_BEHIND_BYTES",
    "CACHE_WRITE_BEHIND_ROWS",
    "CHUNK_ROWS",
    "CHUNK_ROWS_GROWTH",
    "COALESCED_BATCH_SIZE",
    "FIRST_CHUNK_ITEMS",
    "FIRST_CHUNK_ROWS",
    "JOB_BATCHES",
    "LINE_UNITS_PER_CHUNK",
    "LOCAL_BATCH_SIZE",
    "MAX_AUTO_BATCH_SIZE",
    "MAX_CHUNK_ITEMS",
    "MAX_LINE_UNIT_LINES",
    "MIN_BATCH_SIZE",
    "RECYCLE_AFTER_ITEMS",
    "RECYCLE_GROWN_SHARE",
    "SANDBOX_FRAME_ITEMS",
    "SAVE_AFTER_S",
    "batch_size_for",
    "line_unit_lines_for",
    "next_chunk_items",
]

# Rows read and graded per round by the CLI: bounds memory on huge files while keeping
# thousands of batches in flight, so the pool or fleet stays busy. The first rounds
# are smaller and grow x CHUNK_ROWS_GROWTH: grading starts once FIRST_CHUNK_ROWS are
# read, not 20,000 (reading is serial, about 10 us a row), and each next round is
# read while the one before it is graded, which takes longer than reading it.
CHUNK_ROWS = 20_000
FIRST_CHUNK_ROWS = 2_048
CHUNK_ROWS_GROWTH = 3

# Rollouts per fleet task. A task costs a few ms of Celery/Redis work, so bigger
# batches go faster; but a job must also make enough tasks for every worker of a
# larger fleet to get some, and a few more to even out the tail (a job cut into 16
# big tasks on 16 workers leaves most of them idle behind a few stragglers). So the
# size follows the job: JOB_BATCHES tasks per job, each of MIN_BATCH_SIZE to
# MAX_AUTO_BATCH_SIZE items (an 8,192-rollout RL step: 32 tasks of 256; 100,000
# rollouts: 196 tasks of 512). Workers size their time limits for the largest.
JOB_BATCHES = 32
MIN_BATCH_SIZE = 16
MAX_AUTO_BATCH_SIZE = 512
# A fleet's line-mode task (`workers.fleet.line_batch`) is a unit of a file's lines, and
# its producer only moves bytes: its units are bigger than a job's rollouts are cut
# into, since each task costs the fleet some 5 ms of CPU besides its grading (Celery,
# kombu, six Redis round trips, the sandbox's first small chunks; measured by
# process: 8,192 lines in 64 tasks took 0.29 s more than in 8). LINE_UNITS_PER_CHUNK
# units per chunk of the file, of at most MAX_LINE_UNIT_LINES lines: with two chunks
# graded at once, 32 tasks in flight for up to 16 worker processes. A/B on 60,760
# rollouts, 2 workers, CPU of every process: 5.40 s in tasks of 512 lines or fewer
# (`batch_size_for`), 4.36 s in 1,024, 4.19 s in 2,048. A unit of more rows than the
# workers' `max_batch_size` can meet its task's soft time limit only if most of its
# items run to their deadline: then the rest are answered `timeout`.
LINE_UNITS_PER_CHUNK = 16
MAX_LINE_UNIT_LINES = 2_048
# The embedded pool hands each local process this many rollouts at once: a pipe
# round trip is cheap, and small batches keep every process busy to the end.
LOCAL_BATCH_SIZE = 64

# A local pool worker holds this many new cache rows before writing them in one
# SQLite transaction (`SqliteResultCache`: 64-row commits cost 3-4x as much a row),
# or this many bytes of them: a line-mode unit is one row of some 8 KB, so rows
# alone held a whole 60,000-rollout run's until the pool closed, written while
# nothing else ran (~65 ms of a 2.4 s run's tail). A worker also writes its rows
# once it is idle (`workers.embedded.pool`: between the CLI's chunks), so the bytes
# bound is above a 20,000-line chunk's share (~1.3 MB a worker of 2): rows are written
# between chunks, not while the next unit waits.
CACHE_WRITE_BEHIND_ROWS = 2_048
CACHE_WRITE_BEHIND_BYTES = 4 << 20


# Rollouts per fleet task for the jobs a coalescing grader (`gradefleet serve`, the
# adapters) sends: a stream of jobs of up to 256 items, a few in flight, rather than
# one big job that must spread over the fleet on its own. Each task costs its
# publishing in the sender's one backend thread and its overhead on a worker, so
# bigger tasks than `batch_size_for`'s 16 for such jobs: in A/B runs of
# bench_serve's HTTP load (2 workers) 64 took ~20% less service CPU per rollout.
COALESCED_BATCH_SIZE = 64


def batch_size_for(rollouts: int) -> int:
    """Rollouts per fleet task for a job of `rollouts` (see above)."""
    return max(MIN_BATCH_SIZE, min(MAX_AUTO_BATCH_SIZE, -(-rollouts // JOB_BATCHES)))


def line_unit_lines_for(lines: int) -> int:
    """Lines per fleet line-mode task for a chunk of `lines` lines (see above)."""
    units = -(-lines // LINE_UNITS_PER_CHUNK)
    return max(MIN_BATCH_SIZE, min(MAX_LINE_UNIT_LINES, units))


# Inside a task, chunks start small and grow x CHUNK_GROWTH while they are fast (fewer
# round trips: a 512-item batch takes 16 + 64 + 256 + 176, 4 chunks, where doubling
# took 6; each chunk costs a cache lookup and store and a sandbox exchange); after a
# slow one they drop to a couple of items, so little graded work is at stake when a
# worker is lost or the backstop interrupts a chunk.
FIRST_CHUNK_ITEMS = 16
CHUNK_GROWTH = 4
SLOW_CHUNK_ITEMS = 2
MAX_CHUNK_ITEMS = 256
CHUNK_TARGET_S = 0.25

# Verdicts graded so far are saved once SAVE_AFTER_S of grading is unsaved: a lost
# worker costs at most that much plus one chunk. A fast batch saves nothing (its
# verdicts go straight into the result, stored in the round trip that drops whatever
# was saved); one with slow items saves after each slow chunk.
SAVE_AFTER_S = 0.25

# Items a sandbox child or pool worker grades before a fresh one replaces it: a
# backstop. A fresh process pays copy-on-write faults over the warm verifier's heap
# (its first few thousand items cost ~10 us more each), while a worker's RSS stays
# flat (79 MiB from 6,000 to 97,000 real rollouts); recycling every 5,000 items cost
# the embedded CLI a tenth of its wall time on 60,760 rollouts (1.28x the plain loop
# against 1.46x without, median of 6 A/B rounds). What recycling guards against, a
# heap left grown by a big item (the allocator need not hand pages back) eating into
# the next item's cap, is checked directly instead (RECYCLE_GROWN_SHARE).
RECYCLE_AFTER_ITEMS = 100_000
# A process whose RSS has grown this share of the item memory cap above its size at
# fork is replaced after its batch or chunk, so every item keeps 3/4 of its cap.
RECYCLE_GROWN_SHARE = 0.25

# Items per chunk sent to the sandbox child, in one frame (answered in one for their
# decision keys and a few for their verdicts, not one per item); the cap bounds a
# frame's size.
SANDBOX_FRAME_ITEMS = 256


def next_chunk_items(items: int, chunk_s: float) -> int:
    """The size of the chunk after one of `items` items that took `chunk_s`."""
    if chunk_s < CHUNK_TARGET_S:
        return min(items * CHUNK_GROWTH, MAX_CHUNK_ITEMS)
    return SLOW_CHUNK_ITEMS
