"""One inference request on an HTTP connection, served by the protocol without an ASGI cycle.

uvicorn gives every request a `RequestResponseCycle`: an ASGI scope, an `asyncio.Event`, a
`receive` that hands the body over as messages and a `send` that checks and writes the head and
then the body, two writes. For `POST .../infer` the daemon's protocol (api/http/protocol.py)
creates an `InferExchange` in its place: the body is gathered as it arrives (up to the request
size limit), the answer is written whole, in one write, and a client that leaves is heard here.

The exchange stands where uvicorn keeps its cycle, so the protocol's own logic reads it as one:
`response_started`, `response_complete`, `disconnected` and `keep_alive` mean what they mean
there, which is what keeps pipelining, keep-alive, graceful shutdown and the limits' refusals as
they are for every other request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from snoozeml.api.http.body import ClientGone, check_declared, inflate, too_large
from snoozeml.api.http.uvicorn_private import STATUS_LINE, FlowControl

Headers = list[tuple[bytes, bytes]]


class Lane(Protocol):
    """Where the protocol sends inference requests (api/http/fastpath.py's InferenceRoute)."""

    max_request_size: int

    def take(self, path: str) -> tuple[str, str | None] | None:
        """The model name and version when `path` is an inference path; else None."""

    def serve(self, exchange: InferExchange) -> Coroutine[Any, Any, None]:
        """Answer the exchange."""


class _Unused:
    """uvicorn's protocol sets a cycle's `message_event` when the connection is lost; an
    exchange hears that through `lost()`, called first."""

    __slots__ = ()

    def set(self) -> None:
        pass


_UNUSED = _Unused()


class InferExchange:
    __slots__ = ("_body_error", "_chunks", "_complete", "_limit", "_received", "_waiter",
                 "default_headers", "disconnected", "expect_100_continue", "flow", "headers",
                 "keep_alive", "name", "on_response", "response_complete", "response_started",
                 "task", "transport", "version", "waits_on_model")

    message_event = _UNUSED

    def __init__(
        self,
        transport: asyncio.Transport,
        flow: FlowControl,
        default_headers: Headers,
        on_response: Callable[[], None],
        name: str,
        version: str | None,
        headers: Headers,
        keep_alive: bool,
        expect_100_continue: bool,
        limit: int,
    ) -> None:
        self.transport = transport
        self.flow = flow
        self.default_headers = default_headers
        self.on_response = on_response  # the protocol's: starts a pipelined request, or idles
        self.name = name
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive
        self.expect_100_continue = expect_100_continue
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.task: asyncio.Task[None] | None = None  # set by the protocol when its turn comes
        self.waits_on_model = False  # a lost connection then cancels the task
        self._limit = limit
        self._chunks: list[bytes] = []
        self._received = 0
        self._complete = False
        self._body_error: Exception | None = None  # over the limit
        self._waiter: asyncio.Future[None] | None = None

    # --- from the protocol ------------------------------------------------------------

    def feed(self, chunk: bytes) -> None:
        """Body bytes, as the parser delivers them."""
        if self.response_complete or self._body_error is not None:
            return  # answered already (401, 413...): the rest of the body is read and dropped
        self._received += len(chunk)
        if self._received > self._limit:
            self._chunks.clear()
            self._body_error = too_large(self._limit)
            self._wake()
            return
        self._chunks.append(chunk)

    def finish(self) -> None:
        """The whole body is in."""
        self._complete = True
        self._wake()

    def lost(self) -> None:
        """The connection is gone before the answer was complete (or a refusal took it)."""
        self.disconnected = True
        self._wake()
        if self.waits_on_model and self.task is not None:
            self.task.cancel()

    # --- for the route ----------------------------------------------------------------

    async def body(self) -> bytes:
        """The whole body, inflated, at most the limit before and after inflating. Raises
        ClientGone when the client leaves first."""
        encoding = check_declared(self.headers, self._limit)
        if self.expect_100_continue and not self.transport.is_closing():
            # As uvicorn's first `receive`: even when the body came with the head.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.expect_100_continue = False
        if not self._complete and self._body_error is None and not self.disconnected:
            self.flow.resume_reading()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.disconnected:
            raise ClientGone
        if self._body_error is not None:
            raise self._body_error
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return body if encoding is None else inflate(encoding, body, self._limit)

    async def answer(self, status: int, headers: Headers, payload: bytes) -> None:
        """The whole response in one write (none if the client is gone)."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        self.response_started = True
        self.expect_100_continue = False
        if self.disconnected or self.transport.is_closing():
            # Gone, or going (the client shut its side: the transport closes, and
            # connection_lost follows): nothing more on this connection.
            self.response_complete = True
            return
        content = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            content += [name, b": ", value, b"\r\n"]
        for name, value in headers:
            content += [name, b": ", value, b"\r\n"]
        content.append(b"content-length: %d\r\n" % len(payload))
        if not self.keep_alive:  # last, as uvicorn writes it
            content.append(b"connection: close\r\n")
        content += [b"\r\n", payload]
        self.transport.write(b"".join(content))
        self.response_complete = True
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    def abandon(self) -> None:
        """No answer will be written. A connection still open (the task was cancelled outside
        a drain) is closed; one that is gone, or that a refusal took over (its answer still
        being read by the client), is left alone."""
        self.response_started = self.response_complete = True
        if not self.disconnected:
            self.transport.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
