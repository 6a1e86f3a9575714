"""Serving benchmark: per-sample calls through the coalescing client, HTTP and the
verl adapter vs the same rollouts as one batch (same run, same 2-worker fleet, real
outputs, result cache flushed before every timed round).

    python tests/bench/bench_serve.py [--rollouts 2048] [--rounds 2]
        [--http-connections 256]

HTTP callers are load-generated as trainers call a reward URL: one aiohttp
`ClientSession` (verl's reward loop and OpenRLHF's async path use aiohttp) whose
bounded pool of keep-alive connections carries all the concurrent calls; the
client's CPU shares the same cores as the service and the workers. Half load is an
open-loop arrival rate (calls start on schedule, not when answers come back) at half
of the rate that path sustained under the full concurrent load.

Prints every figure with its target; nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from bench_fleet import Bench
from fleet_procs import real_rollouts

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from producer.adapters import verl
from producer.client.grading import CoalescingGrader, close_graders, grader_for
from tests.serve_procs import ServeProcess, start_serve
from workers.models import Rollout


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sizes_line(sizes: Counter[int]) -> str:
    """Batch-size distribution: batches, mean size, and size quantiles."""
    flat = [size for size, n in sizes.items() for _ in range(n)]
    if not flat:
        return "no batches"
    return (
        f"{len(flat)} batches, mean {statistics.mean(flat):.1f} items, "
        f"p10/p50/p90/max {pct(flat, 0.1)}/{pct(flat, 0.5)}/{pct(flat, 0.9)}/"
        f"{max(flat)}"
    )


async def concurrent(
    call: Callable[[Rollout], Awaitable[object]], rollouts: Sequence[Rollout]
) -> tuple[float, list[float]]:
    """All calls at once; wall seconds and per-call latencies."""
    latencies: list[float] = []

    async def timed(rollout: Rollout) -> None:
        started = time.perf_counter()
        await call(rollout)
        latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(timed(r) for r in rollouts))
    return time.perf_counter() - started, latencies


async def open_loop(
    call: Callable[[Rollout], Awaitable[object]],
    rollouts: Sequence[Rollout],
    rate_per_s: float,
) -> list[float]:
    """One call every 1/rate s (not waiting for answers); per-call latencies."""
    latencies: list[float] = []

    async def timed(rollout: Rollout) -> None:
        started = time.perf_counter()
        await call(rollout)
        latencies.append(time.perf_counter() - started)

    tasks = []
    start = time.perf_counter()
    for k, rollout in enumerate(rollouts):
        delay_s = start + k / rate_per_s - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        tasks.append(asyncio.ensure_future(timed(rollout)))
    await asyncio.gather(*tasks)
    return latencies


@contextlib.asynccontextmanager
async def http_caller(
    url: str, connections: int
) -> AsyncIterator[Callable[[Sequence[Rollout]], Awaitable[object]]]:
    """Grades rollouts with one POST to /v1/grade over a pooled aiohttp session (at
    most `connections` keep-alive sockets; other calls wait for one, as in a
    trainer's session), encoding the request and parsing the reply as a caller
    would."""
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=300)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def post(chunk: Sequence[Rollout]) -> object:
            items = [{"response": r.response, "gold": r.gold} for r in chunk]
            body = json.dumps({"items": items})
            async with session.post(url + "/v1/grade", data=body, headers=headers) as r:
                payload = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {payload[:200]!r}")
                return json.loads(payload)["results"]

        yield post


def report(name: str, n: int, wall_s: float, lat: list[float], base_rps: float) -> None:
    rps = n / wall_s
    print(
        f"  {name:<34} {rps:8.0f} rollouts/s  {rps / base_rps:5.2f}x batch "
        f"(target >= 0.5x)  p50 {pct(lat, 0.5) * 1000:6.0f} ms  "
        f"p99 {pct(lat, 0.99) * 1000:6.0f} ms"
    )


def http_batch_sizes(url: str) -> str:
    """The service's coalesced batch-size histogram (cumulative buckets)."""
    text = httpx.get(url + "/metrics").text
    buckets = []
    for line in text.splitlines():
        if line.startswith("gradefleet_coalesced_batch_size_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append(f"<={le}:{float(line.split()[-1]):.0f}")
    return " ".join(buckets)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--half-load-s", type=float, default=3.0)
    parser.add_argument(
        "--http-connections",
        type=int,
        default=256,
        help="keep-alive connections in the HTTP callers' pool",
    )
    args = parser.parse_args(argv)
    rollouts = real_rollouts()[: args.rollouts]
    n = len(rollouts)
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), 2, 5.0)
        server = start_serve(Path(tmp), broker=bench.redis.url)
        os.environ["GRADEFLEET_URL"] = bench.redis.url
        try:
            run(bench, server, rollouts, n, args)
        finally:
            server.stop()
            bench.close()
    return 0


