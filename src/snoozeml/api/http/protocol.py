"""The bounds one HTTP/1.1 client meets: uvicorn's httptools protocol, with limits.

A connection, from uvicorn's `connection_made` to its `connection_lost`:

    accepted   over `max_connections` open: 503 (Retry-After), closed; else idle
    idle       no request under way: closed after `keep_alive_timeout` (also before the first)
    head       from a request's first byte: its target must stay within `max_request_line`
               (else 414) and its header lines within `max_header_size` (else 431), and the
               head must be in within `header_timeout` (else 408)
    body       from the end of the head: the body must be in within `body_timeout` (else 408)
    answering  the request is read; the app answers it, then the connection is idle again

Each refusal is a JSON `{"error": ...}` with `Connection: close`, after which the connection
is handed to `_Lingering` (see there). Time the server itself stops reading (a pipelined
request, a body the app has not asked for yet) is never counted against the client.

Cost on the hot path: a request whose head and body arrive in one read no bigger than
`max_header_size` arms no timer of ours and has its header lines neither counted nor summed
(they can't be over the limit). What it pays is four small callbacks and a few comparisons:
about 7,000 instructions more than uvicorn's protocol (which takes about 128,000), about 1%
of an inference request to the demo classifier (callgrind).
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import httptools
import orjson
from uvicorn import Config

from snoozeml.api.http.exchange import InferExchange, Lane
from snoozeml.api.http.uvicorn_private import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
    ServerState,
)
from snoozeml.logs import log_event

if TYPE_CHECKING:
    from snoozeml.api.http.uvicorn_private import ASGI3Application

# How long a refused connection is still read (and what is read dropped) before it closes.
LINGER = 1.0
# Header bytes the exact count leaves out: the request line's method and version, the blank
# line, spaces before values. Only the raw-byte guard (a header that never ends) uses it.
_HEAD_SLACK = 1024

# Python's phrase for 414 is RFC 2616's "Request-URI Too Long"; RFC 9110 says "URI Too Long".
_STATUS_LINE = {**STATUS_LINE, 414: b"HTTP/1.1 414 URI Too Long\r\n"}

# What stands for a request on a connection: uvicorn's, or ours for inference.
Cycle = RequestResponseCycle | InferExchange

# What a connection is reading; identity-compared on the hot path.
_IDLE, _HEAD, _BODY = "idle", "head", "body"


@dataclass(frozen=True)
class HttpLimits:
    """`[server]`'s HTTP limits: sizes in bytes, timeouts in seconds."""

    max_header_size: int
    max_request_line: int
    max_connections: int
    keep_alive_timeout: float
    header_timeout: float
    body_timeout: float


class _Occupancy:
    """Whether new connections are being refused now: logged once as it starts and once as
    it ends, not once per connection (a flood would flood the log too)."""

    def __init__(self) -> None:
        self.full = False
        self.refused = 0


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the answer is kept on the protocol."""


def limited_protocol(limits: HttpLimits, lane: Lane) -> type[LimitedHttpProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` that enforces `limits` (one class per
    server: its connections share the occupancy) and hands inference requests to `lane`."""

    class Limited(LimitedHttpProtocol):
        pass

    Limited.limits = limits
    Limited.lane = lane
    Limited.occupancy = _Occupancy()
    return Limited


