"""What the soak test reads from the daemon: its log (events counted, ERROR records kept), its
RSS, fds, threads and asyncio tasks, sampled in the background and read at each quiet point,
once the traffic has stopped and every non-pinned model is unloaded."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from harness import logs
from harness.daemon import Daemon

from scenarios.soak.clients import EXAMPLES, GOOD_TIMEOUT_S, Gate, Tally
from scenarios.soak.served import ServedModel

PARK_TIMEOUT_S = 90.0  # clients finishing their last request at a quiet point
QUIET_TIMEOUT_S = 60.0  # models unloaded and nothing in flight
SETTLE_READS = 3
SETTLE_INTERVAL_S = 0.25
SETTLE_TIMEOUT_S = 10.0
REASON = re.compile(r"\breason=(\S+)")
STATUS = re.compile(r"\bstatus=(\d+)")
RECORD_LINES = 30  # lines kept of one ERROR record (its traceback)
# ERROR records that are not the daemon's fault, with why: counted and shown, never failed on.
# Harmless ERROR lines, reported rather than failed on (none now: grpcio's "ExecuteBatchError"
# after a client's cancel is a debug event of the daemon's own, logs.py).
KNOWN_ERRORS: dict[str, tuple[re.Pattern[str], str]] = {}


class LogWatch:
    """The daemon's log: events counted (unloads by reason, failures by status), and every
    ERROR record (the line and the traceback under it) kept, apart from the known ones. Runs
    on the reader thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.errors: list[list[str]] = []  # the first unknown ERROR records, with tracebacks
        self.known: dict[str, list[str]] = {}  # the first record of each known kind
        self.other: list[str] = []  # lines outside the log format, and not in a record
        self._record: list[str] | None = None  # the ERROR record still taking lines

    def on_line(self, line: str) -> None:
        match = logs.parse(line)
        with self._lock:
            if match is None:
                if self._record is not None:
                    if len(self._record) < RECORD_LINES:
                        self._record.append(line)
                elif "Traceback" in line:  # a traceback printed without a log line
                    self.counts["tracebacks"] += 1
                    self._record = [line]
                    if len(self.errors) < EXAMPLES:
                        self.errors.append(self._record)
                elif line.strip() and len(self.other) < RECORD_LINES:
                    self.other.append(line)
                return
            self._record = None
            event, rest = match.event, match.rest
            self.counts[event] += 1
            if event == "model_unloaded" and (reason := REASON.search(rest)):
                self.counts[f"unloaded:{reason.group(1)}"] += 1
            if event == "request_failed" and (status := STATUS.search(rest)):
                self.counts[f"request_failed:{status.group(1)}"] += 1
            if match.level not in ("ERROR", "CRITICAL"):
                return
            self._record = [line]
            known = next((k for k, (pattern, _) in KNOWN_ERRORS.items() if pattern.search(line)),
                         None)
            if known is not None:
                self.counts[f"known:{known}"] += 1
                self.known.setdefault(known, self._record)
            else:
                self.counts["error_lines"] += 1
                if len(self.errors) < EXAMPLES:
                    self.errors.append(self._record)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)



@dataclass
class Reading:
    t: float  # seconds since the start of the traffic
    rss_bytes: int
    open_fds: int
    threads: int
    asyncio_tasks: int
    soak_fds: int
    soak_threads: int


class Probe:
    """The daemon's RSS, fds and threads from outside (psutil), its asyncio tasks from
    `/admin/status`, and this script's own fds and threads. A quiet point holds `lock` from
    start to end, so the sampler never reads meanwhile; the sampler's requests each close
    their connection, so at a quiet point the daemon holds exactly one of this script's
    connections: `client`'s, which the quiet point keeps busy."""

    def __init__(self, daemon: Daemon, start: float, folder: str = "") -> None:
        self._ports = (daemon.http_port, daemon.grpc_port)
        self._folder = folder
        self.lock = threading.Lock()
        self._daemon = psutil.Process(daemon.pid)
        self._self = psutil.Process()
        self._start = start
        self.client = httpx.Client(base_url=daemon.base_url, timeout=GOOD_TIMEOUT_S)
        self._background = httpx.Client(base_url=daemon.base_url, timeout=GOOD_TIMEOUT_S,
                                        headers={"Connection": "close"})

    def close(self) -> None:
        self.client.close()
        self._background.close()

    def status(self, background: bool = False) -> dict[str, Any]:
        client = self._background if background else self.client
        response = client.get("/admin/status")
        response.raise_for_status()
        doc: dict[str, Any] = response.json()
        return doc

    def daemon_alive(self) -> bool:
        try:
            return self._daemon.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def inventory(self) -> dict[str, dict[str, int]]:
        """The daemon's fds by kind (TCP by port and state, unix, pipe, file…) and threads by
        name: what a count that grew is made of."""
        pid = self._daemon.pid
        sockets = {c.fd: c for c in self._daemon.net_connections(kind="all")}
        fds: Counter[str] = Counter()
        for entry in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError, ValueError):
                fds[self._fd_kind(int(entry.name), os.readlink(entry), sockets)] += 1
        threads: Counter[str] = Counter()
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                threads[(task / "comm").read_text().strip()] += 1
        return {"fds": dict(fds), "threads": dict(threads)}

    def _fd_kind(self, fd: int, target: str, sockets: dict[int, Any]) -> str:
        conn = sockets.get(fd)
        if conn is None:
            kind = re.sub(r"\[\d+\]$", "", target)  # pipe:[123] -> pipe:
            return kind.replace(self._folder, "<tmp>") if self._folder else kind
        if conn.family == socket.AF_UNIX:
            return "unix socket"
        port = conn.laddr.port if conn.laddr else 0
        side = {self._ports[0]: "http", self._ports[1]: "grpc"}.get(port, "other")
        return f"tcp {side} {conn.status}"

    def read(self, background: bool = False) -> Reading:
        tasks = self.status(background)["process"]["asyncio_tasks"]
        with self._daemon.oneshot():
            rss = int(self._daemon.memory_info().rss)
            fds, threads = self._daemon.num_fds(), self._daemon.num_threads()
        return Reading(round(time.monotonic() - self._start, 2), rss, fds, threads, int(tasks),
                       self._self.num_fds(), self._self.num_threads())


