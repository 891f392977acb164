"""The composition root: builds the engine and the transports, and runs the server phases.

    startup (bind, listen, log the bound ports) -> main loop -> drain (still listening: not
    ready, new work refused with 503, calls under way finish, up to drain_timeout) -> stop
    accepting (what is left of drain_timeout for the rest) -> unload every model
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import resource
import signal
import socket

import grpc
import uvicorn

from snoozeml.api.boundary import RequestBoundary
from snoozeml.api.grpc.server import create_grpc_server
from snoozeml.api.http.fastpath import InferenceRoute
from snoozeml.api.http.protocol import HttpLimits, limited_protocol
from snoozeml.api.http.rest import create_app
from snoozeml.api.http.websocket_refusal import WebSocketRefusal
from snoozeml.api.metrics.prometheus import Metrics
from snoozeml.auth.authenticator import Authenticator
from snoozeml.config.settings import Config
from snoozeml.engine.events import EventBus
from snoozeml.engine.observe.log_lines import subscribe_logs
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.service import InferenceService
from snoozeml.heap import resume_collection
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
    """One SnoozeML process: the event bus and its subscribers, the model manager, the service
    facade, the request boundary and the listeners."""

    def __init__(self, config: Config, auth: Authenticator | None = None) -> None:
        self.config = config
        self.events = EventBus()
        subscribe_logs(self.events)
        # Metrics, the dashboard's recent events and the autoscaler subscribe here too.
        self.manager = ModelManager(config, self.events)
        self.service = InferenceService(self.manager)
        self.metrics: Metrics | None = None
        if config.server.metrics.enabled:  # subscribed before any traffic, or any preload
            self.metrics = Metrics([m.name for m in config.models], self.service.snapshot,
                                   config.server.metrics.per_model)
            self.metrics.subscribe(self.events)
        self.auth = auth or Authenticator.from_config(config.auth, os.environ)
        self.boundary = RequestBoundary(self.events, self.auth)
        server = config.server
        app = route = InferenceRoute(
            create_app(self.service, self.boundary, server.max_request_size, self.metrics,
                       server.max_embedding_inputs, server.max_rerank_documents),
            self.service,
            self.boundary, server.max_request_size,
        )
        self._http = uvicorn.Server(uvicorn.Config(
            app,
            http=limited_protocol(HttpLimits(
                max_header_size=server.max_header_size,
                max_request_line=server.max_request_line,
                max_connections=server.max_connections,
                keep_alive_timeout=server.keep_alive_timeout,
                header_timeout=server.header_timeout,
                body_timeout=server.body_timeout,
            ), route),
            lifespan="off",
            ws=WebSocketRefusal,  # no WebSocket routes: an upgrade is a 403, websockets unused
            log_config=None,
            log_level="warning",
            access_log=False,
            server_header=False,
            proxy_headers=False,
            # uvicorn annotates an int, but only ever awaits it with asyncio.wait_for.
            timeout_graceful_shutdown=server.drain_timeout,  # type: ignore[arg-type]
        ))
        self._grpc: grpc.aio.Server | None = None
        self._mesh: grpc.aio.Server | None = None
        self._forced_stop: asyncio.Future[list[None]] | None = None
        self._drain: asyncio.Task[None] | None = None
        self._grace = config.server.drain_timeout  # left for the listeners' stop
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.modelmesh_port: int | None = None
        self.started = asyncio.Event()  # set once both listeners accept (after server_started)

    def request_shutdown(self, signame: str) -> None:
        if self._drain is not None:
            # A second signal ends the drain now, as drain_timeout would: requests still queued
            # or waiting are answered 503 and calls are cancelled; only a batch already running
            # in a worker thread is waited for (onnxruntime and torch can't be interrupted).
            log_event("shutdown_forced", logging.WARNING, signal=signame)
            self._drain.cancel()
            self._grace = 0.0
            self._http.force_exit = True
            self._http.should_exit = True
            for task in list(self._http.server_state.tasks):
                task.cancel(msg="forced shutdown")
            if self._grpc is not None:
                self._forced_stop = asyncio.ensure_future(asyncio.gather(*(
                    server.stop(grace=None) for server in (self._grpc, self._mesh)
                    if server is not None)))
            return
        log_event("shutdown_requested", signal=signame,
                  drain_timeout_s=self.config.server.drain_timeout)
        self.service.start_draining()
        self._drain = asyncio.get_running_loop().create_task(self._drain_calls())

    async def _drain_calls(self) -> None:
        """The drain: the listeners stay open, so probes see "not ready" (503, NOT_SERVING)
        and new work is refused with 503 (UNAVAILABLE), while the calls under way finish, up
        to drain_timeout. Then the listeners stop, with what is left of drain_timeout for
        whatever has not finished."""
        loop = asyncio.get_running_loop()
        timeout = self.config.server.drain_timeout
        deadline = loop.time() + timeout
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.boundary.drained(), timeout)
        self._grace = max(deadline - loop.time(), 0.0)
        # uvicorn reads it when it shuts down; it annotates an int but awaits wait_for with it.
        self._http.config.timeout_graceful_shutdown = self._grace  # type: ignore[assignment]
        self._http.should_exit = True

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_shutdown, sig.name)
        sock = await self._bind()
        if sock is None:
            return 1
        await self._start(sock)
        try:
            await self._http.main_loop()
        finally:
            await self._stop(sock)
        return 0

    async def _bind(self) -> socket.socket | None:
        """Startup's first half: the HTTP socket listening, the gRPC (and ModelMesh) servers
        built and bound. None, with a bind_failed event and nothing left open, when a port
        cannot be had."""
        server = self.config.server
        try:
            sock = bind_socket(server.host, server.http_port)
        except OSError as exc:
            log_event("bind_failed", logging.ERROR, host=server.host, port=server.http_port,
                      error=exc.strerror or str(exc))
            return None
        self.http_port = sock.getsockname()[1]
        _fit_open_files(server.max_connections)
        # Listening now holds the port, so a gRPC port equal to it (or taken by anyone else) is
        # refused here with the OS's own words; grpcio only says "Failed to bind" (and prints a
        # C-core line to stderr).
        sock.listen(self._http.config.backlog)
        if server.grpc_port:
            try:
                bind_socket(server.host, server.grpc_port).close()
            except OSError as exc:
                sock.close()
                log_event("bind_failed", logging.ERROR, host=server.host, port=server.grpc_port,
                          error=exc.strerror or str(exc))
                return None
        # grpc.aio binds to the running loop when created, so it is built here.
        self._grpc = grpc_server = create_grpc_server(self.service, self.boundary, server)
        try:
            self.grpc_port = grpc_server.add_insecure_port(_grpc_address(server.host,
                                                                        server.grpc_port))
        except RuntimeError as exc:
            sock.close()
            log_event("bind_failed", logging.ERROR, host=server.host, port=server.grpc_port,
                      error=str(exc))
            return None
        if server.modelmesh_port is not None:
            try:
                self._mesh = self._modelmesh_server()
            except (OSError, RuntimeError) as exc:
                sock.close()
                await grpc_server.stop(None)
                log_event("bind_failed", logging.ERROR, host=server.modelmesh_host,
                          port=server.modelmesh_port,
                          error=getattr(exc, "strerror", None) or str(exc))
                return None
        return sock

    async def _start(self, sock: socket.socket) -> None:
        """Startup's second half: every listener accepts, server_started is logged, and the
        preloads begin."""
        assert self._grpc is not None
        server = self.config.server
        http = self._http
        http.config.load()
        http.lifespan = http.config.lifespan_class(http.config)
        await self._grpc.start()
        if self._mesh is not None:
            await self._mesh.start()
        await http.startup(sockets=[sock])
        log_event("server_started", host=server.host, http_port=self.http_port,
                  grpc_port=self.grpc_port, models=len(self.manager.models), pid=os.getpid(),
                  **({"modelmesh_port": self.modelmesh_port or 0} if self._mesh else {}))
        _warn_if_open(self.auth, server.host)
        self.started.set()
        # What the start built lives as long as the process: no collection walks it again.
        resume_collection(freeze=True)
        self.manager.start_preloads()

    async def _stop(self, sock: socket.socket) -> None:
        """Both listeners stop accepting at once, in-flight calls getting what is left of
        drain_timeout; then every model is unloaded."""
        assert self._grpc is not None
        await asyncio.gather(
            self._http.shutdown(sockets=[sock]),
            self._grpc.stop(grace=self._grace),
            *([self._mesh.stop(grace=self._grace)] if self._mesh is not None else []),
        )
        await self.manager.shutdown()
        self.service.preparation.close()
        log_event("server_stopped")

    def _modelmesh_server(self) -> grpc.aio.Server:
        """ModelMesh's model-runtime SPI on its own port, bound (OSError or RuntimeError when
        the port cannot be had). Its modules are imported here: without `modelmesh_port`
        they cost nothing."""
        from snoozeml.api.grpc.modelmesh import create_modelmesh_server
        from snoozeml.engine.added.modelmesh import MeshRuntime

        server = self.config.server
        port = server.modelmesh_port or 0
        bind_socket(server.modelmesh_host, port).close()  # the OS's words
        runtime = MeshRuntime(self.manager, self.service.added, self.started)
        mesh = create_modelmesh_server(self.service, runtime, self.boundary, server)
        self.modelmesh_port = mesh.add_insecure_port(
            _grpc_address(server.modelmesh_host, port))
        return mesh


# Descriptors besides the HTTP connections: gRPC's, model files, the loop's own.
_OTHER_FILES = 256


def _fit_open_files(max_connections: int) -> None:
    """Raise the soft limit on open files towards the hard one, so that max_connections is
    reached before the process runs out of descriptors (which would fail accepts, gRPC and
    model loads alike); say so when the hard limit is too low for it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + _OTHER_FILES
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError):
        pass
    if soft < wanted:
        log_event("open_files_low", logging.WARNING, limit=soft, max_connections=max_connections,
                  detail=f"max_connections needs about {wanted} open files; raise the limit "
                  "(ulimit -n, LimitNOFILE=) or lower max_connections")


def _warn_if_open(auth: Authenticator, host: str) -> None:
    """Auth off is a choice to make knowingly: said at every start, louder off loopback."""
    if auth.enabled:
        return
    if _loopback(host):
        log_event("auth_disabled", logging.WARNING, host=host,
                  detail="every operation is open to anyone who can reach this address; "
                  "add an [auth] table to require API keys or JWTs")
    else:
        log_event("auth_disabled", logging.ERROR, host=host,
                  detail="listening beyond loopback WITHOUT authentication: anyone on the "
                  "network can run, load and unload models; add an [auth] table")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
