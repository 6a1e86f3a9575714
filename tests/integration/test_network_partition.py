"""A network partition (issue 13) on real processes: one worker runs in its own
network namespace and reaches Redis over a veth pair; mid-job the link goes down for
60 s and comes back. Nothing is lost, the batch the cut-off worker held is graded
again by the worker in the root namespace, and no rollout reaches the producer twice.

Needs root (`ip netns add`); skipped, saying so, only where that is refused. Slow
(about 80 s: the partition alone is 60 s), so marked `slow`; CI runs it once, with
the rest of the integration tests.

Addresses: 127.0.0.0/8 is not routable between namespaces, so the veth pair gets a
link-local /30 (169.254.x.y) of its own, on these two interfaces only; Redis listens
on it and on 127.0.0.1 (the root-namespace worker and the producer).
"""

from __future__ import annotations

import collections
import os
import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from producer.client.fleet import GradingClient
from tests.helpers import real_rollouts
from tests.hooks import HANG
from tests.integration.redis_procs import RedisProc, wait_for
from workers.models import Verdict
from workers.wire.protocol import RUNNING_STATES, read_task_meta, task_meta_key

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

PARTITION_S = 60.0
# How long the cut-off worker may take to grade again once its link is back.
RECOVERY_S = 60.0
BATCH_SIZE = 16
# One item per batch hangs to the 1 s item deadline: every batch takes over a
# second, so the batch the partitioned worker holds when the link goes down is
# certainly unfinished, and 64 batches on one worker outlast the 60 s partition.
N_BATCHES = 64
_NO_CACHE = {"GRADEFLEET_CACHE_URL": "none"}
_TASK = r"Task gradefleet\.grade_batch\[([0-9a-f]+\.\d+)\]"
_RECEIVED = re.compile(_TASK + " received")
_SUCCEEDED = re.compile(_TASK + " succeeded")


