"""The composition root: builds the engine and the transports, and runs the server phases.

    startup (bind, listen, log the bound ports) -> main loop -> graceful shutdown
    (stop accepting, drain in-flight requests up to drain_timeout, unload every model)
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

import uvicorn

from snoozeml.api.fastpath import InferenceRoute
from snoozeml.api.rest import create_app
from snoozeml.config import Config
from snoozeml.engine.manager import InferenceService, ModelManager
from snoozeml.logs import log_event


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket; port 0 picks a free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class Daemon:
    """One SnoozeML process: the model manager, the service facade and the listeners."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.manager = ModelManager(config)
        self.service = InferenceService(self.manager)
        server = config.server
        app = InferenceRoute(
            create_app(self.service, server.max_request_size), self.service,
            server.max_request_size,
        )
        self._http = uvicorn.Server(uvicorn.Config(
            app,
            http="httptools",
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            server_header=False,
            proxy_headers=False,
            timeout_graceful_shutdown=max(int(server.drain_timeout), 1),
        ))
        self.http_port: int | None = None

    def request_shutdown(self, signame: str) -> None:
        if self._http.should_exit:
            log_event("shutdown_forced", logging.WARNING, signal=signame)
            self._http.force_exit = True
            return
        log_event("shutdown_requested", signal=signame,
                  drain_timeout_s=self.config.server.drain_timeout)
        self.service.draining = True
        self._http.should_exit = True

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_shutdown, sig.name)
        server = self.config.server
        try:
            sock = bind_socket(server.host, server.http_port)
        except OSError as exc:
            log_event("bind_failed", logging.ERROR, host=server.host, port=server.http_port,
                      error=exc.strerror or str(exc))
            return 1
        self.http_port = sock.getsockname()[1]
        http = self._http
        http.config.load()
        http.lifespan = http.config.lifespan_class(http.config)
        await http.startup(sockets=[sock])
        log_event("server_started", host=server.host, http_port=self.http_port,
                  models=len(self.manager.models), pid=_pid())
        if server.grpc_port is not None:
            log_event("grpc_unavailable", logging.WARNING,
                      detail="the gRPC listener is not part of this build; serving HTTP only")
        self.manager.start_preloads()
        try:
            await http.main_loop()
        finally:
            await http.shutdown(sockets=[sock])
            await self.manager.shutdown()
            log_event("server_stopped")
        return 0


def _pid() -> int:
    import os

    return os.getpid()
