"""The rerank scenario's runs: one route under load.py (c clients, warm-up and measured
window in one run, drained), with the CPU of every process read as the window opens and
closes; and the in-process ceiling, sentence-transformers' ``CrossEncoder.predict``."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cpu import machine_busy_s, process_cpu_s, tree_cpu_s
from harness.daemon import Daemon
from harness.status import wait_idle

from scenarios.embeddings.infinity import Infinity
from scenarios.embeddings.runs import cut_runs, pytest_running
from scenarios.rerank.model import TEI, Rerank, Target

LOAD = Path(__file__).resolve().parent / "load.py"
CEIL_REQUEST = "predict(32 pairs of a request)"
CEIL_SORTED = "predict(128 pairs of 4 requests, batch_size=32)"
CEIL_FORWARD = "model forward only: 4 requests' pairs tokenized before, sorted runs of 512 tokens"
CEILINGS = (CEIL_REQUEST, CEIL_SORTED, CEIL_FORWARD)


@dataclass(frozen=True)
class Run:
    round: int
    server: str
    connections: int
    documents: int  # per request
    requests: int  # answered within the window
    duration_s: float
    shared_requests_per_s: float  # each request counted for its share of the window (load.py)
    p50_ms: float
    p99_ms: float
    errors: int
    drain_s: float
    server_cpu_s: float  # the measured server's process tree, over the window
    other_cpu_s: float  # the other servers, idle meanwhile
    client_cpu_s: float  # load.py
    foreign_cpu_s: float  # the rest of the machine: neither the servers, nor load.py, nor us
    pytest: bool  # a pytest process was running when the run started
    rows_per_batch: float | None  # SnoozeML only, over the whole run

    @property
    def pairs_per_s(self) -> float:
        """Pairs/s, each request counted for the share of its time within the window."""
        return self.shared_requests_per_s * self.documents

    @property
    def counted_pairs_per_s(self) -> float:
        """Pairs of the requests answered within the window, over the window."""
        return self.requests * self.documents / self.duration_s

    @property
    def server_cores(self) -> float:
        return self.server_cpu_s / self.duration_s

    @property
    def client_cores(self) -> float:
        return self.client_cpu_s / self.duration_s

    @property
    def foreign_cores(self) -> float:
        return self.foreign_cpu_s / self.duration_s

    @property
    def server_ms_per_pair(self) -> float:
        return self.server_cpu_s * 1000 / max(1, self.requests * self.documents)


@dataclass(frozen=True)
class CeilingRun:
    round: int
    label: str
    pairs_per_s: float
    p50_call_ms: float  # one predict call
    foreign_cores: float  # the rest of the machine (servers idle, other work), per second


@dataclass
class Servers:
    daemon: Daemon
    infinities: dict[str, Infinity]  # by engine
    pids: dict[str, int] = field(default_factory=dict)  # "SnoozeML", "infinity <engine>"

    def url(self, target: Target) -> str:
        if not target.snooze:
            return f"{self.infinities[target.engine].base_url}/v1/rerank"
        if target.route == TEI:
            return f"{self.daemon.base_url}/rerank"
        return f"{self.daemon.base_url}/v1/rerank"

    @staticmethod
    def pid_key(target: Target) -> str:
        return "SnoozeML" if target.snooze else f"infinity {target.engine}"


@dataclass
class Marks:
    """CPU counters read at one moment: the measured server, the others, load.py, the machine
    and this process."""

    server: float
    others: float
    client: float
    machine: float
    own: float

    @classmethod
    def read(cls, own: int, others: Sequence[int], client: int) -> Marks:
        return cls(tree_cpu_s(own), sum(tree_cpu_s(pid) for pid in others),
                   process_cpu_s(client), machine_busy_s(), process_cpu_s(os.getpid()))


def drive(url: str, bodies: Path, connections: int, warm_up_s: float, duration_s: float,
          own: int, others: Sequence[int]) -> tuple[dict[str, Any], Marks, Marks]:
    """load.py against ``url``: its summary and the CPU marks at the window's ends."""
    cmd = [sys.executable, str(LOAD), url, str(bodies), str(connections), f"{warm_up_s:g}",
           f"{duration_s:g}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    marks: dict[str, Marks] = {}
    summary: dict[str, Any] | None = None
    for line in proc.stdout:
        line = line.strip()
        if line in ("start", "end"):
            marks[line] = Marks.read(own, others, proc.pid)
        elif line.startswith("{"):
            summary = json.loads(line)
    if proc.wait() != 0 or summary is None or len(marks) != 2:
        raise RuntimeError(f"load.py failed ({proc.returncode}) against {url}")
    return summary, marks["start"], marks["end"]


def measure(servers: Servers, bodies: Path, target: Target, round_no: int, documents: int,
            args: Any) -> Run:
    server = target.label
    client = servers.daemon.client
    before = wait_idle(client, target.model)["batching"] if target.snooze else None
    own = servers.pids[servers.pid_key(target)]
    others = [pid for pid in servers.pids.values() if pid != own]
    pytest = pytest_running()
    summary, start, end = drive(servers.url(target), bodies, args.concurrency[0], args.warm_up,
                                args.duration, own, others)
    server_cpu = end.server - start.server
    other_cpu = end.others - start.others
    client_cpu = end.client - start.client
    foreign = max(0.0, end.machine - start.machine - server_cpu - other_cpu - client_cpu
                  - (end.own - start.own))
    rows_per_batch = None
    if before is not None:
        after = wait_idle(client, target.model)["batching"]
        batches = after["batches"] - before["batches"]
        rows_per_batch = (after["rows"] - before["rows"]) / batches if batches else None
    run = Run(round_no, server, args.concurrency[0], documents, int(summary["requests"]),
              float(summary["duration_s"]), float(summary["shared_requests_per_s"]),
              float(summary["p50_ms"]), float(summary["p99_ms"]),
              int(summary["errors"]), float(summary["drain_s"]), server_cpu, other_cpu,
              client_cpu, foreign, pytest, rows_per_batch)
    print(f"round {round_no} {server}: {run.pairs_per_s:,.1f} pairs/s ({run.requests} "
          f"answers in the window: {run.counted_pairs_per_s:,.1f}), "
          f"p50 {run.p50_ms:,.0f} ms, p99 {run.p99_ms:,.0f} ms, errors {run.errors}, "
          f"server {run.server_cores:.2f} cores, load.py {run.client_cores:.2f} cores, "
          f"rest of the machine {run.foreign_cores:.2f} cores, drained in {run.drain_s:.1f} s"
          + (" (pytest running)" if pytest else "")
          + (f", rows/batch {rows_per_batch:.1f}" if rows_per_batch else ""), file=sys.stderr)
    if run.errors:
        raise RuntimeError(f"{server}: {run.errors} errors, the first: {summary['first_error']}")
    return run


def ceiling(model: Any, reranks: Sequence[Rerank], label: str, round_no: int,
            duration_s: float) -> CeilingRun:
    """Pairs/s of CrossEncoder.predict in this process for ``duration_s``: each request's
    pairs in one call (``CEIL_REQUEST``), or four requests' pairs in one call of batch size
    32, which predict sorts by length first (``CEIL_SORTED``)."""
    if label == CEIL_FORWARD:
        return forward_ceiling(model, reranks, round_no, duration_s)
    me_before = process_cpu_s(os.getpid())
    machine_before = machine_busy_s()
    per = 1 if label == CEIL_REQUEST else 4
    calls = [[pair for r in reranks[i : i + per] for pair in r.pairs]
             for i in range(0, len(reranks) - per + 1, per)]
    done = 0
    per_call: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < duration_s:
        for pairs in calls:
            before = time.perf_counter()
            model.predict(pairs, batch_size=32, convert_to_numpy=True, show_progress_bar=False)
            per_call.append((time.perf_counter() - before) * 1000)
            done += len(pairs)
            if time.perf_counter() - start >= duration_s:
                break
    elapsed = time.perf_counter() - start
    foreign = machine_busy_s() - machine_before - (process_cpu_s(os.getpid()) - me_before)
    run = CeilingRun(round_no, label, done / elapsed, statistics.median(per_call),
                     max(0.0, foreign) / elapsed)
    print(f"round {round_no} ceiling {label}: {run.pairs_per_s:,.1f} pairs/s, "
          f"rest of the machine {run.foreign_cores:.2f} cores", file=sys.stderr)
    return run


def sorted_runs(model: Any, pairs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """The pairs tokenized as CrossEncoder does, in the daemon's sorted runs (cut_runs), as
    torch inputs."""
    tokenizer = model.tokenizer
    lengths = [len(ids) for ids in tokenizer([p[0] for p in pairs], [p[1] for p in pairs],
                                             truncation=True)["input_ids"]]
    return [dict(tokenizer([pairs[i][0] for i in run], [pairs[i][1] for i in run],
                           padding=True, truncation=True, return_tensors="pt"))
            for run in cut_runs(lengths)]


def forward_ceiling(model: Any, reranks: Sequence[Rerank], round_no: int,
                    duration_s: float) -> CeilingRun:
    """Pairs/s of the cross-encoder's own forward passes, no tokenizing, no HTTP: what the
    model's work alone allows on these threads, whatever serves it (CEIL_FORWARD)."""
    import torch

    model.model.eval()  # as predict does: no dropout
    calls = [sorted_runs(model, [pair for r in reranks[i : i + 4] for pair in r.pairs])
             for i in range(0, len(reranks) - 3, 4)]
    counts = [sum(int(run["input_ids"].shape[0]) for run in call) for call in calls]
    me_before = process_cpu_s(os.getpid())
    machine_before = machine_busy_s()
    done = 0
    per_call: list[float] = []
    start = time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - start < duration_s:
            for call, count in zip(calls, counts, strict=True):
                before = time.perf_counter()
                for run in call:
                    model.model(**run)
                per_call.append((time.perf_counter() - before) * 1000)
                done += count
                if time.perf_counter() - start >= duration_s:
                    break
    elapsed = time.perf_counter() - start
    foreign = machine_busy_s() - machine_before - (process_cpu_s(os.getpid()) - me_before)
    run = CeilingRun(round_no, CEIL_FORWARD, done / elapsed, statistics.median(per_call),
                     max(0.0, foreign) / elapsed)
    print(f"round {round_no} ceiling {CEIL_FORWARD}: {run.pairs_per_s:,.1f} pairs/s, "
          f"rest of the machine {run.foreign_cores:.2f} cores", file=sys.stderr)
    return run
