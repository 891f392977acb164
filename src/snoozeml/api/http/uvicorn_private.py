"""Every touch of uvicorn's insides, in one place, and the check that they are all still there.

The daemon's HTTP protocol (protocol.py) subclasses uvicorn's `HttpToolsProtocol`: it
overrides methods uvicorn calls by name (`_start_asgi_task`, `timeout_keep_alive_handler`)
and reads the per-connection state uvicorn keeps (`cycle`, `pipeline`, `url`, `flow`...). Its
`InferExchange` (exchange.py) stands in a `RequestResponseCycle`'s place and writes uvicorn's
status lines; server.py drives `uvicorn.Server`'s phases itself. None of that is uvicorn's
public API, so it can change in any release: pyproject.toml allows only `SUPPORTED`, the
versions checked to have every name in `REQUIRED`, and `snooze serve` refuses to start on a
uvicorn that lacks one (`unsupported_uvicorn`), naming it. The other modules import uvicorn's
non-public modules only through this one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import uvicorn

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application as ASGI3Application

try:
    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import (
        STATUS_LINE,
        HttpToolsProtocol,
        RequestResponseCycle,
    )
    from uvicorn.server import ServerState
except ImportError as exc:  # a module or class moved: reported by unsupported_uvicorn()
    _moved: str | None = str(exc)
else:
    _moved = None

__all__ = ["STATUS_LINE", "SUPPORTED", "ASGI3Application", "FlowControl", "HttpToolsProtocol",
           "RequestResponseCycle", "ServerState", "missing", "unsupported_uvicorn"]

# The versions that have every name below, as pyproject.toml declares them (a test holds the
# two equal). 0.45 is the first with `_start_asgi_task`; 0.55 the newest the tests ran on.
SUPPORTED = ">=0.45,<0.56"

# What the daemon overrides, calls, reads or writes on uvicorn's objects (on an instance:
# methods and the attributes uvicorn sets in __init__ or at a request's first byte).
REQUIRED: dict[str, tuple[str, ...]] = {
    # protocol.py's LimitedHttpProtocol: the methods it overrides (uvicorn calls the private
    # ones by name), the ones it calls, and uvicorn's per-server and per-connection state.
    "HttpToolsProtocol": (
        "connection_made", "connection_lost", "data_received", "on_message_begin", "on_url",
        "on_headers_complete", "on_body", "on_message_complete", "_start_asgi_task",
        "timeout_keep_alive_handler", "on_response_complete", "send_400_response",
        "_should_upgrade", "handle_websocket_upgrade", "_unsupported_upgrade_warning",
        "_unset_keepalive_if_required", "timeout_keep_alive", "timeout_keep_alive_task",
        "connections", "tasks", "server_state", "loop", "app", "root_path",
        "limit_concurrency", "logger", "parser", "transport", "flow", "client", "pipeline",
        "cycle", "url", "headers", "expect_100_continue",
    ),
    # Read on uvicorn's cycles by the protocol's refusals; mirrored by InferExchange, which
    # uvicorn's own protocol code reads in a cycle's place.
    "RequestResponseCycle": (
        "response_started", "response_complete", "disconnected", "keep_alive", "message_event",
    ),
    "FlowControl": ("pause_reading", "resume_reading", "read_paused", "write_paused", "drain"),
    "ServerState": ("default_headers", "connections", "tasks"),
    # server.py runs the phases itself, on its own socket, and cuts the drain short.
    "Server": ("startup", "main_loop", "shutdown", "config", "server_state", "should_exit",
               "force_exit"),
    "Config": ("load", "lifespan_class", "backlog", "timeout_graceful_shutdown"),
}


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    """The app of the throwaway objects `installed` builds; never called."""


def installed() -> dict[str, object]:
    """One real object of each class in REQUIRED, built as the daemon builds them (a protocol
    as at a request's first byte, when `url` and `headers` exist). Raises TypeError when a
    constructor no longer takes what the daemon passes."""
    # ws: not "auto", which imports the websockets package (the daemon gives its own protocol).
    config = uvicorn.Config(_no_app, lifespan="off", ws="none", log_config=None)
    server_state = ServerState()
    loop = asyncio.new_event_loop()
    try:
        protocol = HttpToolsProtocol(config, server_state, {}, loop)
        protocol.on_message_begin()
    finally:
        loop.close()
    transport = asyncio.Transport()
    flow = FlowControl(transport)
    cycle = RequestResponseCycle(
        scope=protocol.scope, transport=transport, flow=flow, logger=logging.getLogger(__name__),
        access_logger=logging.getLogger(__name__), access_log=False, default_headers=[],
        message_event=asyncio.Event(), expect_100_continue=False, keep_alive=True,
        on_response=lambda: None)
    return {"HttpToolsProtocol": protocol, "RequestResponseCycle": cycle, "FlowControl": flow,
            "ServerState": server_state, "Server": uvicorn.Server(config), "Config": config}


def missing_from(subjects: Mapping[str, object],
                 required: Mapping[str, tuple[str, ...]] = REQUIRED) -> list[str]:
    """Each required name a subject lacks, as `Class.name`, in the table's order."""
    return [f"{cls}.{name}" for cls, names in required.items() for name in names
            if not hasattr(subjects[cls], name)]


def missing() -> list[str]:
    """What the installed uvicorn lacks of what the daemon uses: `Class.name` for each
    missing name, or the import or the constructor that failed; empty when nothing is."""
    if _moved is not None:
        return [_moved]
    try:
        subjects = installed()
    except TypeError as exc:
        return [f"a constructor the daemon calls ({exc})"]
    return missing_from(subjects)


def unsupported_uvicorn() -> str | None:
    """The reason the daemon must not start on the installed uvicorn, or None."""
    lacking = missing()
    if not lacking:
        return None
    return (f"uvicorn {uvicorn.__version__} lacks {', '.join(lacking)}, which the HTTP protocol "
            f"builds on; SnoozeML supports uvicorn {SUPPORTED} "
            f"(pip install 'uvicorn[standard]{SUPPORTED}')")
