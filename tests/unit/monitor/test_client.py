"""The monitor's HTTP client (monitor/client.py) against a fake transport: a poll reads the
status and the histograms, the API key travels as X-API-Key, and refusals and silence are
monitor errors. No daemon."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from monitor_answers import METRICS, status_document

from snoozeml.monitor.client import DaemonClient, DaemonRefused, DaemonUnreachable, MonitorError

Handler = Callable[[httpx.Request], httpx.Response]


def answering(metrics: httpx.Response, action: httpx.Response | None = None) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/admin/status":
            return httpx.Response(200, json=status_document())
        if request.url.path == "/metrics":
            return metrics
        assert action is not None, request.url.path
        return action
    return handle


def run(handler: Handler, call: Callable[[DaemonClient], Any], key: str | None = None) -> Any:
    async def go() -> Any:
        async with DaemonClient("http://daemon", key, httpx.MockTransport(handler)) as client:
            return await call(client)
    return asyncio.run(go())


def test_a_poll_reads_the_status_and_the_histograms() -> None:
    poll = run(answering(httpx.Response(200, text=METRICS)), lambda c: c.poll())
    assert [m.name for m in poll.status.models] == ["classifier", "embedder"]
    assert poll.histograms is not None
    assert poll.histograms["a"].count == 6.0
    assert poll.metrics_note is None


@pytest.mark.parametrize(("answer", "note"), [
    (httpx.Response(404, json={"error": "Not Found"}), "no /metrics on this daemon"),
    (httpx.Response(403, json={"error": "permission denied"}), "/metrics refused (403)"),
    (httpx.Response(200, text="{{ not metrics"), "/metrics is not Prometheus text"),
])
def test_a_daemon_without_usable_metrics_still_gives_a_poll_without_histograms(
        answer: httpx.Response, note: str) -> None:
    poll = run(answering(answer), lambda c: c.poll())
    assert poll.histograms is None
    assert poll.metrics_note == note
    assert len(poll.status.models) == 2


def test_the_api_key_travels_as_x_api_key() -> None:
    seen: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("X-API-Key"))
        return answering(httpx.Response(404))(request)

    run(handle, lambda c: c.poll(), key="snz_secret")
    assert seen == ["snz_secret", "snz_secret"]


def test_a_refused_unload_raises_with_the_daemons_error_text() -> None:
    refusal = httpx.Response(403, json={
        "error": "permission denied: repository_unload needs role 'admin' "
                 "(this credential has 'readonly')"})
    with pytest.raises(DaemonRefused) as caught:
        run(answering(httpx.Response(404), refusal), lambda c: c.unload("a b"))
    assert caught.value.status == 403
    assert caught.value.message == (
        "unload 'a b': 403 permission denied: repository_unload needs role 'admin' "
        "(this credential has 'readonly')")


def test_load_posts_to_the_repository_api_with_the_name_quoted() -> None:
    paths: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        paths.append(f"{request.method} {request.url.raw_path.decode()}")
        return httpx.Response(200, json={})

    run(handle, lambda c: c.load("a/b"))
    assert paths == ["POST /v2/repository/models/a%2Fb/load"]


def test_no_answer_and_a_non_status_answer_are_monitor_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    with pytest.raises(DaemonUnreachable, match="cannot reach http://daemon: Connection refused"):
        run(refuse, lambda c: c.poll())

    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>hello</html>")

    with pytest.raises(MonitorError, match="did not answer a status"):
        run(html, lambda c: c.poll())

    def odd(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=json.dumps({"server": {}}))

    with pytest.raises(MonitorError, match="did not answer a status"):
        run(odd, lambda c: c.poll())
