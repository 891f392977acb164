"""The monitor's only way to the daemon: HTTP, through one httpx AsyncClient.

    SnoozeError
    └── MonitorError             a poll, load or unload that didn't work out
        ├── DaemonUnreachable    no answer at all (refused, reset, timed out)
        └── DaemonRefused        an error answer: 401/403 from auth, 404, 503 … (`status`)

One poll reads `/admin/status` and `/metrics` together. `/metrics` is optional: a daemon
without it (404), or a key not allowed to read it, gives a poll without histograms, never an
error.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import quote

import httpx

from snoozeml.errors import SnoozeError
from snoozeml.monitor.latency import Histogram, parse_histograms
from snoozeml.monitor.status import Status, StatusFormatError, parse_status

POLL_TIMEOUT_S = 5.0
# A load waits for the model to be READY, up to the daemon's load_timeout.
ACTION_TIMEOUT_S = 300.0


class MonitorError(SnoozeError):
    """A poll, load or unload that didn't work out; the message says why, in one line."""


class DaemonUnreachable(MonitorError):
    pass


class DaemonRefused(MonitorError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Poll:
    status: Status
    histograms: dict[str, Histogram] | None  # None: no usable /metrics this time
    metrics_note: str | None  # why there are no histograms, for the header
    at: float  # time.monotonic() when the answers arrived


class DaemonClient:
    """`async with DaemonClient(url, api_key) as daemon: await daemon.poll()`."""

    def __init__(self, url: str, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"X-API-Key": api_key} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers,
                                       timeout=POLL_TIMEOUT_S, transport=transport)

    async def __aenter__(self) -> DaemonClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def poll(self) -> Poll:
        """The status and, when the daemon serves it, the request-duration histograms."""
        status_answer, metrics = await asyncio.gather(
            self._send("GET", "/admin/status", "read /admin/status"),
            self._metrics(),
        )
        try:
            status = parse_status(status_answer.json())
        except (json.JSONDecodeError, StatusFormatError) as exc:
            raise MonitorError(f"{self.url}/admin/status did not answer a status: {exc}") \
                from exc
        histograms, note = metrics
        return Poll(status, histograms, note, time.monotonic())

    async def load(self, model: str) -> None:
        """Load `model` now; returns once the daemon answers that it is READY."""
        await self._send("POST", f"/v2/repository/models/{quote(model, safe='')}/load",
                         f"load {model!r}", limit_s=ACTION_TIMEOUT_S)

    async def unload(self, model: str) -> None:
        """Unload `model` now; returns once the daemon answers that it is UNLOADED."""
        await self._send("POST", f"/v2/repository/models/{quote(model, safe='')}/unload",
                         f"unload {model!r}", limit_s=ACTION_TIMEOUT_S)

    async def _metrics(self) -> tuple[dict[str, Histogram] | None, str | None]:
        try:
            answer = await self._send("GET", "/metrics", "read /metrics")
        except DaemonRefused as exc:
            return None, ("no /metrics on this daemon" if exc.status == 404
                          else f"/metrics refused ({exc.status})")
        except DaemonUnreachable:
            return None, "/metrics unreachable"
        try:
            return parse_histograms(answer.text), None
        except ValueError:
            return None, "/metrics is not Prometheus text"

    async def _send(self, method: str, path: str, what: str,
                    limit_s: float = POLL_TIMEOUT_S) -> httpx.Response:
        try:
            answer = await self._http.request(method, path, timeout=limit_s)
        except httpx.HTTPError as exc:
            reason = str(exc) or type(exc).__name__
            raise DaemonUnreachable(f"cannot reach {self.url}: {reason}") from exc
        if answer.status_code >= 400:
            raise DaemonRefused(f"{what}: {answer.status_code} {_error_text(answer)}",
                                answer.status_code)
        return answer


def _error_text(answer: httpx.Response) -> str:
    """The `error` of a JSON error answer, or the start of whatever else it sent."""
    try:
        body = answer.json()
    except ValueError:
        return answer.text.strip()[:200] or answer.reason_phrase
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return answer.text.strip()[:200]
