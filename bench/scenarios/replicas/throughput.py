"""One replica against two: the four entries in alternating rounds, and the in-process
ceiling with one and with two onnxruntime sessions."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from harness.cli import Bench
from harness.cpu import CpuWindow, machine_busy_s, own_cpu_s
from harness.daemon import Daemon
from harness.load import run_wrk
from harness.oip import new_session
from harness.rounds import alternate
from harness.status import model_status, wait_idle
from harness.timing import time_calls

from scenarios.replicas.entries import (
    ENTRIES,
    Entry,
    Load,
    check_binary,
    ready_replicas,
    replica_requests,
    throughput_config,
)


@dataclass(frozen=True)
class Run:
    """One measured wrk run against one entry."""

    round: int
    entry: str
    wrk: dict[str, Any]
    replicas_before: int  # ready replicas when the run started and when it ended
    replicas_after: int
    replica_requests: dict[int, int]  # requests each replica served during the run
    # CPU seconds per wall second of the run: the daemon (all threads), wrk, and everything
    # else on the machine (busy CPU time less those two).
    daemon_cores: float
    wrk_cores: float
    other_cores: float
    # Of the daemon's: its main thread (the event loop: HTTP, codecs, scheduling) and its
    # busiest other thread (a replica's worker, where onnxruntime runs).
    loop_cores: float = 0.0
    busiest_worker_cores: float = 0.0

    @property
    def per_s(self) -> float:
        return float(self.wrk["requests_per_s"])

    @property
    def daemon_ms_per_request(self) -> float:
        return self.daemon_cores * float(self.wrk["duration_s"]) * 1e3 / max(
            1, int(self.wrk["requests"]))


@dataclass(frozen=True)
class Ceiling:
    """In-process onnxruntime on the request's input: ``sessions`` sessions of one intra-op
    thread, each called back to back from its own Python thread."""

    sessions: int
    per_s: list[float]
    other_cores: list[float]  # busy CPU of everything but this process, per wall second
    p50_ms: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.per_s)


def wrk(daemon: Daemon, name: str, load: Load, args: argparse.Namespace,
        seconds: float) -> dict[str, Any]:
    return run_wrk(daemon.infer_url(name), load.body_file, args.wrk_threads,
                   args.concurrency[0], seconds, load.header_length)


def wait_replicas(daemon: Daemon, name: str, load: Load, args: argparse.Namespace) -> int:
    """Keep wrk load on ``name`` (1 s bursts) until it has two ready replicas or
    ``--scale-timeout`` passes; returns the ready count."""
    deadline = time.monotonic() + args.scale_timeout
    while (ready := ready_replicas(model_status(daemon.client, name))) < 2:
        if time.monotonic() > deadline:
            print(f"warning: {name} has {ready} ready replica(s) after {args.scale_timeout:g} s "
                  "of load; timing it anyway", file=sys.stderr)
            return ready
        wrk(daemon, name, load, args, 1.0)
    return ready


def measure(daemon: Daemon, entry: Entry, round_no: int, load: Load,
            args: argparse.Namespace) -> Run:
    wrk(daemon, entry.name, load, args, args.warm_up)
    if entry.max_replicas > 1:
        wait_replicas(daemon, entry.name, load, args)
    before = wait_idle(daemon.client, entry.name)
    with CpuWindow(daemon.pid) as cpu:
        result = wrk(daemon, entry.name, load, args, args.duration)
    after = wait_idle(daemon.client, entry.name)
    served_before = replica_requests(before)
    served = {i: n - served_before.get(i, 0) for i, n in replica_requests(after).items()}
    other = max(0.0, cpu.machine_s - cpu.process_s - cpu.children_s)
    run = Run(round_no, entry.name, result, ready_replicas(before), ready_replicas(after),
              served, cpu.cores(cpu.process_s), cpu.cores(cpu.children_s), cpu.cores(other),
              cpu.cores(cpu.loop_s), cpu.cores(cpu.busiest_other_s))
    print(f"round {round_no} {entry.name}: {json.dumps(result)} replicas="
          f"{run.replicas_before}->{run.replicas_after} per-replica={served} cores: "
          f"daemon={run.daemon_cores:.2f} (loop {run.loop_cores:.2f}, busiest other thread "
          f"{run.busiest_worker_cores:.2f}) wrk={run.wrk_cores:.2f} other={run.other_cores:.2f}",
          file=sys.stderr, flush=True)
    return run


def throughput(bench: Bench, load: Load) -> list[Run]:
    args = bench.args
    runs: list[Run] = []
    config = throughput_config(bench.workdir, args)
    with bench.serve(config, [e.name for e in ENTRIES]) as daemon:
        for entry in ENTRIES:
            check_binary(daemon, entry.name, load)
            status = model_status(daemon.client, entry.name)
            if status["scaling"]["max"] != entry.max_replicas:
                raise RuntimeError(f"{entry.name}: scaling {status['scaling']} is not "
                                   f"max = {entry.max_replicas}")
            if bool(status["batching"]["enabled"]) != entry.batching:
                raise RuntimeError(f"{entry.name}: batching {status['batching']} is not "
                                   "as configured")
        for round_no in range(1, args.rounds + 1):
            for entry in alternate(ENTRIES, round_no - 1):
                runs.append(measure(daemon, entry, round_no, load, args))
            for entry in ENTRIES:  # still right after the load
                check_binary(daemon, entry.name, load)
    return runs


def parallel_calls(sessions: Sequence[ort.InferenceSession], feeds: dict[str, np.ndarray],
                   duration_s: float) -> float:
    """Calls per second of all ``sessions`` together, each run back to back on its own
    Python thread (onnxruntime releases the GIL while it runs)."""
    counts = [0] * len(sessions)
    start = threading.Barrier(len(sessions) + 1)
    stop_at = [0.0]

    def loop(index: int) -> None:
        start.wait()
        calls = 0
        while time.perf_counter() < stop_at[0]:
            sessions[index].run(None, feeds)
            calls += 1
        counts[index] = calls

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(sessions))]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    stop_at[0] = began + duration_s
    start.wait()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - began)


def ceilings(path: Path, model_input: np.ndarray, args: argparse.Namespace) -> list[Ceiling]:
    """One session and two sessions, alternately, ``--rounds`` times each."""
    feeds = {"x": model_input}
    sessions = [new_session(path), new_session(path)]
    parallel_calls(sessions, feeds, 0.5)  # warm-up
    seconds = min(args.duration, 5.0)
    one: list[float] = []
    two: list[float] = []
    other: tuple[list[float], list[float]] = ([], [])
    p50: list[float] = []

    def other_cores(mark: tuple[float, float, float]) -> float:
        busy = machine_busy_s() - mark[0] - (own_cpu_s() - mark[1])
        return max(0.0, busy) / (time.monotonic() - mark[2])

    for _ in range(args.rounds):
        mark = (machine_busy_s(), own_cpu_s(), time.monotonic())
        single = time_calls(lambda: sessions[0].run(None, feeds), seconds)
        other[0].append(other_cores(mark))
        one.append(single.per_s)
        p50.append(single.p50_ms)
        mark = (machine_busy_s(), own_cpu_s(), time.monotonic())
        two.append(parallel_calls(sessions, feeds, seconds))
        other[1].append(other_cores(mark))
    return [Ceiling(1, one, other[0], statistics.median(p50)), Ceiling(2, two, other[1])]
