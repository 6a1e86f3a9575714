"""The `Grader` for `http://` and `https://` URLs: a running `gradefleet serve`.

Sync, for the seam's sync callers (the CLI, scripts): rollouts go out in requests
of `REQUEST_ITEMS` to `POST /v1/grade` with httpx (the `serve` extra), one after
another, so progress is reported per request and a 10-million-row file never sits in
one body. The bearer token comes from `GRADEFLEET_TOKEN` (read by `open_grader`'s
caller's environment at this entry point). Async callers use
`producer.client.grading.CoalescingGrader`, whose `HttpBackend` speaks the same
route.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from producer.client.grader import Grader, GraderBase, ProgressFn
from producer.client.rollouts import validate_rollouts
from producer.errors import BrokerUnavailableError, DeadlinePassedError, ProducerError
from producer.extras import require
from producer.settings import ProducerSettings
from workers.models import GradeOptions, RolloutLike, Status, Verdict
from workers.wire.lanes import INTERACTIVE, parse_lane
from workers.wire.urls import redact_url

if TYPE_CHECKING:
    import httpx

__all__ = ["REQUEST_ITEMS", "HttpGrader", "open_http_grader", "request_options"]

# Items per request: large enough that per-request overhead vanishes (a 256-item
# request costs the service about what the Python client pays), small enough that a
# body stays a few MB under the service's 64 MB default limit.
REQUEST_ITEMS = 2048
TOKEN_ENV = "GRADEFLEET_TOKEN"
_RETRIES_503 = 30
_GRADE_PATH = "/v1/grade"
_DEADLINE_HEADER = "X-Gradefleet-Deadline-S"


def request_options(options: GradeOptions, lane: str) -> dict[str, Any]:
    """The `options` of a `/v1/grade` request. The lane is left out when it is the
    service's default, so a service older than lanes still takes the request."""
    body = options.to_dict()
    if parse_lane(lane) != INTERACTIVE:
        body["priority"] = lane
    return body


class HttpGrader(GraderBase):
    """Grade through `gradefleet serve` at `url` (same verdicts as embedded/fleet).

    `priority`: the fleet lane the service sends these rollouts to (`options.priority`
    of every request).
    """

    def __init__(
        self,
        url: str,
        options: GradeOptions,
        *,
        token: str | None = None,
        priority: str = INTERACTIVE,
        request_items: int = REQUEST_ITEMS,
        timeout_s: float = 3600.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._options = request_options(options, priority)
        self._priority = priority
        self._request_items = request_items
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Imported here, not at the top: httpx is the `serve` extra's (without it,
        # exit 2 naming its pip line), and `open_grader` imports this module.
        (http,) = require("serve", "httpx")
        self._http_error: type[httpx.HTTPError] = http.HTTPError
        self._client: httpx.Client = http.Client(
            base_url=self.url,
            headers=headers,
            timeout=http.Timeout(timeout_s, connect=10.0),
        )

    def grade(
        self,
        rollouts: Sequence[RolloutLike],
        *,
        on_progress: ProgressFn | None = None,
        deadline_s: float | None = None,
        options: GradeOptions | None = None,
    ) -> list[Verdict]:
        body_options = self._options
        if options is not None:
            body_options = request_options(options, self._priority)
        pairs = [(response, gold) for _, response, gold in validate_rollouts(rollouts)]
        deadline_at = None if deadline_s is None else time.monotonic() + deadline_s
        verdicts: list[Verdict] = []
        for start in range(0, len(pairs), self._request_items):
            chunk = pairs[start : start + self._request_items]
            verdicts += self._post(chunk, body_options, deadline_at)
            if on_progress is not None:
                on_progress(len(chunk))
        return verdicts

    def _post(
        self,
        chunk: Sequence[tuple[str, str]],
        options: dict[str, Any],
        deadline_at: float | None,
    ) -> list[Verdict]:
        body: dict[str, Any] = {
            "items": [{"response": r, "gold": g} for r, g in chunk],
            "options": options,
        }
        for _ in range(_RETRIES_503):
            headers = {}
            if deadline_at is not None:
                left_s = deadline_at - time.monotonic()
                if left_s <= 0:
                    raise DeadlinePassedError(f"deadline passed before {self.url}")
                headers[_DEADLINE_HEADER] = f"{left_s:.3f}"
            try:
                reply = self._client.post(_GRADE_PATH, json=body, headers=headers)
            except self._http_error as exc:
                raise BrokerUnavailableError(
                    f"grading service {redact_url(self.url)}: {exc}"
                ) from exc
            if reply.status_code == 503:
                time.sleep(_retry_after_s(reply.headers.get("Retry-After")))
                continue
            if reply.status_code != 200:
                raise ProducerError(
                    f"grading service {redact_url(self.url)} answered "
                    f"{reply.status_code}: {reply.text[:500]}"
                )
            verdicts = [Verdict.from_dict(r) for r in reply.json()["results"]]
            late = deadline_at is not None and time.monotonic() >= deadline_at
            if late and any(v.status is Status.TIMEOUT for v in verdicts):
                # The seam's contract: a passed deadline is an error, not verdicts.
                raise DeadlinePassedError(
                    f"deadline passed with items ungraded at {redact_url(self.url)}"
                )
            return verdicts
        raise BrokerUnavailableError(f"{redact_url(self.url)} stayed overloaded (503)")

    def close(self) -> None:
        self._client.close()


def _retry_after_s(value: str | None) -> float:
    try:
        return min(max(float(value or 1.0), 0.05), 30.0)
    except ValueError:
        return 1.0


def open_http_grader(
    url: str | None, options: GradeOptions, settings: ProducerSettings
) -> Grader:
    """`open_grader`'s factory for http(s):// URLs."""
    assert url is not None
    return HttpGrader(
        url,
        options,
        token=os.environ.get(TOKEN_ENV) or None,
        priority=settings.priority,
    )
