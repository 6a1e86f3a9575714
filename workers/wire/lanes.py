"""Priority lanes and rollout kinds: which broker queue a batch goes to, and the order
in which a worker takes from its queues (pure; the producer imports it without worker
code).

A queue is one Redis list of its own (a Celery queue) per (lane, kind): a batch holds
rollouts of one kind (`math` or `code`, the kinds of `workers.kinds`; the producer
splits a job by kind) and goes to its lane's queue of that kind. A worker consumes the
queues of its lanes and kinds (`--lanes`, `--kinds`) with one BRPOP over all their
lists; Redis pops from the first non-empty list in the order given. kombu builds that
order from a "queue cycle" named by the `queue_order_strategy` transport option;
`LaneCycle` (below) is ours: every interactive queue before every bulk one, whatever
the kind, except that after `bulk_every` interactive batches in a row the next take
tries bulk first. Bulk work therefore never starves: while both lanes have work, at
least one batch in every `bulk_every + 1` that a worker node takes is bulk. Within a
lane the kinds take turns (the kind just taken goes last), so on a node that grades
both a flood of math never starves code, nor code math. The check costs nothing extra
per batch: the same single BRPOP, over 4 lists per queue (kombu's priority steps).

Why queues and not kombu's message priorities: a priority is a list per step inside
one queue, with the same strict order and no way to make an exception for bulk;
separate queues also give each lane and kind its own depth (metrics, autoscaling on
the interactive lane or on code) and let a node be dedicated to one lane
(`--lanes interactive`) or one kind (`--kinds code`: the code pool, whose machines
may run the code sandbox, docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, get_args

from workers.wire.contract import QUEUE

__all__ = [
    "BULK",
    "CODE",
    "DEFAULT_BULK_EVERY",
    "INTERACTIVE",
    "KINDS",
    "LANES",
    "LANE_QUEUES",
    "MATH",
    "QUEUES",
    "Kind",
    "Lane",
    "LaneCycle",
    "kind_of_queue",
    "lane_of_queue",
    "parse_kind",
    "parse_lane",
    "queue_for",
    "queues_for",
]

Lane = Literal["interactive", "bulk"]
INTERACTIVE: Final[Lane] = "interactive"
BULK: Final[Lane] = "bulk"
LANES: Final[tuple[Lane, ...]] = get_args(Lane)  # in the order workers take them

# The kinds of `workers.kinds` (the registry sits above this folder, so the names are
# repeated here; tests/unit/test_lanes.py checks they are the same).
Kind = Literal["math", "code"]
MATH: Final[Kind] = "math"
CODE: Final[Kind] = "code"
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)

# Math keeps the fleet's original queue names: producers, workers and scalers from
# before kinds (and lanes) existed keep working, and their work is math (or, from a
# producer older than the split, of either kind, as it was).
QUEUES: Final[dict[tuple[Lane, Kind], str]] = {
    (INTERACTIVE, MATH): QUEUE,
    (INTERACTIVE, CODE): f"{QUEUE}.code",
    (BULK, MATH): f"{QUEUE}.bulk",
    (BULK, CODE): f"{QUEUE}.code.bulk",
}
# Each lane's math queue (what `gradefleet status` and the metrics showed before).
LANE_QUEUES: Final[dict[Lane, str]] = {lane: QUEUES[(lane, MATH)] for lane in LANES}
_LANE_AND_KIND: Final[dict[str, tuple[Lane, Kind]]] = {
    q: lk for lk, q in QUEUES.items()
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


def parse_kind(value: str) -> Kind:
    """`value` as a kind name.

    Raises:
        ValueError: not one of `KINDS`.
    """
    for kind in KINDS:
        if value == kind:
            return kind
    raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {value!r}")


def queue_for(lane: Lane, kind: Kind = MATH) -> str:
    """The broker queue (Redis list) of a lane's batches of `kind`."""
    return QUEUES[(lane, kind)]


def queues_for(lanes: Iterable[Lane], kinds: Iterable[Kind]) -> list[str]:
    """The queues of these lanes and kinds: a lane's kinds together, lanes in the
    order given (a worker's `--queues`; `LaneCycle` orders its takes)."""
    kinds = tuple(kinds)
    return [queue_for(lane, kind) for lane in lanes for kind in kinds]


def lane_of_queue(queue: str) -> Lane | None:
    """The lane a queue belongs to, or None for a queue of no lane."""
    found = _LANE_AND_KIND.get(queue)
    return None if found is None else found[0]


def kind_of_queue(queue: str) -> Kind | None:
    """The kind of the batches a queue holds, or None for a queue of no lane."""
    found = _LANE_AND_KIND.get(queue)
    return None if found is None else found[1]


class LaneCycle:
    """kombu's queue cycle for a worker: lanes in priority order, kinds in turn
    within a lane, bulk now and then.

    kombu instantiates it by name (`queue_order_strategy`), with no arguments, once
    per channel (one per worker node); `update` gets the consumed queues, `consume`
    is asked for the BRPOP order before every take, and `rotate` is told which queue
    each message came from. `bulk_every` is set once per process by `create_app`.
    """

    bulk_every: int = DEFAULT_BULK_EVERY

    def __init__(self, it: Iterable[str] | None = None) -> None:
        self.items: list[str] = []
        self._bulk = frozenset(q for (lane, _k), q in QUEUES.items() if lane == BULK)
        self._kinds: list[Kind] = list(KINDS)  # within a lane: the next take's order
        self.taken_since_bulk = 0  # batches taken from other lanes since bulk's last
        if it is not None:
            self.update(it)

    def _rank(self, queue: str) -> tuple[int, int]:
        found = _LANE_AND_KIND.get(queue)
        if found is None:
            return len(LANES), 0
        return LANES.index(found[0]), self._kinds.index(found[1])

    def update(self, it: Iterable[str]) -> None:
        # Stable sort: queues of no lane keep their given order, after the lanes.
        self.items[:] = sorted(it, key=self._rank)

    def consume(self, n: int) -> list[str]:
        order = self.items[:n]
        if self.taken_since_bulk >= self.bulk_every:
            bulk = [queue for queue in order if queue in self._bulk]
            order = bulk + [queue for queue in order if queue not in self._bulk]
        return order

    def rotate(self, last_used: str) -> None:
        if last_used in self._bulk:
            self.taken_since_bulk = 0
        else:
            self.taken_since_bulk += 1
        kind = kind_of_queue(last_used)
        if kind is not None and kind != self._kinds[-1]:
            # The other kinds of each lane go first next time (a node of one kind
            # never gets here after its first take).
            self._kinds.remove(kind)
            self._kinds.append(kind)
            self.items.sort(key=self._rank)
