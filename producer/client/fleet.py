"""Send rollouts to the fleet in batches and get every verdict back, in input order.

`GradingClient` publishes `gradefleet.grade_batch` tasks by name (no worker code is
imported) and reads results straight from Celery's Redis result keys with MGET.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Protocol

import redis
from celery import Celery
from celery.backends.base import DisabledBackend
from kombu.exceptions import OperationalError

from producer.client.board import TTL_S, JobBoard
from producer.client.job import Batch, GradingJob, OnDeadline, Progress, ServerRunId
from producer.client.rollouts import validate_rollouts
from producer.errors import BrokerRefusedError, BrokerUnavailableError, ProducerError
from producer.settings import DEFAULT_REFUSED_LIMIT_S
from workers.code.item import is_code_gold
from workers.models import GradeOptions, Rollout, Verdict
from workers.sizing import batch_size_for
from workers.wire.connections import (
    RedisClients,
    celery_endpoint,
    redis_client,
    transport_for,
)
from workers.wire.contract import (
    GRADE_BATCH,
    WireBatch,
    batch_sizes,
    batch_to_wire,
    detach_items,
    sign_task,
)
from workers.wire.lanes import (
    CODE,
    INTERACTIVE,
    MATH,
    Kind,
    Lane,
    parse_lane,
    queue_for,
)
from workers.wire.protocol import batch_items_key
from workers.wire.refusals import broker_refusal
from workers.wire.signing import Keyring, items_digest
from workers.wire.urls import connect_url, redact_url

__all__ = [
    "BrokerUnavailableError",
    "ClientMetrics",
    "GradingClient",
    "GradingJob",
    "Progress",
    "Rollout",
]

# The workers' default per-item deadline; pass `item_timeout_s` if the fleet differs.
DEFAULT_ITEM_TIMEOUT_S = 5.0
# A running batch writes a new heartbeat every second from its own thread, also while
# one slow item is graded (the sandbox child grades it; the worker thread only waits
# in `poll`), so a live worker is never silent for long. 10 s is 10 missed beats:
# enough slack for a loaded machine or a Redis hiccup, and what a SIGKILLed worker
# costs an RL step.
DEFAULT_RESEND_AFTER_S = 10.0
# How long a batch's items stay in Redis (`contract.detach_items`) when nothing
# deletes them: the producer deletes them as each batch's result arrives, and stores
# them again with every re-send. Well above the workers' visibility timeout (1 h), so
# a re-delivered message still finds them.
DEFAULT_ITEMS_TTL_S = 6 * 3600
_PING_TIMEOUT_S = 2.0
# Batches of one job in the broker at a time (the rest wait in the producer): enough
# to keep 32 worker processes busy with one job (two each: one running, one queued)
# while bounding what one job puts ahead of others in its lane (64 x 512 rollouts,
# ~16 MB) and how long a newcomer to the lane waits for its first turn.
DEFAULT_MAX_BATCHES_IN_FLIGHT = 64


class ClientMetrics(Protocol):
    """What the client reports (`workers.fleet.metrics.ProducerMetrics` fits)."""

    @property
    def rollouts_submitted(self) -> Any: ...
    @property
    def results_received(self) -> Any: ...
    @property
    def batches_resent(self) -> Any: ...


class GradingClient:
    """Grade rollouts on a Celery fleet through Redis.

    Args:
        broker_url: Redis URL of the broker the workers consume.
        batch_size: rollouts per task; None sizes each job's batches to the job
            (`sizing.batch_size_for`: 32 tasks per job, 16 to 512 rollouts each).
        deadline_s: default time limit of a job (None: wait as long as it takes).
        resend_after_s: a running batch with no new heartbeat for this long is
            published again under the same id (default 10 s; workers beat every 1 s).
        stall_after_s: when the whole job has had no news for this long, batches
            not known to run (queued, or lost with a restarted Redis) are published
            again. Default: `resend_after_s` if given, else 4 x item deadline + 30 s
            (a queue shared with other jobs may hold a batch that long).
        options: verdict-changing options sent with every batch.
        result_backend: Redis URL of the result backend (default: the broker).
        item_timeout_s: the workers' per-item deadline, used for `stall_after_s`.
        metrics: optional producer counters.
        priority: the lane of this client's jobs (`interactive`, the default: RL
            steps and per-sample calls, taken first by every worker; or `bulk`:
            sweeps); `submit` and `grade` can override it per job.
        max_batches_in_flight: batches of one job in the broker at a time; the rest
            are sent as results come back (fair turns between jobs of one lane,
            bounded broker memory). Raise it for fleets of over 32 processes.
        on_deadline: what a job does at its deadline: "raise" DeadlinePassedError
            (default), or "timeout": every rollout still ungraded gets a `timeout`
            verdict, and the job's queued batches are dropped.
        keyring: the fleet's signing keys (`workers.wire.signing`): tasks are signed,
            and results are accepted only with a valid MAC. Without it, a result is
            still refused when it names other items than were sent.
        job_ttl_s: a job's board entry, refreshed every second by a thread of this
            client while the job is unfinished, expires this long after the last
            refresh: when this process dies, workers skip the job's queued
            batches from then on.
        refused_limit_s: how long a job waits for a broker that refuses writes
            (maxmemory, a read-only replica; it re-publishes what may have been
            lost once writes succeed) before it raises BrokerRefusedError with
            the verdicts that arrived.

    Raises:
        BrokerUnavailableError: the broker or result backend does not answer a ping.
        BrokerRefusedError: (from `submit`) the broker refuses to store a job.
    """

    def __init__(
        self,
        broker_url: str,
        *,
        batch_size: int | None = None,
        deadline_s: float | None = None,
        resend_after_s: float | None = None,
        stall_after_s: float | None = None,
        options: GradeOptions | None = None,
        result_backend: str | None = None,
        item_timeout_s: float = DEFAULT_ITEM_TIMEOUT_S,
        metrics: ClientMetrics | None = None,
        priority: str = INTERACTIVE,
        max_batches_in_flight: int = DEFAULT_MAX_BATCHES_IN_FLIGHT,
        on_deadline: OnDeadline = "raise",
        keyring: Keyring | None = None,
        job_ttl_s: int = TTL_S,
        refused_limit_s: float = DEFAULT_REFUSED_LIMIT_S,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be ≥ 1")
        if max_batches_in_flight < 1:
            raise ValueError("max_batches_in_flight must be ≥ 1")
        if on_deadline not in ("raise", "timeout"):
            raise ValueError('on_deadline must be "raise" or "timeout"')
        self.priority: Lane = parse_lane(priority)
        self.max_batches_in_flight = max_batches_in_flight
        self.on_deadline: OnDeadline = on_deadline
        broker_url = connect_url(broker_url)  # rediss:// defaults
        result_backend = None if result_backend is None else connect_url(result_backend)
        self.broker_url = broker_url
        self.batch_size = batch_size
        self.deadline_s = deadline_s
        self.resend_after_s = resend_after_s or DEFAULT_RESEND_AFTER_S
        self.stall_after_s = (
            stall_after_s or resend_after_s or 4 * item_timeout_s + 30.0
        )
        self.options = options or GradeOptions()
        self._metrics = metrics
        self._keyring = keyring
        backend_url = result_backend or broker_url
        _ping(broker_url)
        if backend_url != broker_url:
            _ping(backend_url)
        self._clients = RedisClients(socket_timeout=10)
        self._results = self._clients.get(backend_url)
        self._broker_redis = self._clients.get(broker_url)
        self._items_ttl_s = max(DEFAULT_ITEMS_TTL_S, int(2 * (deadline_s or 0)))
        self._app = _producer_app(broker_url)
        # Queues this client's publishes have declared (see `_send`).
        self._declared: set[str] = set()
        self._board = JobBoard(self._broker_redis, ttl_s=job_ttl_s)
        self._run_id = ServerRunId(self._results)
        self.refused_limit_s = refused_limit_s
        # Celery imports its transport and builds its producer pool on the first
        # publish (0.1 s among the CLI's busy threads, the fleet idle): begun now,
        # in a thread, it overlaps the caller's reading of its first rollouts
        # (issue 11). `_publish` waits for it.
        self._warm = threading.Thread(
            target=self._warm_up, name="gradefleet-warm-up", daemon=True
        )
        self._warm.start()

    def _warm_up(self) -> None:
        # Connects nothing: any error shows on the first publish, as it would have.
        with contextlib.suppress(Exception), self._app.producer_or_acquire():
            pass

    def __enter__(self) -> GradingClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Take unfinished jobs off the board (workers skip their queued batches)
        and release broker and backend connections."""
        self._board.close()
        self._clients.close()
        self._warm.join()
        self._app.close()

    def grade(
        self, rollouts: Iterable[object], *, priority: str | None = None
    ) -> list[Verdict]:
        """Grade every rollout; verdicts in input order.

        Args:
            priority: this job's lane (default: the client's `priority`).

        Raises:
            InvalidRolloutError: a rollout lacks string `response`/`gold` (index given).
            DeadlinePassedError: `deadline_s` passed; the message lists missing indexes.
            ValueError: `priority` is not a lane.
        """
        return self.submit(rollouts, priority=priority).results()

    def submit(
        self,
        rollouts: Iterable[object],
        *,
        deadline_s: float | None = None,
        priority: str | None = None,
        options: GradeOptions | None = None,
    ) -> GradingJob:
        """Validate, split into batches of one kind each (`_kind_batches`) and
        publish the first `max_batches_in_flight` of them (the job sends the rest as
        results arrive); returns at once.

        Args:
            deadline_s: this job's time limit (default: the client's `deadline_s`).
            priority: this job's lane (default: the client's `priority`).
            options: this job's verdict-changing options (default: the client's).
        """
        triples = validate_rollouts(rollouts)
        job_id = uuid.uuid4().hex
        batches = _kind_batches(job_id, triples, self.batch_size)
        return self._start(job_id, batches, len(triples), deadline_s, priority, options)

    def submit_units(
        self,
        units: Sequence[bytes],
        weights: Sequence[int],
        *,
        deadline_s: float | None = None,
        priority: str | None = None,
        options: GradeOptions | None = None,
    ) -> GradingJob:
        """Like `submit`, for units of input lines (`workers.lines.units.
        fleet_unit_payload`, the CLI's line mode): one task each, graded and
        rendered by a worker (`workers.fleet.line_batch`). The job yields (unit index,
        the result's `lines`) pairs; `weights` (each unit's lines: about its
        rollouts) are what the metrics and the job board count."""
        job_id = uuid.uuid4().hex
        batches = [
            Batch(batch_id=f"{job_id}.{n}", items=((n, "", ""),), unit=unit)
            for n, unit in enumerate(units)
        ]
        return self._start(
            job_id, batches, len(units), deadline_s, priority, options, weights=weights
        )

    def _start(
        self,
        job_id: str,
        batches: list[Batch],
        total: int,
        deadline_s: float | None,
        priority: str | None,
        options: GradeOptions | None,
        weights: Sequence[int] | None = None,
    ) -> GradingJob:
        """Put a job of `batches` (`total` results: rollouts, or units of
        `weights` rollouts each) on the board and publish its first window."""
        job_options = options or self.options
        lane = self.priority if priority is None else parse_lane(priority)
        limit_s = deadline_s if deadline_s is not None else self.deadline_s
        job = GradingJob(
            job_id=job_id,
            batches=batches,
            total=total,
            results_client=self._results,
            publish=lambda some: self._publish(job_id, lane, some, job_options),
            release=self._release,
            deadline_at=None if limit_s is None else time.monotonic() + limit_s,
            resend_after_s=self.resend_after_s,
            stall_after_s=self.stall_after_s,
            metrics=self._metrics,
            max_in_flight=self.max_batches_in_flight,
            lane=lane,
            on_deadline=self.on_deadline,
            on_progress=self._board.update,
            keyring=self._keyring,
            broker_watch=self._board,
            refused_limit_s=self.refused_limit_s,
            run_id=self._run_id,
            weights=weights,
        )
        try:
            # On the board before its first batch is published: a worker skips a
            # batch whose job has no entry.
            self._board.watch(job)
            job.start()
        except BaseException as exc:
            self._board.forget(job_id)
            if isinstance(exc, ProducerError) or not isinstance(
                exc, (redis.RedisError, OSError)
            ):
                raise
            raise self._broker_error(exc, "put the job on the board") from exc
        if self._metrics is not None:
            self._metrics.rollouts_submitted.inc(job.rollouts)
        return job

    def _publish(
        self,
        job_id: str,
        lane: Lane,
        batches: Sequence[Batch],
        options: GradeOptions,
    ) -> None:
        """Store the batches' items (one round trip) and publish each to its lane's
        queue of its kind; a re-sent batch's items are stored again too.

        Raises:
            BrokerUnavailableError: the broker cannot be reached.
        """
        self._warm.join()
        sent = 0
        try:
            wires = self._store_items(job_id, batches, options)
            with self._app.producer_or_acquire() as producer:
                for batch, wire in zip(batches, wires, strict=True):
                    queue = queue_for(lane, batch.kind)
                    self._send(batch, wire, queue, producer=producer)
                    sent += 1
        except (OperationalError, redis.RedisError, OSError) as exc:
            if broker_refusal(exc) is not None:
                # Nothing stays behind of a batch that never went out.
                self._release([b for b in batches[sent:] if not b.sent_at])
            raise self._broker_error(exc, "publish") from exc

    def _broker_error(self, exc: BaseException, what: str) -> ProducerError:
        """BrokerRefusedError naming the broker's own error when it refused a write,
        else BrokerUnavailableError."""
        url = redact_url(self.broker_url)
        refusal = broker_refusal(exc)
        if refusal is not None:
            return BrokerRefusedError(
                f"the broker at {url} refused to {what}: "
                f"{type(refusal).__name__}: {refusal}"
            )
        return BrokerUnavailableError(f"cannot {what} on {url}: {exc}")

    def _store_items(
        self, job_id: str, batches: Sequence[Batch], options: GradeOptions
    ) -> list[WireBatch]:
        """Store each batch's items in the broker's Redis (one round trip); returns
        the task arguments, which name them (`contract.detach_items`)."""
        wires = []
        pipe = self._broker_redis.pipeline(transaction=False)
        for batch in batches:
            batch.attempt += 1
            wire, items_json = detach_items(
                batch_to_wire(
                    job_id=job_id,
                    batch_id=batch.batch_id,
                    items=batch.items if batch.unit is None else (),
                    options=options,
                    enqueued_at=time.time(),
                    attempt=batch.attempt,
                    kept_alive=True,
                )
            )
            if batch.unit is not None:  # its lines are stored in place of items
                items_json = batch.unit
            batch.items_digest = items_digest(items_json)
            if self._keyring is not None:
                wire = sign_task(wire, items_json, self._keyring)
            pipe.set(wire["items_key"], items_json, ex=self._items_ttl_s)
            wires.append(wire)
        pipe.execute()
        return wires

    def _send(
        self, batch: Batch, wire: WireBatch, queue: str, *, producer: Any = None
    ) -> None:
        self._app.send_task(
            GRADE_BATCH,
            args=[wire],
            task_id=batch.batch_id,
            queue=queue,
            producer=producer,
            # Worker logs show ids, not the argument: skips Celery's saferepr.
            argsrepr="(wire batch)",
            kwargsrepr="{}",
            # Celery declares the queue again on every publish (kombu then binds
            # a copy of it to the channel and looks it up in its cache: a fifth of
            # a publish's CPU). A task goes to the queue's list by name (an
            # anonymous exchange) whether declared or not; it is declared on the
            # first publish, as before, and workers declare their queues too.
            declare=[] if queue in self._declared else None,
        )
        self._declared.add(queue)
        batch.sent_at = time.monotonic()

    def _release(self, batches: Sequence[Batch]) -> None:
        """Delete the stored items of finished batches (best effort: they expire)."""
        keys = [batch_items_key(batch.batch_id) for batch in batches]
        with contextlib.suppress(redis.RedisError, OSError):
            self._broker_redis.delete(*keys)


