"""Replica autoscaling benchmark for the SnoozeML daemon.

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_replicas.py [--duration 10] [--rounds 3] [--out results.md]

The model: an MLP 64 -> 1024 -> 1024 -> 64 (FP32, ReLU, about 4.7 MB of weights), 64 rows per
request (``--rows``), so one request is a compute-bound GEMM of about 1 ms in a one-thread
onnxruntime session, with a 16 KiB input. The script measures that cost in-process first and
prints it.

1. Throughput. One daemon serves the same file as four model entries, each preloaded, pinned
   (``idle_timeout = "never"``) and ``intra_op_threads = 1``:

     ``max1-nobatch``  replicas.max = 1, batching off (max_batch_size = 0)
     ``max2-nobatch``  replicas.max = 2, batching off
     ``max1-batch``    replicas.max = 1, batching on (max_batch_size = 4 requests' rows, 2 ms)
     ``max2-batch``    replicas.max = 2, batching on

   The ``max = 2`` entries scale up under load (target_queue 2, scale_up_after 500ms) and keep
   their second replica (scale_down_after 1h). wrk sends one binary-extension body over 32
   connections, measured alternately: rounds of the four entries, the order reversed every
   other round, each a wrk warm-up then ``--duration`` seconds; a ``max = 2`` entry is timed
   only once ``/admin/status`` shows two ready replicas. After each run one answer is checked
   against onnxruntime in-process. The report gives the median requests/s per entry, the
   max2/max1 ratios (of the medians, and the median of the per-round pairs), and the
   in-process ceiling with one session and with two sessions on two Python threads.
2. Timeline. A second daemon serves the file as ``burst`` (max = 2, target_queue 2,
   scale_up_after 500ms, scale_down_after 3s, idle_timeout 5s, not preloaded). While
   ``/admin/status`` is sampled every 250 ms: no load for 2 s, wrk at 32 connections for 8 s,
   no load for 12 s. The report gives the replica count over time (rows where it changed) and
   the model's replica_* / model_loaded / model_unloaded log lines with their times.

Prints a markdown report; ``--out FILE`` also writes it there, ``--json FILE`` the raw numbers.
It never appends to any file, and it stops every daemon it started, also on errors.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import psutil
from harness import (
    Daemon,
    Latency,
    binary_request,
    check_output,
    command_line,
    http_output,
    machine_line,
    model_status,
    new_session,
    process_cpu_s,
    random_rows,
    run_wrk,
    time_calls,
    wait_idle,
    wait_loaded,
    wait_ready,
    wrk_errors,
)
from models import write_mlp

DIMS = (64, 1024, 1024, 64)
MODEL_FILE = "replicas_mlp.onnx"
HEADER_LENGTH = "Inference-Header-Content-Length"
TIMELINE_MODEL = "burst"
# The aims: two replicas with batching off at least 1.6x one; with batching on, no loss.
AIM_RATIO_OFF = 1.6
AIM_RATIO_ON = 1.0
# Outputs are O(1); the daemon runs the same graph, batched or not.
RTOL = 1e-4
ATOL = 1e-4
# Log lines of the timeline model worth showing.
TIMELINE_EVENTS = re.compile(
    r"\b(model_loading|model_loaded|model_unloaded|replica_\w+|scaling_\w+)\b"
)


@dataclass(frozen=True)
class Entry:
    """One model entry of the throughput daemon: the same file, its own replicas/batching."""

    name: str
    max_replicas: int
    batching: bool

    @property
    def label(self) -> str:
        return f"max = {self.max_replicas}, batching {'on' if self.batching else 'off'}"


ENTRIES = (
    Entry("max1-nobatch", 1, False),
    Entry("max2-nobatch", 2, False),
    Entry("max1-batch", 1, True),
    Entry("max2-batch", 2, True),
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
    def errors(self) -> int:
        return wrk_errors(self.wrk)

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


@dataclass(frozen=True)
class Sample:
    t: float
    traffic: bool
    state: str
    replicas: int  # the count /admin/status gives (ready + draining)
    states: str  # each replica's state, by index
    desired: int | None
    load: int  # the model's in_flight + queued


@dataclass
class Timeline:
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    spike_start: float | None = None
    spike_end: float | None = None
    wrk: dict[str, Any] | None = None


# --- configuration -----------------------------------------------------------------------


def model_block(
    name: str,
    max_replicas: int,
    batching: bool,
    args: argparse.Namespace,
    *,
    preload: bool,
    scale_down_after: str,
    idle_timeout: str | None = None,
) -> str:
    batch = (
        f'max_batch_size = {args.batch_rows}\nmax_delay = "{args.max_delay}"'
        if batching
        else "max_batch_size = 0"
    )
    idle = f'idle_timeout = "{idle_timeout}"\n' if idle_timeout is not None else ""
    return f"""
