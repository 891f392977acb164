"""The inference route as a plain ASGI app in front of FastAPI.

Every other endpoint goes through FastAPI. Inference skips FastAPI's middleware and routing
chain (seven layers in current FastAPI), which costs more than a small model's run: measured on
the bench MLP it is the difference between ~2,500 and ~4,000+ requests/s on two cores. The
semantics are the same as any other endpoint: domain errors map through api/errors.py,
anything else is a logged 500.
"""

from __future__ import annotations

import asyncio
import logging
import re
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from snoozeml.api.codec import (
    binary_outputs,
    decode_json_request,
    encode_http_response,
    parse_json,
)
from snoozeml.api.errors import http_status, retry_after_header
from snoozeml.engine.manager import InferenceService
from snoozeml.engine.model import describe_exception
from snoozeml.engine.request import InferRequest, InferResponse
from snoozeml.errors import InvalidInput, RequestTooLarge, ShuttingDown, SnoozeError
from snoozeml.logs import log_event

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
_JSON_HEADERS = [(b"content-type", b"application/json")]


class ClientGone(Exception):
    """The client disconnected before we answered."""


class InferenceRoute:
    """ASGI app: POST .../infer handled here, everything else passed to `app`."""

    def __init__(self, app: ASGIApp, service: InferenceService, max_request_size: int) -> None:
        self.app = app
        self.service = service
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
        headers: list[tuple[bytes, bytes]] = _JSON_HEADERS
        try:
            body = await self._read_body(scope, receive)
            request = _decode(scope, body)
            is_binary = binary_outputs(request)
            response = await self._infer_until_gone(receive, name, version, request)
            status = 200
            payload, header_length = encode_http_response(response, is_binary)
            if header_length is not None:
                headers = [
                    (b"content-type", b"application/octet-stream"),
                    (b"inference-header-content-length", str(header_length).encode()),
                ]
        except ClientGone:
            log_event("client_disconnected", logging.DEBUG, model=name)
            return
        except SnoozeError as exc:
            status = http_status(exc)
            if status >= 500 and status != 501:  # 501: the client asked for a missing feature
                log_event("request_failed", logging.WARNING, model=name, status=status,
                          error=exc.message)
            payload = orjson.dumps({"error": exc.message})
            extra = retry_after_header(exc)
            if extra:
                headers = [*headers, *((k.lower().encode(), v.encode()) for k, v in extra.items())]
        except Exception as exc:  # boundary: one request fails, the daemon keeps serving
            status = 500
            log_event("request_failed", logging.ERROR, model=name, status=500,
                      error=describe_exception(exc))
            logging.getLogger("snoozeml").debug("traceback", exc_info=True)
            payload = orjson.dumps({"error": f"internal error: {describe_exception(exc)}"})
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_request_size
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise InvalidInput("invalid Content-Length header") from None
                if declared > limit:
                    raise RequestTooLarge(
                        f"request body of {declared} bytes exceeds the limit of {limit}"
                    )
                break
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
            if not message.get("more_body", False):
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                return _decompress(scope, body, limit)

    async def _infer_until_gone(
        self, receive: Receive, name: str, version: str | None, request: Any
    ) -> InferResponse:
        """Run the request; if the client disconnects first, cancel it so it leaves the batch
        queue without running (the next ASGI message after the body is a disconnect)."""
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()

        watcher = asyncio.ensure_future(watch())
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
            watcher.cancel()


async def _method_not_allowed(send: Send) -> None:
    payload = orjson.dumps({"error": "Method Not Allowed"})
    await send({"type": "http.response.start", "status": 405,
                "headers": [*_JSON_HEADERS, (b"allow", b"POST"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


_WBITS = {b"gzip": 31, b"deflate": 15}  # zlib's window bits for a gzip / zlib stream


def _decompress(scope: Scope, body: bytes, limit: int) -> bytes:
    """The body as sent before its Content-Encoding (tritonclient's request compression);
    what it inflates to is held to the same size limit."""
    encoding = b""
    for key, value in scope["headers"]:
        if key == b"content-encoding":
            encoding = value.strip().lower()
            break
    if encoding in (b"", b"identity"):
        return body
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise InvalidInput(
            f"unsupported Content-Encoding {encoding.decode('latin-1')!r}; "
            "use gzip, deflate or none"
        )
    inflater = zlib.decompressobj(wbits)
    try:
        plain = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"request body is not valid {encoding.decode()} data: {exc}") from None
    if len(plain) > limit:
        raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes once inflated")
    if not inflater.eof:
        raise InvalidInput(f"request body is truncated {encoding.decode()} data")
    return plain


def _decode(scope: Scope, body: bytes) -> InferRequest:
    """JSON, or a JSON header followed by binary tensors (Inference-Header-Content-Length)."""
    header_length = None
    for key, value in scope["headers"]:
        if key == b"inference-header-content-length":
            try:
                header_length = int(value)
            except ValueError:
                raise InvalidInput("invalid Inference-Header-Content-Length header") from None
            break
    if header_length is None:
        return decode_json_request(parse_json(body))
    if not 0 <= header_length <= len(body):
        raise InvalidInput(
            f"Inference-Header-Content-Length {header_length} does not fit a body of "
            f"{len(body)} bytes"
        )
    view = memoryview(body)
    return decode_json_request(parse_json(view[:header_length]), view[header_length:])
