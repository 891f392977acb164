"""`snooze monitor --once`: the models table once, as plain text, without Textual.

Requests per second and latency need two scrapes of `/metrics`, so when the daemon serves it
the table is printed after a second poll, `interval` after the first; without it, at once.
"""

from __future__ import annotations

import asyncio

from snoozeml.monitor.client import DaemonClient
from snoozeml.monitor.latency import LatencyTracker
from snoozeml.monitor.table import build_rows, render_text


async def table_once(url: str, api_key: str | None, interval: float) -> str:
    """The table as `snooze monitor --once` prints it. Raises MonitorError."""
    tracker = LatencyTracker()
    async with DaemonClient(url, api_key) as daemon:
        answer = await daemon.poll()
        window = tracker.update(answer.histograms, answer.at)
        if answer.histograms is not None and interval > 0:
            await asyncio.sleep(interval)  # the window the rates and quantiles cover
            answer = await daemon.poll()
            window = tracker.update(answer.histograms, answer.at)
    return render_text(build_rows(answer.status.models, window))