[[models]]
name = "{name}"
path = "{MODEL_FILE}"
preload = {"true" if preload else "false"}
intra_op_threads = 1
{idle}
[models.batching]
{batch}

[models.replicas]
min = 0
max = {max_replicas}
target_queue = 2
scale_up_after = "500ms"
scale_down_after = "{scale_down_after}"
"""


SERVER = """\
[server]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
idle_timeout = "never"
"""


def write_throughput_config(workdir: Path, args: argparse.Namespace) -> Path:
    blocks = [
        model_block(e.name, e.max_replicas, e.batching, args, preload=True,
                    scale_down_after="1h")
        for e in ENTRIES
    ]
    config = workdir / "throughput.toml"
    config.write_text(SERVER + "".join(blocks), encoding="utf-8")
    return config


def write_timeline_config(workdir: Path, args: argparse.Namespace) -> Path:
    block = model_block(TIMELINE_MODEL, 2, False, args, preload=False, scale_down_after="3s",
                        idle_timeout="5s")
    config = workdir / "timeline.toml"
    config.write_text(SERVER + block, encoding="utf-8")
    return config


# --- CPU accounting ----------------------------------------------------------------------


def machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (not idle, not waiting for I/O)."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0)
                 + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0))


def children_cpu_s() -> float:
    """CPU seconds of this process's finished (waited-for) children: wrk runs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each of the process's threads, by thread id (the main thread's id is
    the pid)."""
    try:
        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
    except psutil.Error:
        return {}


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- daemon helpers ----------------------------------------------------------------------


def ready_replicas(entry: dict[str, Any]) -> int:
    return sum(1 for r in entry.get("replica_details") or [] if r["state"] == "ready")


def replica_requests(entry: dict[str, Any]) -> dict[int, int]:
    return {int(r["index"]): int(r["requests"]) for r in entry.get("replica_details") or []}


def check_binary(
    client: httpx.Client, name: str, body: bytes, header_length: int, expected: np.ndarray
) -> None:
    """One binary-extension request (the body wrk sends), checked against onnxruntime."""
    response = client.post(
        f"/v2/models/{name}/infer",
        content=body,
        headers={HEADER_LENGTH: str(header_length), "Content-Type": "application/octet-stream"},
    )
    if response.status_code != 200:
        raise RuntimeError(f"infer {name}: {response.status_code} {response.text[:500]}")
    got = http_output(response.content, response.headers.get(HEADER_LENGTH))
    check_output(f"infer {name}", got, expected, RTOL, ATOL)


def wait_replicas(
    client: httpx.Client, name: str, url: str, load: tuple[Path, int], args: argparse.Namespace
) -> int:
    """Keep wrk load on ``name`` (1 s bursts) until it has two ready replicas or
    ``--scale-timeout`` passes; returns the ready count."""
    deadline = time.monotonic() + args.scale_timeout
    while (ready := ready_replicas(model_status(client, name))) < 2:
        if time.monotonic() > deadline:
            print(f"warning: {name} has {ready} ready replica(s) after {args.scale_timeout:g} s "
                  "of load; timing it anyway", file=sys.stderr)
            return ready
        run_wrk(url, load[0], args.wrk_threads, args.connections, 1.0, load[1])
    return ready


def measure(
    client: httpx.Client,
    daemon: Daemon,
    entry: Entry,
    round_no: int,
    load: tuple[Path, int],
    args: argparse.Namespace,
) -> Run:
    url = f"{daemon.base_url}/v2/models/{entry.name}/infer"
    run_wrk(url, load[0], args.wrk_threads, args.connections, args.warm_up, load[1])
    if entry.max_replicas > 1:
        wait_replicas(client, entry.name, url, load, args)
    before = wait_idle(client, entry.name)
    threads = thread_cpu_s(daemon.pid)
    cpu = (process_cpu_s(daemon.pid), children_cpu_s(), machine_busy_s(), time.monotonic())
    result = run_wrk(url, load[0], args.wrk_threads, args.connections, args.duration, load[1])
    daemon_s = process_cpu_s(daemon.pid) - cpu[0]
    per_thread = {tid: s - threads.get(tid, 0.0) for tid, s in thread_cpu_s(daemon.pid).items()}
    wrk_s = children_cpu_s() - cpu[1]
    busy_s = machine_busy_s() - cpu[2]
    wall_s = max(time.monotonic() - cpu[3], 1e-9)
    after = wait_idle(client, entry.name)
    served_before = replica_requests(before)
    served = {i: n - served_before.get(i, 0) for i, n in replica_requests(after).items()}
    run = Run(
        round_no,
        entry.name,
        result,
        ready_replicas(before),
        ready_replicas(after),
        served,
        daemon_s / wall_s,
        wrk_s / wall_s,
        max(0.0, busy_s - daemon_s - wrk_s) / wall_s,
        per_thread.get(daemon.pid, 0.0) / wall_s,
        max((s for tid, s in per_thread.items() if tid != daemon.pid), default=0.0) / wall_s,
    )
    print(
        f"round {round_no} {entry.name}: {json.dumps(result)} replicas="
        f"{run.replicas_before}->{run.replicas_after} per-replica={served} cores: "
        f"daemon={run.daemon_cores:.2f} (loop {run.loop_cores:.2f}, busiest other thread "
        f"{run.busiest_worker_cores:.2f}) wrk={run.wrk_cores:.2f} other={run.other_cores:.2f}",
        file=sys.stderr,
        flush=True,
    )
    return run


def throughput(
    args: argparse.Namespace, workdir: Path, load: tuple[Path, int], body: bytes,
    expected: np.ndarray,
) -> list[Run]:
    config = write_throughput_config(workdir, args)
    daemon = Daemon(args.python, config)
    runs: list[Run] = []
    try:
        print(f"daemon up: http={daemon.http_port}", file=sys.stderr)
        with httpx.Client(base_url=daemon.base_url, timeout=60.0) as client:
            wait_ready(client, "/health/ready")
            for entry in ENTRIES:
                wait_loaded(client, entry.name)  # preloaded: no load inside the timings
                check_binary(client, entry.name, body, load[1], expected)
                status = model_status(client, entry.name)
                if status["scaling"]["max"] != entry.max_replicas:
                    raise RuntimeError(f"{entry.name}: scaling {status['scaling']} is not "
                                       f"max = {entry.max_replicas}")
                if bool(status["batching"]["enabled"]) != entry.batching:
                    raise RuntimeError(f"{entry.name}: batching {status['batching']} is not "
                                       "as configured")
            for round_no in range(1, args.rounds + 1):
                order = ENTRIES if round_no % 2 else tuple(reversed(ENTRIES))
                for entry in order:
                    runs.append(measure(client, daemon, entry, round_no, load, args))
                for entry in ENTRIES:  # still right after the load
                    check_binary(client, entry.name, body, load[1], expected)
    except BaseException:
        print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
        raise
    finally:
        daemon.stop_and_warn()
    return runs


# --- in-process ceiling ------------------------------------------------------------------


def parallel_calls(sessions: Sequence[ort.InferenceSession], feeds: dict[str, np.ndarray],
                   duration_s: float) -> float:
    """Calls per second of all ``sessions`` together, each run back to back on its own
    Python thread (onnxruntime releases the GIL while it runs)."""
    counts = [0] * len(sessions)
    start = threading.Barrier(len(sessions) + 1)
    stop_at = [0.0]

    def loop(index: int) -> None:
        session = sessions[index]
        start.wait()
        calls = 0
        while time.perf_counter() < stop_at[0]:
            session.run(None, feeds)
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


# --- timeline ----------------------------------------------------------------------------


def sample(client: httpx.Client, t: float, traffic: bool) -> Sample:
    entry = model_status(client, TIMELINE_MODEL)
    details = sorted(entry.get("replica_details") or [], key=lambda r: int(r["index"]))
    return Sample(
        round(t, 3),
        traffic,
        str(entry["state"]),
        int(entry["replicas"]),
        ", ".join(f"{r['index']}:{r['state']}" for r in details) or "-",
        entry["scaling"].get("desired"),
        int(entry.get("in_flight") or 0) + int(entry.get("queued") or 0),
    )


def timeline(
    args: argparse.Namespace, workdir: Path, load: tuple[Path, int], body: bytes,
    expected: np.ndarray,
) -> Timeline:
    config = write_timeline_config(workdir, args)
    lines: list[tuple[float, str]] = []
    lock = threading.Lock()

    def on_line(line: str) -> None:
        if f"model={TIMELINE_MODEL}" in line and TIMELINE_EVENTS.search(line):
            with lock:
                lines.append((time.monotonic(), line))

    result = Timeline()
    spike: dict[str, Any] = {}
    daemon = Daemon(args.python, config, on_line=on_line)
    worker: threading.Thread | None = None
    try:
        print(f"timeline daemon up: http={daemon.http_port}", file=sys.stderr)
        url = f"{daemon.base_url}/v2/models/{TIMELINE_MODEL}/infer"
        with httpx.Client(base_url=daemon.base_url, timeout=60.0) as client:
            wait_ready(client, "/health/ready")
            t0 = time.monotonic()
            start_at = t0 + args.quiet_before
            end_at = start_at + args.spike + args.quiet_after

            def traffic() -> None:
                time.sleep(max(0.0, start_at - time.monotonic()))
                spike["start"] = time.monotonic()
                try:
                    spike["wrk"] = run_wrk(url, load[0], args.wrk_threads, args.connections,
                                           args.spike, load[1])
                except BaseException as exc:  # reported by the main thread
                    spike["error"] = exc
                spike["end"] = time.monotonic()

            worker = threading.Thread(target=traffic, daemon=True)
            worker.start()
            next_at = t0
            while (now := time.monotonic()) < end_at or worker.is_alive():
                busy = "start" in spike and "end" not in spike
                result.samples.append(sample(client, now - t0, busy))
                next_at += args.sample_interval
                time.sleep(max(0.0, next_at - time.monotonic()))
            worker.join()
            worker = None
            if "error" in spike:
                raise RuntimeError(f"wrk during the spike failed: {spike['error']}")
            result.samples.append(sample(client, time.monotonic() - t0, False))
            sampled_until = time.monotonic()
            check_binary(client, TIMELINE_MODEL, body, load[1], expected)  # loads it again
    except BaseException:
        print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
        raise
    finally:
        if worker is not None:
            worker.join()  # wrk stops by itself after --spike seconds
        daemon.stop_and_warn()
    with lock:
        result.events = [
            (round(t - t0, 3), strip_stamp(line)) for t, line in lines if t <= sampled_until
        ]
    result.spike_start = round(spike["start"] - t0, 3)
    result.spike_end = round(spike["end"] - t0, 3)
    result.wrk = spike.get("wrk")
    return result


def strip_stamp(line: str) -> str:
    """``2026-01-01T00:00:00.000Z INFO replica_added …`` -> ``replica_added …``."""
    parts = line.split(" ", 2)
    return parts[2] if len(parts) == 3 and parts[0].endswith("Z") else line


def changed_rows(samples: Sequence[Sample]) -> list[Sample]:
    """The first sample, each one where traffic, state, replicas or desired changed, and the
    last one."""
    rows: list[Sample] = []
    last: tuple[Any, ...] | None = None
    for s in samples:
        key = (s.traffic, s.state, s.replicas, s.states, s.desired)
        if key != last:
            rows.append(s)
            last = key
    if samples and rows[-1] is not samples[-1]:
        rows.append(samples[-1])
    return rows


# --- report ------------------------------------------------------------------------------


def median_of(runs: Sequence[Run], name: str) -> float:
    return statistics.median(r.per_s for r in runs if r.entry == name)


def paired(runs: Sequence[Run], two: str, one: str) -> list[float]:
    """max2/max1 within each round."""
    by_round = {(r.round, r.entry): r.per_s for r in runs}
    rounds = sorted({r.round for r in runs})
    return [by_round[(n, two)] / by_round[(n, one)] for n in rounds
            if (n, two) in by_round and (n, one) in by_round]


def _yes(met: bool) -> str:
    return "yes" if met else "**no**"


def _share(served: dict[int, int]) -> str:
    total = sum(served.values())
    if not total:
        return "-"
    return " / ".join(f"{n / total:.0%}" for _, n in sorted(served.items()))


def throughput_report(
    runs: list[Run], ceiling: list[Ceiling], args: argparse.Namespace
) -> list[str]:
    lines = [
        f"### Throughput: wrk -t{args.wrk_threads} -c{args.connections}, {args.rounds} "
        f"alternating rounds of {args.duration:g} s (after a {args.warm_up:g} s warm-up each)",
        "",
        "| round | model | requests/s | p50 ms | p99 ms | ready replicas (start -> end) "
        "| requests per replica | CPU cores: daemon / wrk / other | daemon's main thread "
        "/ busiest other thread | daemon CPU ms per request | errors |",
        "| ---: | --- | ---: | ---: | ---: | --- | --- | --- | --- | ---: | ---: |",
    ]
    labels = {e.name: e.label for e in ENTRIES}
    for r in runs:
        lines.append(
            f"| {r.round} | `{r.entry}` ({labels[r.entry]}) | {r.per_s:,.0f} "
            f"| {r.wrk['p50_ms']:.2f} | {r.wrk['p99_ms']:.2f} "
            f"| {r.replicas_before} -> {r.replicas_after} | {_share(r.replica_requests)} "
            f"| {r.daemon_cores:.2f} / {r.wrk_cores:.2f} / {r.other_cores:.2f} "
            f"| {r.loop_cores:.2f} / {r.busiest_worker_cores:.2f} "
            f"| {r.daemon_ms_per_request:.3f} | {r.errors} |"
        )
    lines += [
        "",
        "| batching | max = 1, median req/s | max = 2, median req/s | ratio of medians "
        "| per-round ratios: median (range) | aim | met |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    errors = sum(r.errors for r in runs)
    short = [r for r in runs if r.entry.startswith("max2") and r.replicas_before < 2]
    for batching, name1, name2, aim in (
        ("off", "max1-nobatch", "max2-nobatch", AIM_RATIO_OFF),
        ("on", "max1-batch", "max2-batch", AIM_RATIO_ON),
    ):
        m1, m2 = median_of(runs, name1), median_of(runs, name2)
        pairs = paired(runs, name2, name1)
        mid = statistics.median(pairs)
        lines.append(
            f"| {batching} | {m1:,.0f} | {m2:,.0f} | {m2 / m1:.2f}x | {mid:.2f}x "
            f"({min(pairs):.2f}-{max(pairs):.2f}) | >= {aim:g}x | "
            f"{_yes(mid >= aim and errors == 0 and not short)} |"
        )
    one, two = ceiling
    lines += [
        "",
        "- Aims (the issue's): with two replicas, batching off, at least "
        f"{AIM_RATIO_OFF:g}x one replica; batching on, no loss (>= {AIM_RATIO_ON:g}x). "
        "\"met\" uses the median of the per-round ratios, and needs 0 errors and two ready "
        "replicas at the start of every `max = 2` run.",
        f"- Errors (non-2xx + socket errors) over all runs: {errors}.",
        "- CPU cores: CPU seconds per wall second of the measured run, of the daemon (all its "
        "threads), of wrk, and of everything else on the machine (its busy time less those "
        f"two; {psutil.cpu_count()} cores in all). \"other\" well above 0 means something "
        "else took cores from the run. The daemon's main thread runs the event loop (HTTP, "
        "codecs, scheduling); its busiest other thread is normally a replica's worker. A "
        "column near 1.00 is a thread that had no more to give.",
    ]
    if short:
        lines.append(f"- **{len(short)} `max = 2` run(s) started with fewer than two ready "
                     "replicas.**")
    lines += [
        "",
        "In-process onnxruntime on the same request (same file and rows, 1 intra-op thread, "
        f"{args.rounds} alternating runs of {min(args.duration, 5.0):g} s, median):",
        "",
        "| sessions | requests/s | p50 ms per call | other CPU cores (median) |",
        "| --- | ---: | ---: | ---: |",
        f"| one, one Python thread | {one.median:,.0f} | {one.p50_ms or 0:.3f} "
        f"| {statistics.median(one.other_cores):.2f} |",
        f"| two, one Python thread each | {two.median:,.0f} ({two.median / one.median:.2f}x) "
        f"| - | {statistics.median(two.other_cores):.2f} |",
        "",
        f"- Daemon at max = 1, batching off: {median_of(runs, 'max1-nobatch') / one.median:.0%} "
        f"of one session; at max = 2: {median_of(runs, 'max2-nobatch') / two.median:.0%} of "
        "two sessions.",
        "",
    ]
    return lines


def timeline_report(tl: Timeline, args: argparse.Namespace) -> list[str]:
    wrk = tl.wrk or {}
    lines = [
        f"### Replicas over time: `{TIMELINE_MODEL}` (max = 2, target_queue 2, "
        'scale_up_after "500ms", scale_down_after "3s", idle_timeout "5s", batching off)',
        "",
        f"No load for {args.quiet_before:g} s, wrk -t{args.wrk_threads} -c{args.connections} "
        f"from {tl.spike_start:.2f} s to {tl.spike_end:.2f} s "
        f"({float(wrk.get('requests_per_s', 0)):,.0f} req/s, "
        f"{wrk_errors(wrk) if wrk else '-'} errors), then no load until "
        f"{args.quiet_before + args.spike + args.quiet_after:g} s. `/admin/status` sampled "
        f"every {args.sample_interval * 1000:g} ms ({len(tl.samples)} samples); rows where "
        "something changed:",
        "",
        "| t s | load | state | replicas | replica states | desired | in flight + queued |",
        "| ---: | --- | --- | ---: | --- | ---: | ---: |",
    ]
    lines += [
        f"| {s.t:.2f} | {'wrk' if s.traffic else '-'} | {s.state} | {s.replicas} | {s.states} "
        f"| {s.desired if s.desired is not None else '-'} | {s.load} |"
        for s in changed_rows(tl.samples)
    ]
    lines += ["", "Log lines of the model (t: when the script read them):", "",
              "| t s | line |", "| ---: | --- |"]
    lines += [f"| {t:.2f} | `{line}` |" for t, line in tl.events]
    peak = max((s.replicas for s in tl.samples), default=0)
    lines += ["", f"- Most replicas seen: {peak}."]
    start, end = tl.spike_start or 0.0, tl.spike_end or 0.0

    def first(event: str, after: float) -> float | None:
        return next((t for t, line in tl.events if line.startswith(event) and t >= after), None)

    for label, event, origin, name in (
        ("second replica added", "replica_added", start, "the load started"),
        ("second replica removed", "replica_removed", end, "the load stopped"),
        ("model unloaded", "model_unloaded", end, "the load stopped"),
    ):
        at = first(event, origin)
        lines.append(f"- {label}: " + (f"{at - origin:.2f} s after {name} (t = {at:.2f} s)."
                                       if at is not None else "**not seen**."))
    lines.append("")
    return lines


def report(
    machine: str,
    cost: Latency,
    runs: list[Run] | None,
    ceiling: list[Ceiling] | None,
    tl: Timeline | None,
    args: argparse.Namespace,
) -> str:
    lines = [
        f"## Replica autoscaling benchmark: MLP {'-'.join(str(d) for d in DIMS)} FP32, "
        f"{args.rows} rows per request",
        "",
        f"- {machine}",
        f"- command: `{command_line()}`",
        f"- one request in-process (1 intra-op thread): p50 {cost.p50_ms:.3f} ms, "
        f"{cost.per_s:,.0f} calls/s",
        "- binary-extension requests (input and output binary); every model "
        "`intra_op_threads = 1`, `[models.replicas]` min 0, target_queue 2, scale_up_after "
        f'"500ms"; batching on = `max_batch_size = {args.batch_rows}` rows, `max_delay = '
        f'"{args.max_delay}"`; batching off = `max_batch_size = 0`',
        "",
    ]
    if runs is not None and ceiling is not None:
        lines += throughput_report(runs, ceiling, args)
    if tl is not None:
        lines += timeline_report(tl, args)
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds per measured throughput run (10)")
    parser.add_argument("--warm-up", type=float, default=2.0,
                        help="seconds of wrk warm-up before each run (2)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds of the four entries (3)")
    parser.add_argument("--rows", type=int, default=64, help="rows per request (64)")
    parser.add_argument("--batch-rows", type=int, default=None,
                        help="max_batch_size with batching on (4 requests' rows: 256)")
    parser.add_argument("--max-delay", default="2ms", help="max_delay with batching on (2ms)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (32)")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (1)")
    parser.add_argument("--scale-timeout", type=float, default=30.0,
                        help="most seconds of load to wait for a second replica (30)")
    parser.add_argument("--quiet-before", type=float, default=2.0,
                        help="timeline: seconds without load first (2)")
    parser.add_argument("--spike", type=float, default=8.0,
                        help="timeline: seconds of wrk load (8)")
    parser.add_argument("--quiet-after", type=float, default=12.0,
                        help="timeline: seconds without load after it (12)")
    parser.add_argument("--sample-interval", type=float, default=0.25,
                        help="timeline: seconds between /admin/status samples (0.25)")
    parser.add_argument("--only", choices=("throughput", "timeline"),
                        help="run one part only (default: both)")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the daemon")
    args = parser.parse_args(argv)
    if args.batch_rows is None:
        args.batch_rows = 4 * args.rows
    if args.rounds < 1 or args.rows < 1 or args.duration < 1:
        parser.error("--rounds, --rows and --duration must be at least 1")
    args.warm_up = max(1.0, args.warm_up)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk not found; run: bash bench/setup.sh", file=sys.stderr)
        return 2
    machine = machine_line()
    model_input = random_rows(args.rows, DIMS[0])
    runs: list[Run] | None = None
    ceiling: list[Ceiling] | None = None
    tl: Timeline | None = None
    with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
        workdir = Path(tmp)
        path = write_mlp(workdir / MODEL_FILE, DIMS)
        body, header_length = binary_request(model_input)
        body_file = workdir / "body.bin"
        body_file.write_bytes(body)
        load = (body_file, header_length)
        reference = new_session(path)
        feeds = {"x": model_input}
        expected = reference.run(None, feeds)[0]
        time_calls(lambda: reference.run(None, feeds), 0.5)  # warm-up
        cost = time_calls(lambda: reference.run(None, feeds), 2.0)
        print(f"one request ({args.rows}x{DIMS[0]}) in-process, 1 thread: p50 "
              f"{cost.p50_ms:.3f} ms, {cost.per_s:,.0f} calls/s", file=sys.stderr, flush=True)

        if args.only in (None, "throughput"):
            runs = throughput(args, workdir, load, body, expected)
            ceiling = ceilings(path, model_input, args)
        if args.only in (None, "timeline"):
            tl = timeline(args, workdir, load, body, expected)

    markdown = report(machine, cost, runs, ceiling, tl, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    if args.json is not None:
        raw = {
            "machine": machine,
            "command": command_line(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "dims": DIMS,
            "in_process_ms_p50": cost.p50_ms,
            "runs": [asdict(r) for r in runs or []],
            "ceiling": [asdict(c) for c in ceiling or []],
            "timeline": asdict(tl) if tl is not None else None,
        }
        args.json.write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