class LimitedHttpProtocol(HttpToolsProtocol):
    # The parser callbacks run for every request and call HttpToolsProtocol's by name:
    # super() was a third of what this class added to a request (callgrind).
    limits: ClassVar[HttpLimits]
    occupancy: ClassVar[_Occupancy]
    lane: ClassVar[Lane]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = self.limits
        # uvicorn annotates an int; call_later takes any number of seconds.
        self.timeout_keep_alive = limits.keep_alive_timeout  # type: ignore[assignment]
        self._max_header = limits.max_header_size
        self._max_target = limits.max_request_line
        self._head_room = limits.max_header_size + limits.max_request_line + _HEAD_SLACK
        self._reading = _IDLE
        self._timed = _IDLE  # the part `_deadline` times
        self._deadline: asyncio.TimerHandle | None = None
        self._begun = 0  # requests begun on this connection
        self._read_size = 0  # of the read being parsed
        self._long_head = False  # whether this request's head spans reads
        self._raw_head = 0  # bytes of reads that were all head (a header that never ends)
        self._body_seen = False  # whether a read carried body bytes
        self._refusal: tuple[int, str] | None = None

    # --- connection -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            occupancy = self.occupancy
            occupancy.refused += 1
            if not occupancy.full:
                occupancy.full = True
                log_event("http_connections_full", logging.WARNING,
                          max_connections=self.limits.max_connections,
                          detail="new connections get 503 until one closes")
            self._refuse(503, f"too many open connections (max_connections = "
                              f"{self.limits.max_connections}); retry later", retry_after=True)
            return
        # Idle from the start: one that never sends a byte is closed like an idle keep-alive.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        cycle: Cycle = self.cycle
        if type(cycle) is InferExchange and not cycle.response_complete:
            cycle.lost()
        super().connection_lost(exc)
        occupancy = self.occupancy
        if occupancy.full and len(self.connections) < self.limits.max_connections:
            occupancy.full = False
            log_event("http_connections_available", max_connections=self.limits.max_connections,
                      refused=occupancy.refused)
            occupancy.refused = 0

    def timeout_keep_alive_handler(self) -> None:
        if self._reading is _IDLE:  # a request under way has a deadline of its own
            super().timeout_keep_alive_handler()

    # --- reading ----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        # uvicorn's, except: a refusal's own answer; the idle timer stops when a request
        # begins, not at any byte (blank lines between requests don't keep a connection).
        begun, reading = self._begun, self._reading
        self._read_size = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(*self._refusal)
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        # httptools holds an unfinished header line until it ends, so the head is bounded
        # here too, in raw bytes: those of each read that was all head. Trailers after a
        # chunked body likewise: the reads since the last one that carried body bytes.
        if begun != self._begun:
            self._unset_keepalive_if_required()
            if self._reading is _HEAD:
                self._long_head = True
                if reading is _IDLE and self._begun == begun + 1:
                    self._raw_head = len(data)  # the read began the head (after blank lines)
        elif self._reading is _HEAD:
            self._raw_head += len(data)
        elif self._reading is _BODY:
            if self._body_seen:
                self._body_seen = False
                self._raw_head = 0
            else:
                self._raw_head += len(data)
        if self._raw_head > self._head_room:
            self._refuse(431, self._header_message())
            return
        if self._reading is not self._timed:
            self._retime()

    def on_message_begin(self) -> None:
        HttpToolsProtocol.on_message_begin(self)
        self._begun += 1
        self._reading = _HEAD
        self._long_head = False
        self._raw_head = 0

    def on_url(self, url: bytes) -> None:
        self.url += url  # uvicorn's, inlined
        if len(self.url) > self._max_target:
            self._stop(414, f"request target exceeds the limit of {self._max_target} bytes "
                            "(max_request_line)")

    def on_headers_complete(self) -> None:
        # A head that came whole in one read no bigger than the limit can't be over it: the
        # usual request is never counted.
        if self._long_head or self._read_size > self._max_header:
            size = sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > self._max_header:
                self._stop(431, self._header_message())
        self._reading = _BODY
        parser = self.parser
        if (parser.get_method() != b"POST" or self.limit_concurrency is not None
                or (parser.should_upgrade() and self._should_upgrade())
                or not self._exchange()):
            HttpToolsProtocol.on_headers_complete(self)

    def _exchange(self) -> bool:
        """Begin an inference request as an InferExchange in place of uvicorn's cycle (found
        as uvicorn finds any request's path); False for any other path."""
        path = httptools.parse_url(self.url).path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        lane = self.lane
        target = lane.take(self.root_path + path)
        if target is None:
            return False
        parser = self.parser
        exchange = InferExchange(
            self.transport, self.flow, self.server_state.default_headers,
            self.on_response_complete, target[0], target[1], self.headers,
            parser.get_http_version() != "1.0" and parser.should_keep_alive(),
            self.expect_100_continue, lane.max_request_size)
        existing = self.cycle
        self.cycle = exchange  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            self._start_asgi_task(exchange, self.app)
        else:  # pipelined: its turn comes when the answer before it is complete
            self.flow.pause_reading()
            self.pipeline.appendleft((exchange, self.app))  # type: ignore[arg-type]
        return True

    def _start_asgi_task(self, cycle: Cycle, app: ASGI3Application) -> None:
        if isinstance(cycle, InferExchange):
            task = self.loop.create_task(self.lane.serve(cycle))
            cycle.task = task
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
        else:
            HttpToolsProtocol._start_asgi_task(self, cycle, app)

    def on_body(self, body: bytes) -> None:
        self._body_seen = True
        cycle: Cycle = self.cycle
        if type(cycle) is InferExchange:
            cycle.feed(body)
        else:
            HttpToolsProtocol.on_body(self, body)

    def on_message_complete(self) -> None:
        self._reading = _IDLE
        cycle: Cycle = self.cycle
        if type(cycle) is InferExchange:
            cycle.finish()
        else:
            HttpToolsProtocol.on_message_complete(self)

    # --- deadlines and refusals -------------------------------------------------------

    def _retime(self) -> None:
        """Put the deadline on what is being read now (none while idle or answering)."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._timed = reading = self._reading
        if reading is _HEAD:
            self._deadline = self.loop.call_later(self.limits.header_timeout, self._expire)
        elif reading is _BODY:
            self._deadline = self.loop.call_later(self.limits.body_timeout, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if self.flow.read_paused:  # the server stopped reading: not the client's time
            self._timed = _IDLE
            self._retime()
            return
        limits = self.limits
        if self._reading is _HEAD:
            message = (f"request headers not received within {limits.header_timeout:g}s "
                       "(header_timeout)")
        else:
            message = f"request body not received within {limits.body_timeout:g}s (body_timeout)"
        self._refuse(408, message)

    def _header_message(self) -> str:
        return (f"request header fields exceed the limit of {self._max_header} bytes "
                "(max_header_size)")

    def _stop(self, status: int, message: str) -> None:
        self._refusal = (status, message)
        raise _Refused(message)

    def _refuse(self, status: int, message: str, retry_after: bool = False) -> None:
        """Answer `status` with `message` and close, or only close when an answer to an
        earlier request is under way (ours would land inside it) or this one's has begun."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._unset_keepalive_if_required()
        cycle: Cycle = self.cycle
        if self._reading is _BODY:  # `cycle` is this request's; the app may have answered
            free = cycle is None or not cycle.response_started
        else:  # `cycle`, if any, is an earlier request's
            free = cycle is None or cycle.response_complete
        if self.pipeline or not free:
            self.transport.close()  # uvicorn's connection_lost tidies up
            return
        log_event("http_refused", logging.DEBUG, status=status, reason=message,
                  client=f"{self.client[0]}:{self.client[1]}" if self.client else "")
        self.connections.discard(self)
        if type(cycle) is InferExchange and not cycle.response_complete:
            cycle.lost()
        elif cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app waiting for this body hears that it is gone
            cycle.message_event.set()
        body = orjson.dumps({"error": message})
        head = [_STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n"
                    b"connection: close\r\n" % len(body))
        if retry_after:
            head.append(b"retry-after: 1\r\n")
        head += [b"\r\n", body]
        self.transport.write(b"".join(head))
        self.transport.set_protocol(_Lingering(self.transport, self.loop))


class _Lingering(asyncio.Protocol):
    """A refused connection after its answer. Closing a socket that has unread input sends a
    reset, and a reset can destroy the answer before the client reads it (a client sending a
    200 KB header is still sending). So the write side is shut (the client reads the answer,
    then end of file), and what it still sends is read and dropped until it closes, or for
    LINGER seconds."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        transport.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()  # after what is buffered
        self._timer = loop.call_later(LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
