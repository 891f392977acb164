"""The inference route as a plain ASGI app in front of FastAPI.

Every other endpoint goes through FastAPI. Inference skips FastAPI's middleware and routing
chain (seven layers in current FastAPI), which costs more than a small model's run: measured on
the bench MLP it is the difference between ~2,500 and ~4,000+ requests/s on two cores. It is
the same request boundary as any other endpoint (api/boundary.py): the same answers to errors,
the same event when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

import orjson

from snoozeml.api.boundary import RequestBoundary
from snoozeml.api.codec import (
    binary_outputs,
    decode_json_request,
    encode_http_response,
    parse_json,
)
from snoozeml.api.http_body import (
    ClientGone,
    Message,
    Receive,
    Scope,
    header,
    read_body,
    scope_credentials,
)
from snoozeml.api.http_limits import HEARS_DISCONNECTS, ON_DISCONNECT
from snoozeml.engine.request import InferRequest, InferResponse
from snoozeml.engine.service import InferenceService
from snoozeml.errors import InvalidInput, ShuttingDown
from snoozeml.logs import log_event
from snoozeml.operations import Operation

Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Operation.INFER's routes in snoozeml/operations.py (a test holds the two together).
INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
_JSON_HEADERS = [(b"content-type", b"application/json")]


class InferenceRoute:
    """ASGI app: POST .../infer handled here, everything else passed to `app`."""

    def __init__(
        self,
        app: ASGIApp,
        service: InferenceService,
        boundary: RequestBoundary,
        max_request_size: int,
    ) -> None:
        self.app = app
        self.service = service
        self.boundary = boundary
        self.max_request_size = max_request_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            match = INFER_PATH.match(scope["path"])
            if match is not None:
                if scope["method"] == "POST":
                    await self.infer(receive, send, match["name"], match["version"], scope)
                else:
                    await _method_not_allowed(send)
                return
        await self.app(scope, receive, send)

    async def infer(
        self, receive: Receive, send: Send, name: str, version: str | None, scope: Scope
    ) -> None:
        call = self.boundary.begin(Operation.INFER, "http", name)
        headers: list[tuple[bytes, bytes]] = _JSON_HEADERS
        try:
            if call.checks_credentials:  # before the body is read
                call.authorize(*scope_credentials(scope))
            body = await read_body(scope, receive, self.max_request_size)
            request = _decode(scope, body)
            is_binary = binary_outputs(request)
            response = await self._infer_until_gone(scope, name, version, request)
            payload, header_length = encode_http_response(response, is_binary)
            if header_length is not None:
                headers = [
                    (b"content-type", b"application/octet-stream"),
                    (b"inference-header-content-length", str(header_length).encode()),
                ]
            status = 200
            call.succeeded()
        except ClientGone:
            call.cancelled()
            log_event("client_disconnected", logging.DEBUG, model=name)
            return
        except asyncio.CancelledError:
            call.cancelled()
            raise
        except Exception as exc:  # boundary: one request fails, the daemon keeps serving
            answer = call.failed(exc)
            status = answer.http_status
            payload = orjson.dumps({"error": answer.message})
            extra = answer.http_headers()
            if extra:
                headers = [*headers, *((k.lower().encode(), v.encode()) for k, v in extra.items())]
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def _infer_until_gone(
        self, scope: Scope, name: str, version: str | None, request: InferRequest
    ) -> InferResponse:
        """Run the request; if the client disconnects first, cancel it so it leaves the batch
        queue without running. The daemon's HTTP protocol (api/http_limits.py) says so
        through the scope's hook: no task per request watches the connection."""
        task = asyncio.current_task()
        assert task is not None
        gone = False

        def left() -> None:
            nonlocal gone
            gone = True
            task.cancel()

        if scope.get(HEARS_DISCONNECTS) is False:  # lost while the body was decoded
            raise ClientGone
        scope[ON_DISCONNECT] = left
        try:
            return await self.service.infer(name, version, request)
        except asyncio.CancelledError:
            if gone:
                task.uncancel()
                raise ClientGone from None
            if self.service.draining:
                # Cut off at the end of the drain: answer instead of dropping the connection.
                task.uncancel()
                raise ShuttingDown(
                    "the server shut down before this request finished", retry_after=1.0
                ) from None
            raise
        finally:
            del scope[ON_DISCONNECT]


async def _method_not_allowed(send: Send) -> None:
    payload = orjson.dumps({"error": "Method Not Allowed"})
    await send({"type": "http.response.start", "status": 405,
                "headers": [*_JSON_HEADERS, (b"allow", b"POST"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def _decode(scope: Scope, body: bytes) -> InferRequest:
    """JSON, or a JSON header followed by binary tensors (Inference-Header-Content-Length)."""
    value = header(scope, b"inference-header-content-length")
    if value is None:
        return decode_json_request(parse_json(body))
    # Digits only (int() would also take "+104", "1_04" and " 104"), and few enough for int()
    # (it refuses 4,300 or more) and for any body.
    if not value.isdigit() or len(value) > 19:
        raise InvalidInput("invalid Inference-Header-Content-Length header "
                           "(expected a number of bytes)")
    header_length = int(value)
    if not 0 <= header_length <= len(body):
        raise InvalidInput(
            f"Inference-Header-Content-Length {header_length} does not fit a body of "
            f"{len(body)} bytes"
        )
    view = memoryview(body)
    return decode_json_request(parse_json(view[:header_length]), view[header_length:])
