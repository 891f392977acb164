"""A real `snooze serve` process on ephemeral ports, for tests.

The daemon logs `server_started ... http_port=N grpc_port=M`; a reader thread collects every log
line and wakes waiters, so tests wait on events the daemon reports, never on sleeps.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil


class DaemonError(RuntimeError):
    pass


class Daemon:
    def __init__(
        self,
        config: Path,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        wrap: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.args = list(args)
        self.wrap = list(wrap)  # a command the daemon runs under (setpriv ...)
        self.env = {**os.environ, **(env or {})}
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._proc: subprocess.Popen[str] | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.modelmesh_port: int | None = None
        self._reader_done = False

    # --- process --------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> Daemon:
        cmd = [*self.wrap, sys.executable, "-m", "snoozeml", "serve", "-c", str(self.config),
               "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", *self.args]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env
        )
        threading.Thread(target=self._read, daemon=True).start()
        line = self.wait_for_log(r"server_started", timeout=timeout)
        match = re.search(r"http_port=(\d+)", line)
        assert match, line
        self.http_port = int(match.group(1))
        match = re.search(r"grpc_port=(\d+)", line)
        assert match, line
        self.grpc_port = int(match.group(1))
        match = re.search(r"modelmesh_port=(\d+)", line)
        self.modelmesh_port = int(match.group(1)) if match else None
        return self

    def _read(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._reader_done = True
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self._proc is not None
        self._proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        assert self._proc is not None
        return self._proc.wait(timeout)

    def stop(self, timeout: float = 60.0) -> int | None:
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

    # --- logs -----------------------------------------------------------------------------

    def wait_for_log(self, pattern: str, timeout: float = 30.0, start: int = 0) -> str:
        """The first log line (from index `start`) matching `pattern`, waiting for it."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            checked = start
            while True:
                for line in self.lines[checked:]:
                    if regex.search(line):
                        return line
                checked = max(checked, len(self.lines))
                if self._reader_done:
                    raise DaemonError(f"daemon exited before {pattern!r}:\n" + self.log())
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DaemonError(f"no log line matched {pattern!r}:\n" + self.log())
                self._cond.wait(min(remaining, 0.5))

    def log(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def mark(self) -> int:
        """An index into the log; pass it as `start` to wait only for later lines."""
        with self._cond:
            return len(self.lines)


def write_config(directory: Path, body: str) -> Path:
    path = directory / "models.toml"
    path.write_text(body)
    return path


def free_ports(count: int = 1) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nothing listens on now (held together
    while chosen, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
