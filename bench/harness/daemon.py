"""The daemon under test: ``python -m snoozeml serve`` as a child process on ephemeral ports.

Its ports come from its ``server_started`` log line; every log line can also go to a callback
(scenarios that count log events). :func:`serving` starts one, waits until it is ready (and its
preloaded models loaded), and always stops it, printing its log's tail when something failed.
"""

from __future__ import annotations

import collections
import contextlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import httpx

from harness.status import wait_loaded, wait_ready

STARTED = re.compile(r"\bserver_started\b.*?\bhttp_port=(\d+)(?:.*?\bgrpc_port=(\d+))?")


class Daemon:
    """``python -m snoozeml serve`` as a child process, and an httpx client to it."""

    def __init__(
        self,
        python: str,
        config: Path,
        start_timeout_s: float = 60.0,
        on_line: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
        client_timeout_s: float = 60.0,
    ) -> None:
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._on_line = on_line  # called with every log line, on the reader thread
        self._started = threading.Event()
        self.http_port = 0
        self.grpc_port = 0
        cmd = [python, "-m", "snoozeml", "serve", "-c", str(config)]
        cmd += ["--http-port", "0", "--grpc-port", "0"]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # the started line is on stderr; read both in one pipe
            text=True,
            bufsize=1,
            env=env,
        )
        assert self.proc.stdout is not None
        # The reader also keeps draining the pipe, so a chatty daemon never blocks on it.
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._started.wait(0.1):
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"no server_started line in {start_timeout_s}s:\n{self.tail()}")
        self.client = httpx.Client(base_url=self.base_url, timeout=client_timeout_s)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def infer_url(self, model: str) -> str:
        return f"{self.base_url}/v2/models/{model}/infer"

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.log.append(line.rstrip("\n"))
            if self._on_line is not None:
                self._on_line(line.rstrip("\n"))
            if not self._started.is_set() and (match := STARTED.search(line)):
                self.http_port = int(match.group(1))
                self.grpc_port = int(match.group(2) or 0)
                self._started.set()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(list(self.log)[-lines:])

    def stop(self, timeout_s: float = 20.0) -> int:
        """Graceful stop (SIGTERM, then SIGKILL after ``timeout_s``); returns the exit code."""
        if hasattr(self, "client"):
            self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                print("daemon ignored SIGTERM; killing it", file=sys.stderr)
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode

    def stop_and_warn(self) -> None:
        """Stop; print the log tail to stderr if the exit was not a clean SIGTERM exit."""
        code = self.stop()
        if code not in (0, -signal.SIGTERM):
            print(f"warning: daemon exited with {code}:\n{self.tail()}", file=sys.stderr)


def free_port() -> int:
    """A free loopback port, for a server started beside the daemon (which picks its own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(
    python: str,
    config: Path,
    models: Sequence[str] = (),
    *,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    timeout_s: float = 60.0,
) -> Iterator[Daemon]:
    """A started daemon, ready, with ``models`` (its preloaded ones) loaded, so that no load
    falls inside a timing; stopped on the way out, its log's tail printed on an error."""
    daemon = Daemon(python, config, on_line=on_line, env=env, client_timeout_s=timeout_s)
    try:
        print(f"daemon up: http={daemon.http_port} grpc={daemon.grpc_port} pid={daemon.pid}",
              file=sys.stderr)
        wait_ready(daemon.client)
        for name in models:
            wait_loaded(daemon.client, name, timeout_s)
        yield daemon
    except BaseException:
        print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
        raise
    finally:
        daemon.stop_and_warn()
