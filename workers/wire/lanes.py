"""Priority lanes: which broker queue a job's batches go to, and the order in which a
worker takes from them (pure; the producer imports it without worker code).

A lane is one Redis list of its own (a Celery queue). Every worker consumes every
lane with one BRPOP over all their lists; Redis pops from the first non-empty list in
the order given, so a worker always takes `interactive` work first. kombu builds that
order from a "queue cycle" named by the `queue_order_strategy` transport option;
`LaneCycle` (below) is ours: interactive before bulk, except that after
`bulk_every` interactive batches in a row the next take tries bulk first. Bulk work
therefore never starves: while both lanes have work, at least one batch in every
`bulk_every + 1` that a worker node takes is bulk. The check costs nothing extra per
batch: the same single BRPOP, over 8 lists instead of 4 (kombu's priority steps).

Why queues and not kombu's message priorities: a priority is a list per step inside
one queue, with the same strict order and no way to make an exception for bulk;
separate queues also give each lane its own depth (metrics, autoscaling on the
interactive lane) and let a node be dedicated to one lane (`--lanes interactive`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, get_args

from workers.wire.contract import QUEUE

__all__ = [
    "BULK",
    "DEFAULT_BULK_EVERY",
    "INTERACTIVE",
    "LANES",
    "LANE_QUEUES",
    "Lane",
    "LaneCycle",
    "lane_of_queue",
    "parse_lane",
    "queue_for",
]

Lane = Literal["interactive", "bulk"]
INTERACTIVE: Final[Lane] = "interactive"
BULK: Final[Lane] = "bulk"
LANES: Final[tuple[Lane, ...]] = get_args(Lane)  # in the order workers take them

# The interactive lane keeps the fleet's original queue name: producers and scalers
# from before lanes existed keep working, and their work is interactive, as it was.
LANE_QUEUES: Final[dict[Lane, str]] = {
    INTERACTIVE: QUEUE,
    BULK: f"{QUEUE}.bulk",
}
# A generous bound: one bulk batch in 17 still moves a sweep along under a flood of
# interactive work, yet one RL step (32 batches over at least 2 nodes) rarely lets a
# bulk batch in ahead of its own.
DEFAULT_BULK_EVERY = 16


def parse_lane(value: str) -> Lane:
    """`value` as a lane name.

    Raises:
        ValueError: not one of `LANES`.
    """
    for lane in LANES:
        if value == lane:
            return lane
    raise ValueError(f"priority must be one of {', '.join(LANES)}; got {value!r}")


def queue_for(lane: Lane) -> str:
    """The broker queue (Redis list) of a lane."""
    return LANE_QUEUES[lane]


def lane_of_queue(queue: str) -> Lane | None:
    """The lane a queue belongs to, or None for a queue of no lane."""
    for lane, name in LANE_QUEUES.items():
        if name == queue:
            return lane
    return None


def _rank(queue: str) -> int:
    lane = lane_of_queue(queue)
    return len(LANES) if lane is None else LANES.index(lane)


class LaneCycle:
    """kombu's queue cycle for a worker: lanes in priority order, bulk now and then.

    kombu instantiates it by name (`queue_order_strategy`), with no arguments, once
    per channel (one per worker node); `update` gets the consumed queues, `consume`
    is asked for the BRPOP order before every take, and `rotate` is told which queue
    each message came from. `bulk_every` is set once per process by `create_app`.
    """

    bulk_every: int = DEFAULT_BULK_EVERY

    def __init__(self, it: Iterable[str] | None = None) -> None:
        self.items: list[str] = []
        self._bulk = queue_for(BULK)
        self.taken_since_bulk = 0  # batches taken from other lanes since bulk's last
        if it is not None:
            self.update(it)

    def update(self, it: Iterable[str]) -> None:
        # Stable sort: queues of no lane keep their given order, after the lanes.
        self.items[:] = sorted(it, key=_rank)

    def consume(self, n: int) -> list[str]:
        order = self.items[:n]
        if self.taken_since_bulk >= self.bulk_every and self._bulk in order:
            order.remove(self._bulk)
            order.insert(0, self._bulk)
        return order

    def rotate(self, last_used: str) -> None:
        if last_used == self._bulk:
            self.taken_since_bulk = 0
        else:
            self.taken_since_bulk += 1
