"""Replicas over time: ``burst`` (max = 2, scale_down_after 3s, idle_timeout 5s) sampled every
``--sample-interval`` through quiet, a wrk spike, and quiet again; its log lines beside."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.cli import Bench
from harness.daemon import Daemon
from harness.load import run_wrk
from harness.logs import strip_stamp
from harness.status import model_status

from scenarios.replicas.entries import TIMELINE_MODEL, Load, check_binary, timeline_config

# Log lines of the timeline model worth showing.
TIMELINE_EVENTS = re.compile(
    r"\b(model_loading|model_loaded|model_unloaded|replica_\w+|scaling_\w+)\b")


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


def sample(daemon: Daemon, t: float, traffic: bool) -> Sample:
    entry = model_status(daemon.client, TIMELINE_MODEL)
    details = sorted(entry.get("replica_details") or [], key=lambda r: int(r["index"]))
    return Sample(round(t, 3), traffic, str(entry["state"]), int(entry["replicas"]),
                  ", ".join(f"{r['index']}:{r['state']}" for r in details) or "-",
                  entry["scaling"].get("desired"),
                  int(entry.get("in_flight") or 0) + int(entry.get("queued") or 0))


def timeline(bench: Bench, load: Load) -> Timeline:
    """Long because the spike runs on its own thread while this one samples: the whole
    schedule (quiet, spike, quiet) reads in one place."""
    args = bench.args
    lines: list[tuple[float, str]] = []
    lock = threading.Lock()

    def on_line(line: str) -> None:
        if f"model={TIMELINE_MODEL}" in line and TIMELINE_EVENTS.search(line):
            with lock:
                lines.append((time.monotonic(), line))

    result = Timeline()
    spike: dict[str, Any] = {}
    worker: threading.Thread | None = None
    with bench.serve(timeline_config(bench.workdir, args), on_line=on_line) as daemon:
        try:
            t0 = time.monotonic()
            start_at = t0 + args.quiet_before
            end_at = start_at + args.spike + args.quiet_after

            def traffic() -> None:
                time.sleep(max(0.0, start_at - time.monotonic()))
                spike["start"] = time.monotonic()
                try:
                    spike["wrk"] = run_wrk(daemon.infer_url(TIMELINE_MODEL), load.body_file,
                                           args.wrk_threads, args.concurrency[0], args.spike,
                                           load.header_length)
                except BaseException as exc:  # reported by the main thread
                    spike["error"] = exc
                spike["end"] = time.monotonic()

            worker = threading.Thread(target=traffic, daemon=True)
            worker.start()
            next_at = t0
            while (now := time.monotonic()) < end_at or worker.is_alive():
                busy = "start" in spike and "end" not in spike
                result.samples.append(sample(daemon, now - t0, busy))
                next_at += args.sample_interval
                time.sleep(max(0.0, next_at - time.monotonic()))  # the sampling interval
            worker.join()
            worker = None
            if "error" in spike:
                raise RuntimeError(f"wrk during the spike failed: {spike['error']}")
            result.samples.append(sample(daemon, time.monotonic() - t0, False))
            sampled_until = time.monotonic()
            check_binary(daemon, TIMELINE_MODEL, load)  # loads it again
        finally:
            if worker is not None:
                worker.join()  # wrk stops by itself after --spike seconds
    with lock:
        result.events = [(round(t - t0, 3), strip_stamp(line))
                         for t, line in lines if t <= sampled_until]
    result.spike_start = round(spike["start"] - t0, 3)
    result.spike_end = round(spike["end"] - t0, 3)
    result.wrk = spike.get("wrk")
    print(f"timeline: {len(result.samples)} samples, {len(result.events)} log lines",
          file=sys.stderr)
    return result


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
