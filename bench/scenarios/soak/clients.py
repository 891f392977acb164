"""What the soak test's client threads share: the tally of what they saw, the gate that opens
and closes the traffic around each quiet point, and one thread's connections."""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc
import httpx
from harness.daemon import Daemon
from harness.oip import grpc_stub

GOOD_TIMEOUT_S = 60.0
EXAMPLES = 5  # first examples kept per problem
PROBLEMS = ("wrong", "failed", "unexpected", "soak_error")


class Tally:
    """Counts by kind and problem, and the first examples of each problem (thread-safe)."""

    def __init__(self, start: float) -> None:
        self._lock = threading.Lock()
        self._start = start
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {problem: [] for problem in PROBLEMS}

    def count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def problem(self, problem: str, detail: str) -> None:
        with self._lock:
            self.counts[problem] += 1
            if len(self.examples[problem]) < EXAMPLES:
                elapsed = time.monotonic() - self._start
                self.examples[problem].append(f"t={elapsed:.1f}s {detail}")

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)



class Gate:
    """Open while a cycle's traffic runs. Every client thread enters before it opens its
    connections and leaves after closing them, so `close_and_wait` returning True means no
    client of this script holds a connection to the daemon."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = False
        self._stopped = False
        self._inside = 0

    def enter(self) -> bool:
        """Wait for the gate to open; False once stopped."""
        with self._cond:
            self._cond.wait_for(lambda: self._open or self._stopped)
            if self._stopped:
                return False
            self._inside += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._inside -= 1
            self._cond.notify_all()

    @property
    def is_open(self) -> bool:
        return self._open

    def pause(self, seconds: float) -> bool:
        """Sleep up to `seconds` while open; whether it is still open."""
        with self._cond:
            self._cond.wait_for(lambda: not self._open, seconds)
            return self._open

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def close_and_wait(self, timeout_s: float) -> bool:
        with self._cond:
            self._open = False
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._inside == 0, timeout_s)

    def stop(self) -> None:
        with self._cond:
            self._open = False
            self._stopped = True
            self._cond.notify_all()


class Clients:
    """One thread's connections: an httpx client and a gRPC channel, both closed at each
    quiet point."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.http = httpx.Client(base_url=daemon.base_url, timeout=GOOD_TIMEOUT_S)
        self.channel = grpc.insecure_channel(daemon.grpc_target)
        self.grpc = grpc_stub(self.channel)

    def close(self) -> None:
        self.http.close()
        self.channel.close()