def run(  # noqa: C901 (one straight script of sections)
    bench: Bench, server: ServeProcess, rollouts: list[Rollout], n: int, args: Any
) -> None:
    url = server.url
    http_cpu_s: list[tuple[float, float]] = []  # (service, this process) per round
    batch_s: list[float] = []
    results: dict[str, list[tuple[float, list[float]]]] = {}
    sizes: dict[str, Counter[int]] = {}

    async def via_client() -> tuple[float, list[float]]:
        async with CoalescingGrader(bench.redis.url) as grader:
            out = await concurrent(lambda r: grader.grade([r]), rollouts)
            sizes["async client"] = grader.coalescer.batch_sizes
            return out

    async def via_verl() -> tuple[float, list[float]]:
        def one(r: Rollout) -> Awaitable[object]:
            return verl.compute_score(
                data_source="lighteval/MATH",
                solution_str=r.response,
                ground_truth=r.gold,
                extra_info={"index": 0},
            )

        out = await concurrent(one, rollouts)
        sizes["verl adapter"] = grader_for().coalescer.batch_sizes
        await close_graders()
        return out

    async def via_http() -> tuple[float, list[float]]:
        service_s, own_s = process_cpu_s(server.proc.pid), own_cpu_s()
        async with http_caller(url, args.http_connections) as post:
            out = await concurrent(lambda r: post([r]), rollouts)
        service_s = process_cpu_s(server.proc.pid) - service_s
        http_cpu_s.append((service_s, own_cpu_s() - own_s))
        return out

    print(
        f"== {n} concurrent single-rollout calls vs one batch (2 workers; HTTP: "
        f"aiohttp session, {args.http_connections} keep-alive connections)"
    )
    for _ in range(args.rounds):
        bench.flush_cache()
        batch_s.append(timed_batch(bench, rollouts))
        for name, fn in (
            ("async client (coalescing)", via_client),
            ("HTTP /v1/grade, 1 item each", via_http),
            ("verl adapter compute_score", via_verl),
        ):
            bench.flush_cache()
            results.setdefault(name, []).append(asyncio.run(fn()))
    base_rps = n / statistics.median(batch_s)
    print(f"  {'one GradingClient.grade() batch':<34} {base_rps:8.0f} rollouts/s")
    for name, rounds in results.items():
        wall, lat = sorted(rounds)[len(rounds) // 2]
        report(name, n, wall, lat, base_rps)
    service_s, client_s = http_cpu_s[-1]
    print(
        f"  HTTP CPU per rollout (last round): service {service_s / n * 1e6:.0f} us, "
        f"load generator {client_s / n * 1e6:.0f} us (same cores as the workers)"
    )
    print("  coalesced batch sizes (last round):")
    for name, counter in sizes.items():
        print(f"    {name:<20} {sizes_line(counter)}")
    print(f"    {'HTTP (service)':<20} {http_batch_sizes(url)}")

    def half_rate(name: str) -> float:
        wall, _ = sorted(results[name])[len(results[name]) // 2]
        return n / wall / 2

    def sample_for(rate: float) -> list[Rollout]:
        count = max(200, int(rate * args.half_load_s))
        return (rollouts * (count // n + 1))[:count]

    print(
        "== half load: open loop, one call every 1/rate s, rate = half of what that "
        f"path sustained above (batch/2 = {base_rps / 2:.0f}/s for reference)"
    )

    async def half_client() -> None:
        rate = half_rate("async client (coalescing)")
        async with CoalescingGrader(bench.redis.url) as grader:
            lat = await open_loop(lambda r: grader.grade([r]), sample_for(rate), rate)
            print(
                f"  async client at {rate:.0f}/s: p50 {pct(lat, 0.5) * 1000:.1f} ms "
                f"(target < 50 ms) p99 {pct(lat, 0.99) * 1000:.1f} ms; batches "
                f"{sizes_line(grader.coalescer.batch_sizes)}"
            )

    async def half_http() -> None:
        rate = half_rate("HTTP /v1/grade, 1 item each")
        sample = sample_for(rate)
        async with http_caller(url, args.http_connections) as post:
            lat = await open_loop(lambda r: post([r]), sample, rate)
        print(
            f"  HTTP at {rate:.0f}/s: p50 {pct(lat, 0.5) * 1000:.1f} ms "
            f"(target < 50 ms) p99 {pct(lat, 0.99) * 1000:.1f} ms"
        )

    bench.flush_cache()
    asyncio.run(half_client())
    bench.flush_cache()
    asyncio.run(half_http())

    print("== one 256-rollout request: HTTP vs the Python client (median of rounds)")
    chunk = rollouts[:256]
    body = {"items": [{"response": r.response, "gold": r.gold} for r in chunk]}
    http_s, client_s = [], []
    with httpx.Client(timeout=120) as http:
        for _ in range(max(3, args.rounds * 2)):
            bench.flush_cache()
            started = time.perf_counter()
            assert http.post(url + "/v1/grade", json=body).status_code == 200
            http_s.append(time.perf_counter() - started)
            bench.flush_cache()
            client_s.append(timed_batch(bench, chunk))
    ratio = statistics.median(client_s) / statistics.median(http_s)
    print(
        f"  HTTP {statistics.median(http_s) * 1000:.0f} ms, client "
        f"{statistics.median(client_s) * 1000:.0f} ms: HTTP at {ratio:.2f}x the "
        "client's speed (target >= 0.9x)"
    )


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed_batch(bench: Bench, rollouts: Sequence[Rollout]) -> float:
    started = time.perf_counter()
    bench.grade(rollouts)
    return time.perf_counter() - started


if __name__ == "__main__":
    raise SystemExit(main())
