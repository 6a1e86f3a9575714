"""Container health check for the gradefleet image (stdlib only, no gradefleet imports).

Exit 0 when healthy, 1 otherwise, with one line on stdout saying why.

- Worker (default): GET the node's metrics endpoint
  (http://127.0.0.1:$GRADEFLEET_METRICS_PORT/metrics); with --ready it must also show
  `gradefleet_queue_depth_up 1`, i.e. the node read the broker's queue in that scrape.
- Service: set GRADEFLEET_HEALTHCHECK_URL (e.g. http://127.0.0.1:8000/readyz): a 2xx
  answer is healthy.

Why not `celery inspect ping`: it imports Celery and round-trips through the broker
(seconds of CPU per probe, and every worker turns unhealthy at once when Redis blips).
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request

_UP_LINE = "gradefleet_queue_depth_up 1.0"


def check(url: str, *, ready: bool, timeout_s: float) -> tuple[bool, str]:
    """(healthy, reason) for one GET of `url`."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read(4_000_000).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"{url}: {exc}"
    if not ready or not url.endswith("/metrics"):
        return True, f"{url}: answered"
    if any(line.strip() == _UP_LINE for line in body.splitlines()):
        return True, f"{url}: broker queue readable"
    return False, f"{url}: the node cannot read the broker's queue"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready", action="store_true", help="also need the broker")
    parser.add_argument("--url", help="default: $GRADEFLEET_HEALTHCHECK_URL or metrics")
    parser.add_argument("--timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    port = os.environ.get("GRADEFLEET_METRICS_PORT", "9808")
    url = (
        args.url
        or os.environ.get("GRADEFLEET_HEALTHCHECK_URL")
        or f"http://127.0.0.1:{port}/metrics"
    )
    healthy, reason = check(url, ready=args.ready, timeout_s=args.timeout_s)
    print(reason)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