def _kind_batches(
    job_id: str, triples: list[tuple[int, str, str]], batch_size: int | None
) -> list[Batch]:
    """A job's rollouts in batches of one kind each (a code rollout's gold is its
    encoded tests, `workers.code.item`), so each batch goes to its kind's queue and
    only workers that take that kind grade it (`workers.wire.lanes`). Each item
    keeps its index, so verdicts come back in input order; the kinds' batches
    alternate, so both pools start at once. `batch_size` None: sized per kind
    (`sizing.batch_size_for`)."""
    by_kind: dict[Kind, list[tuple[int, str, str]]] = {MATH: [], CODE: []}
    for triple in triples:
        by_kind[CODE if is_code_gold(triple[2]) else MATH].append(triple)
    runs = []
    for kind, items in by_kind.items():
        size = batch_size or batch_size_for(len(items))
        chars = (len(response) + len(gold) for _, response, gold in items)
        cuts = itertools.accumulate(batch_sizes(chars, size), initial=0)
        runs.append([(kind, tuple(items[a:b])) for a, b in itertools.pairwise(cuts)])
    mixed = itertools.chain.from_iterable(itertools.zip_longest(*runs))
    return [
        Batch(batch_id=f"{job_id}.{n}", items=items, kind=kind)
        for n, (kind, items) in enumerate(run for run in mixed if run is not None)
    ]


