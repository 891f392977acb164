"""The inference route, served by the daemon's HTTP protocol in front of the Starlette app.

Every other endpoint goes through the app (api/http/rest.py). Inference skips its middleware
and routing chain, which costs more than a small model's run: measured on the bench MLP, when
that chain was FastAPI's (seven layers), it was the difference between ~2,500 and ~4,000+
requests/s on two cores. It is
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
from snoozeml.api.http.body import ClientGone, Message, Receive, Scope, credentials, header
from snoozeml.api.http.exchange import InferExchange
from snoozeml.engine.requests.request import InferRequest, InferResponse
from snoozeml.engine.service import InferenceService
from snoozeml.errors import InvalidInput, ShuttingDown, describe_exception
from snoozeml.logs import log_event
from snoozeml.operations import Operation

Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Operation.INFER's routes in snoozeml/operations.py (a test holds the two together).
INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
_JSON_HEADERS = [(b"content-type", b"application/json")]


class InferenceRoute:
    """Inference over HTTP. The daemon's HTTP protocol hands each `POST .../infer` to `serve`
    as an InferExchange, without an ASGI cycle; as an ASGI app in front of the others, this
    answers any other method on an inference path 405 and passes the rest on to `app`."""

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
                if scope["method"] == "POST":  # only without the daemon's HTTP protocol
                    await _respond(send, 500, {"error": "internal error: inference over HTTP "
                                               "is served by the daemon's HTTP protocol"})
                else:
                    await _respond(send, 405, {"error": "Method Not Allowed"},
                                   [(b"allow", b"POST")])
                return
        await self.app(scope, receive, send)

    def take(self, path: str) -> tuple[str, str | None] | None:
        """The model name and version of an inference path; None for any other path."""
        match = INFER_PATH.match(path)
        return None if match is None else (match["name"], match["version"])

    async def serve(self, exchange: InferExchange) -> None:
        """Answer one inference request; every ending is the boundary's."""
        call = self.boundary.begin(Operation.INFER, "http", exchange.name)
        headers: list[tuple[bytes, bytes]] = _JSON_HEADERS
        try:
            try:
                if call.checks_credentials:  # before the body is read
                    call.authorize(*credentials(exchange.headers))
                body = await exchange.body()
                request = _decode(exchange, body)
                is_binary = binary_outputs(request)
                response = await self._infer(exchange, request)
            except asyncio.CancelledError:
                task = exchange.task
                if exchange.disconnected:  # the protocol cancelled it: the client left
                    if task is not None:
                        task.uncancel()
                    raise ClientGone from None
                if self.service.draining:
                    # Cut off at the end of the drain: answer instead of dropping the connection.
                    if task is not None:
                        task.uncancel()
                    raise ShuttingDown(
                        "the server shut down before this request finished", retry_after=1.0
                    ) from None
                raise
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
            log_event("client_disconnected", logging.DEBUG, model=exchange.name)
            exchange.abandon()
            return
        except asyncio.CancelledError:
            call.cancelled()
            exchange.abandon()
            raise
        except Exception as exc:  # boundary: one request fails, the daemon keeps serving
            answer = call.failed(exc)
            status = answer.http_status
            payload = orjson.dumps({"error": answer.message})
            extra = answer.http_headers()
            if extra:
                headers = [*headers, *((k.lower().encode(), v.encode()) for k, v in extra.items())]
        try:
            await exchange.answer(status, headers, payload)
        except Exception as exc:  # boundary: the answer could not be written; the call ended
            log_event("http_answer_failed", logging.WARNING, model=exchange.name,
                      error=describe_exception(exc))
            exchange.abandon()

    async def _infer(self, exchange: InferExchange, request: InferRequest) -> InferResponse:
        """Run the request. A client that leaves meanwhile has the protocol cancel this (the
        exchange's `lost`), so the request leaves the batch queue without running."""
        if exchange.disconnected:  # lost while the body was decoded
            raise ClientGone
        exchange.waits_on_model = True
        try:
            return await self.service.infer(exchange.name, exchange.version, request)
        finally:
            exchange.waits_on_model = False


async def _respond(
    send: Send, status: int, doc: dict[str, str], extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = orjson.dumps(doc)
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON_HEADERS, *(extra or ()),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def _decode(exchange: InferExchange, body: bytes) -> InferRequest:
    """JSON, or a JSON header followed by binary tensors (Inference-Header-Content-Length)."""
    value = header(exchange.headers, b"inference-header-content-length")
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
