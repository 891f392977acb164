"""The inference route as an ASGI app: the daemon's HTTP protocol serves POST .../infer itself
(api/http/exchange.py); what reaches the ASGI app on an inference path is answered here, and
every other path goes on to the app behind it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from snoozeml.api.http.fastpath import InferenceRoute


async def _call(route: InferenceRoute, method: str, path: str) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    await route({"type": "http", "method": method, "path": path, "headers": []}, receive, send)
    return sent


def _route(passed: list[str]) -> InferenceRoute:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        passed.append(scope["path"])

    return InferenceRoute(app, service=None, boundary=None, max_request_size=1)  # type: ignore[arg-type]


def test_another_method_on_an_inference_path_is_405_naming_post() -> None:
    passed: list[str] = []
    start, body = asyncio.run(_call(_route(passed), "GET", "/v2/models/m/versions/2/infer"))
    assert start["status"] == 405
    assert (b"allow", b"POST") in start["headers"]
    assert json.loads(body["body"]) == {"error": "Method Not Allowed"}
    assert passed == []


def test_a_post_that_reaches_the_asgi_app_says_where_inference_is_served() -> None:
    # Only without the daemon's protocol (which takes every POST .../infer itself).
    start, body = asyncio.run(_call(_route([]), "POST", "/v2/models/m/infer"))
    assert start["status"] == 500
    assert "served by the daemon's HTTP protocol" in json.loads(body["body"])["error"]


def test_other_paths_go_to_the_app_behind() -> None:
    passed: list[str] = []
    assert asyncio.run(_call(_route(passed), "GET", "/v2/models/m")) == []
    assert passed == ["/v2/models/m"]


def test_take_names_the_model_and_version_of_inference_paths_only() -> None:
    route = _route([])
    assert route.take("/v2/models/m/infer") == ("m", None)
    assert route.take("/v2/models/m/versions/3/infer") == ("m", "3")
    assert route.take("/v2/models/m/ready") is None