def _ping(url: str) -> None:
    client = redis_client(
        url, socket_connect_timeout=_PING_TIMEOUT_S, socket_timeout=_PING_TIMEOUT_S
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        raise BrokerUnavailableError(
            f"broker unreachable at {redact_url(url)}: {exc}"
        ) from exc
    finally:
        client.close()


class _ProducerCelery(Celery):
    """The producer's Celery app: it publishes tasks, and has no result backend on
    purpose (Celery's Redis backend would SUBSCRIBE to a channel per task id; we
    read result keys ourselves with MGET instead)."""

    def _get_backend(self) -> DisabledBackend:
        # Celery finds even the disabled backend by name, reading every installed
        # package's entry points first: 0.12 s on the first publish, with the
        # fleet idle (issue 11). Should Celery stop calling this, it finds the
        # same backend the slow way.
        return DisabledBackend(app=self, url=None)


def _producer_app(broker_url: str) -> Celery:
    broker = celery_endpoint(broker_url)
    app = _ProducerCelery(
        "gradefleet-producer", broker=broker.url, set_as_current=False
    )
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=queue_for(INTERACTIVE),
        broker_transport=transport_for(broker_url, publish_only=True),
        broker_connection_retry_on_startup=False,
        # Plain JSON bodies: kombu's default base64 of the body (and the worker's
        # decode) is work for nothing; workers read each message's own
        # `body_encoding`, so either form is accepted.
        broker_transport_options={**broker.transport_options, "body_encoding": None},
        task_publish_retry_policy={
            "max_retries": 3,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.5,
        },
    )
    return app