@dataclass(frozen=True)
class VethLink:
    """A network namespace joined to the root one by a veth pair."""

    namespace: str
    root_if: str
    root_addr: str

    def set_up(self, up: bool) -> None:
        _ip("link", "set", self.root_if, "up" if up else "down")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def veth_link() -> Iterator[VethLink]:
    tag = f"{os.getpid() % 100_000}{random.randrange(100):02d}"
    namespace, root_if, ns_if = f"gfpart{tag}", f"gfv{tag}a", f"gfv{tag}b"
    subnet = f"169.254.{random.randrange(1, 255)}.{4 * random.randrange(64)}"
    base = subnet.rsplit(".", 1)
    root_addr = f"{base[0]}.{int(base[1]) + 1}"
    ns_addr = f"{base[0]}.{int(base[1]) + 2}"
    try:
        _ip("netns", "add", namespace)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"`ip netns add` not permitted here: {exc.stderr.decode()}")
    try:
        _ip("link", "add", root_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", namespace)
        _ip("addr", "add", f"{root_addr}/30", "dev", root_if)
        _ip("link", "set", root_if, "up")
        in_ns = ("netns", "exec", namespace, "ip")
        _ip(*in_ns, "addr", "add", f"{ns_addr}/30", "dev", ns_if)
        _ip(*in_ns, "link", "set", ns_if, "up")
        _ip(*in_ns, "link", "set", "lo", "up")
        yield VethLink(namespace=namespace, root_if=root_if, root_addr=root_addr)
    finally:
        # Deleting the namespace destroys its end of the pair, and so the pair.
        subprocess.run(["ip", "netns", "del", namespace], check=False, timeout=10)
        subprocess.run(
            ["ip", "link", "del", root_if], check=False, capture_output=True, timeout=10
        )


HANG_AT = BATCH_SIZE // 2
# An answer no real rollout has: the sandbox decides items of one batch with equal
# (answer, gold) once, so a common answer would take another item's verdict.
HANG_ROW = {"response": f"{HANG} \\boxed{{271828}}", "gold": "314159"}


def _rollouts() -> list[dict[str, str]]:
    real = real_rollouts()
    return [
        HANG_ROW
        if n % BATCH_SIZE == HANG_AT
        else {"response": r.response, "gold": r.gold}
        for n, r in enumerate(real[: N_BATCHES * BATCH_SIZE])
    ]


def _plain(verdict: Verdict) -> dict[str, Any]:
    return {k: v for k, v in verdict.to_dict().items() if k != "cached"}


def _received(log: str, job_id: str, pattern: re.Pattern[str] = _RECEIVED) -> set[str]:
    return {m for m in pattern.findall(log) if m.startswith(f"{job_id}.")}


def _running(server: RedisProc, batch_ids: set[str]) -> set[str]:
    """The batches of `batch_ids` whose worker has stored a heartbeat."""
    client = server.client()
    try:
        payloads = [client.get(task_meta_key(b)) for b in sorted(batch_ids)]
    finally:
        client.close()
    return {
        batch_id
        for batch_id, payload in zip(sorted(batch_ids), payloads, strict=True)
        if payload is not None and read_task_meta(payload).status in RUNNING_STATES
    }


def test_network_partition_worker_cut_off_for_60_s_loses_nothing(
    veth_link: VethLink, make_workers: Any, tmp_path: Path
) -> None:
    # Given Redis on 127.0.0.1 and on the veth address, a worker in the root
    # namespace and one in the other namespace (reaching Redis over the veth)
    # (Protected mode off: it refuses clients from other addresses than loopback
    # without a password; this server is reachable only from the test's own /30.)
    server = RedisProc(
        tmp_path / "redis",
        "--protected-mode",
        "no",
        binds=("127.0.0.1", veth_link.root_addr),
    )
    try:
        local_url = server.url
        veth_url = f"redis://{veth_link.root_addr}:{server.port}/0"
        local = make_workers(local_url).start(extra_env=_NO_CACHE, wait=False)
        cut_off = make_workers(veth_url).start(
            extra_env=_NO_CACHE,
            wait=False,
            argv_prefix=("ip", "netns", "exec", veth_link.namespace),
        )
        local.wait_ready()
        cut_off.wait_ready()
        rollouts = _rollouts()
        # A window of 4 batches in the broker (2 per worker process, the sizing
        # for a 2-process fleet): a re-sent batch is not queued behind the whole job.
        with GradingClient(
            local_url, batch_size=BATCH_SIZE, deadline_s=200, max_batches_in_flight=4
        ) as client:
            # The clean verdicts: every distinct input once (the hanging items all
            # read alike and time out alike), graded before any fault
            real_rows = [r for r in rollouts if r is not HANG_ROW]
            hang_verdict, *clean = client.grade([HANG_ROW, *real_rows])
            clean_iter = iter(clean)
            expected = [
                _plain(hang_verdict if r is HANG_ROW else next(clean_iter))
                for r in rollouts
            ]
            # When the link goes down while the cut-off worker grades a batch (its
            # first heartbeat is in Redis), and comes back 60 s later
            job = client.submit(rollouts)
            held = wait_for(
                lambda: _running(server, _received(cut_off.log(), job.job_id)),
                timeout_s=30,
                what="the namespaced worker to start a batch",
            )
            veth_link.set_up(False)
            down_at = time.monotonic()
            relink = threading.Timer(PARTITION_S, veth_link.set_up, args=(True,))
            relink.start()
            try:
                seen: collections.Counter[int] = collections.Counter()
                got: list[dict[str, Any] | None] = [None] * len(rollouts)
                for index, verdict in job.as_completed():
                    seen[index] += 1
                    got[index] = _plain(verdict)
                finished = time.monotonic()
            finally:
                relink.join()  # the link is down for the whole 60 s
            relinked_at = down_at + PARTITION_S
            # (and once the root-namespace worker is gone, a new job can only be
            # graded by the worker that was cut off)
            local.stop()
            after = client.submit(_rollouts()[:BATCH_SIZE], deadline_s=RECOVERY_S)
            after.results()
            back_s = time.monotonic() - relinked_at
        # Then every rollout came back exactly once with its clean verdict, the
        # batch the cut-off worker held was graded again in the root namespace, and
        # the cut-off worker grades again once its link is back
        assert set(seen.values()) == {1}, "an index arrived twice"
        assert got == expected
        regraded = _received(local.log(), job.job_id, _SUCCEEDED)
        assert held <= regraded, (held, local.log())
        # (the task stores its result before Celery logs "succeeded": the job can
        # end a moment before that line is written)
        wait_for(
            lambda: _received(cut_off.log(), after.job_id, _SUCCEEDED),
            timeout_s=10,
            what="the cut-off worker to log the new job's batch succeeded",
        )
        print(
            f"\nnetwork partition: batches {sorted(held)} re-graded in the root "
            f"namespace; job of {len(rollouts)} done {finished - down_at:.1f} s after "
            f"the link went down ({job.resent_batches} re-sends); the cut-off worker "
            f"graded a new job {back_s:.1f} s after its link came back"
        )
    finally:
        server.kill()