class Sampler(threading.Thread):
    def __init__(self, probe: Probe, interval_s: float, on_death: Callable[[], None]) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self._probe = probe
        self._interval_s = interval_s
        self._on_death = on_death
        self._stop_event = threading.Event()
        self.readings: list[Reading] = []

    def run(self) -> None:
        while not self._stop_event.wait(self._interval_s):
            try:
                with self._probe.lock:
                    self.readings.append(self._probe.read(background=True))
            except (psutil.Error, httpx.HTTPError, KeyError):
                if not self._probe.daemon_alive():
                    self._on_death()
                    return

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


@dataclass
class Cycle:
    index: int
    start: float
    traffic_s: float
    quiet: Reading
    settled: bool
    settle_s: float
    counts: dict[str, int]  # cumulative: this script's tallies and the daemon's log events
    held: dict[str, dict[str, int]]  # the daemon's fds by kind and threads by name


class SoakAbort(RuntimeError):
    pass


def quiet_point(probe: Probe, gate: Gate, models: Sequence[ServedModel],
                tally: Tally) -> tuple[Reading, bool, float, dict[str, dict[str, int]]]:
    """Stop the traffic, unload every non-pinned model, wait for calm, read the counts."""
    with probe.lock:
        return _quiet_point(probe, gate, models, tally)


def _quiet_point(probe: Probe, gate: Gate, models: Sequence[ServedModel],
                 tally: Tally) -> tuple[Reading, bool, float, dict[str, dict[str, int]]]:
    if not gate.close_and_wait(PARK_TIMEOUT_S):
        raise SoakAbort(f"clients still busy {PARK_TIMEOUT_S:g}s after the traffic stopped")
    for model in models:
        if not model.pinned:
            response = probe.client.post(f"/v2/repository/models/{model.name}/unload")
            if response.status_code != 200:
                tally.problem("failed", f"quiet unload {model.name}: {response.status_code} "
                              f"{response.text[:200]}")
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    while True:
        doc = probe.status()
        busy = [m["name"] for m in doc["models"] if m["in_flight"] or m["queued"]
                or (m["state"] != ("READY" if m["pinned"] else "UNLOADED"))]
        reserved = sum(d["reserved_bytes"] for d in doc["devices"])
        if not busy and not reserved:
            break
        if time.monotonic() > deadline:
            raise SoakAbort(f"no calm {QUIET_TIMEOUT_S:g}s after the traffic stopped: "
                            f"busy {busy}, reserved {reserved} bytes")
        time.sleep(0.1)
    began = time.monotonic()
    readings = [probe.read()]
    while time.monotonic() - began < SETTLE_TIMEOUT_S:
        last = readings[-SETTLE_READS:]
        if len(last) == SETTLE_READS and len({_counts(r) for r in last}) == 1:
            return readings[-1], True, time.monotonic() - began, probe.inventory()
        time.sleep(SETTLE_INTERVAL_S)
        readings.append(probe.read())
    # Never the same three times: the lowest counts seen (what a leak can't go below).
    floor = min(readings, key=_counts)
    return floor, False, time.monotonic() - began, probe.inventory()


def _counts(reading: Reading) -> tuple[int, int, int]:
    return reading.open_fds, reading.threads, reading.asyncio_tasks


@dataclass
class Run:
    cycles: list[Cycle]
    samples: list[Reading]
    warm_up_s: float
    tally: Tally
    log: LogWatch
    exit_code: int | None
    aborted: str | None
    models: list[ServedModel]
    budget: str
    elapsed_s: float
    final_models: list[dict[str, Any]]  # name, measured_bytes, loads at the last quiet point
