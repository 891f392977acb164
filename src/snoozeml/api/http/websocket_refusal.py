"""What a WebSocket upgrade gets: 403 Forbidden, no body, and the connection closed.

No route takes a WebSocket. uvicorn is given this protocol in place of a WebSocket library's
(`uvicorn.Config(ws=WebSocketRefusal)`): it hands an upgrade request over to it, as to any
WebSocket protocol, and the upgrade is refused there, before any app sees it. The websockets
package is never imported (it was, at every start, for uvicorn's `ws="auto"`). A valid
handshake gets the answer it got when the websockets protocol ran it and the router refused the
WebSocket: 403, `connection: close`, an empty text body; a malformed one gets it too (it got
websockets' 400 before).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn import Config

from snoozeml.api.http.uvicorn_private import STATUS_LINE, ServerState

_REFUSAL = (b"connection: close\r\ncontent-length: 0\r\n"
            b"content-type: text/plain; charset=utf-8\r\n\r\n")


class WebSocketRefusal(asyncio.Protocol):
    """Takes over a connection whose request asked to upgrade to a WebSocket: answers 403 to
    the request (its head is the first data) and closes. Built by uvicorn's HTTP protocol, as
    it builds any WebSocket protocol."""

    def __init__(self, config: Config, server_state: ServerState,
                 app_state: dict[str, Any]) -> None:
        self._default_headers = server_state.default_headers  # the date
        self._transport: asyncio.Transport | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not a subclass of asyncio.Transport).
        self._transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # what the client sends after the request: dropped
        self._refused = True
        # After what the loop has already been given: a request pipelined before this one on
        # the connection has had its app task started, and a quick answer to it goes out first.
        asyncio.get_running_loop().call_soon(self._refuse)

    def _refuse(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        head = [STATUS_LINE[403]]
        for name, value in self._default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(_REFUSAL)
        transport.write(b"".join(head))
        transport.close()
