"""The embeddings scenario's runs: one server and shape under wrk with the Lua script that
cycles through distinct bodies, with the CPU of every process around it; and the in-process
ceiling, sentence-transformers' ``encode``."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from harness.cpu import CpuWindow, machine_busy_s, process_cpu_s, tree_cpu_s
from harness.daemon import Daemon
from harness.load import run_wrk
from harness.status import wait_idle

from scenarios.embeddings.corpus import OIP, Target
from scenarios.embeddings.infinity import Infinity

LUA = Path(__file__).resolve().parent / "bodies.lua"
CEIL_SORTED = "encode(all, batch_size=32)"
CEIL_ARRIVAL = "encode(32 at a time, corpus order)"
CEIL_FORWARD = "model forward only: the corpus tokenized before, sorted runs of 512 tokens"
CEILINGS = (CEIL_SORTED, CEIL_ARRIVAL, CEIL_FORWARD)
RUN_TOKENS = 512  # the daemon's max_batch_tokens on a CPU


def pytest_running() -> bool:
    """Whether some pytest process is running on the machine (another engineer's tests)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any("pytest" in part for part in cmdline[:3]):
            return True
    return False


@dataclass(frozen=True)
class Run:
    round: int
    server: str
    shape: str
    connections: int
    sentences_per_request: int
    requests: int
    duration_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu_s: float  # the measured server's process tree
    other_cpu_s: float  # the other servers, idle meanwhile
    client_cpu_s: float  # wrk
    foreign_cpu_s: float  # the rest of the machine: neither the servers, nor wrk, nor us
    pytest: bool  # a pytest process was running when the run started
    rows_per_batch: float | None  # SnoozeML only

    @property
    def sentences_per_s(self) -> float:
        return self.requests * self.sentences_per_request / self.duration_s

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
    def server_ms_per_sentence(self) -> float:
        return self.server_cpu_s * 1000 / max(1, self.requests * self.sentences_per_request)


@dataclass(frozen=True)
class CeilingRun:
    round: int
    label: str
    sentences_per_s: float
    p50_batch_ms: float
    foreign_cores: float  # the rest of the machine (servers idle, other work), per second


@dataclass
class Servers:
    daemon: Daemon
    infinities: dict[str, Infinity]  # by engine
    v1: bool  # the daemon serves /v1/embeddings
    pids: dict[str, int] = field(default_factory=dict)  # "SnoozeML", "infinity <engine>"

    def base_url(self, target: Target) -> str:
        return (self.daemon.base_url if target.snooze
                else self.infinities[target.engine].base_url)

    def url(self, target: Target) -> str:
        if target.route == OIP:
            return f"{self.daemon.base_url}/v2/models/{target.model}/infer"
        return f"{self.base_url(target)}/v1/embeddings"

    @staticmethod
    def pid_key(target: Target) -> str:
        return "SnoozeML" if target.snooze else f"infinity {target.engine}"


def measure(servers: Servers, bodies: Path, target: Target, shape: str, round_no: int,
            args: argparse.Namespace) -> Run:
    connections = args.concurrency[0] if shape == "one" else args.batch_concurrency
    per_request = 1 if shape == "one" else args.batch
    url = servers.url(target)
    server = target.label
    snooze = target.snooze
    if args.warm_up > 0:
        run_wrk(url, bodies, 1, connections, args.warm_up, script=LUA, timeout_s=60.0)
    client = servers.daemon.client
    before_status = wait_idle(client, target.model)["batching"] if snooze else None
    own = servers.pids[servers.pid_key(target)]
    others = [pid for pid in servers.pids.values() if pid != own]
    pytest = pytest_running()
    own_before = tree_cpu_s(own)
    others_before = sum(tree_cpu_s(pid) for pid in others)
    with CpuWindow(os.getpid()) as cpu:  # this process, its children (wrk), the machine
        result = run_wrk(url, bodies, 1, connections, args.duration, script=LUA, timeout_s=60.0)
    server_cpu = tree_cpu_s(own) - own_before
    other_cpu = sum(tree_cpu_s(pid) for pid in others) - others_before
    foreign = max(0.0, cpu.machine_s - server_cpu - other_cpu - cpu.process_s - cpu.children_s)
    rows_per_batch = None
    if before_status is not None:
        after = wait_idle(client, target.model)["batching"]
        batches = after["batches"] - before_status["batches"]
        rows_per_batch = (after["rows"] - before_status["rows"]) / batches if batches else None
    run = Run(round_no, server, shape, connections, per_request, int(result["requests"]),
              float(result["duration_s"]), float(result["p50_ms"]), float(result["p99_ms"]),
              int(result["errors"]), server_cpu, other_cpu, cpu.children_s, foreign, pytest,
              rows_per_batch)
    print(f"round {round_no} {server} {shape}: {run.sentences_per_s:,.1f} sentences/s, "
          f"p50 {run.p50_ms:,.1f} ms, p99 {run.p99_ms:,.1f} ms, errors {run.errors}, "
          f"server {run.server_cores:.2f} cores, wrk {run.client_cores:.2f} cores, "
          f"rest of the machine {run.foreign_cores:.2f} cores"
          + (" (pytest running)" if pytest else "")
          + (f", rows/batch {rows_per_batch:.1f}" if rows_per_batch else ""), file=sys.stderr)
    if run.errors:
        raise RuntimeError(f"{server} {shape}: {run.errors} errors of {run.requests} requests")
    return run


def ceiling(model: Any, sentences: Sequence[str], label: str, round_no: int, batch: int,
            duration_s: float) -> CeilingRun:
    """Sentences/s of sentence-transformers' encode in this process, for ``duration_s``."""
    if label == CEIL_FORWARD:
        return forward_ceiling(model, sentences, round_no, duration_s)
    me_before = process_cpu_s(os.getpid())
    machine_before = machine_busy_s()
    groups = [list(sentences[i : i + batch]) for i in range(0, len(sentences), batch)]
    done = 0
    per_batch: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < duration_s:
        if label == CEIL_SORTED:
            before = time.perf_counter()
            model.encode(list(sentences), batch_size=batch, convert_to_numpy=True)
            per_batch.append((time.perf_counter() - before) * 1000 / len(groups))
            done += len(sentences)
        else:
            for group in groups:
                before = time.perf_counter()
                model.encode(group, batch_size=batch, convert_to_numpy=True)
                per_batch.append((time.perf_counter() - before) * 1000)
                done += len(group)
    elapsed = time.perf_counter() - start
    foreign = machine_busy_s() - machine_before - (process_cpu_s(os.getpid()) - me_before)
    run = CeilingRun(round_no, label, done / elapsed, statistics.median(per_batch),
                     max(0.0, foreign) / elapsed)
    print(f"round {round_no} ceiling {label}: {run.sentences_per_s:,.1f} sentences/s, "
          f"rest of the machine {run.foreign_cores:.2f} cores", file=sys.stderr)
    return run


def sorted_runs(model: Any, sentences: Sequence[str]) -> list[dict[str, Any]]:
    """The sentences tokenized as encode does, sorted by length and cut into runs of at most
    RUN_TOKENS padded tokens (the daemon's runs, runtime/text/by_length.py)."""
    lengths = [len(ids) for ids in model.tokenizer(list(sentences), truncation=True,
                                                   max_length=model.max_seq_length)["input_ids"]]
    return [dict(model.tokenize([sentences[i] for i in run])) for run in cut_runs(lengths)]


def cut_runs(lengths: Sequence[int]) -> list[list[int]]:
    """Row indices sorted by token count, cut into runs of at most RUN_TOKENS padded tokens
    (the daemon's runs on a CPU, runtime/text/by_length.py)."""
    runs: list[list[int]] = [[]]
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        if runs[-1] and (len(runs[-1]) + 1) * lengths[index] > RUN_TOKENS:
            runs.append([])
        runs[-1].append(index)
    return runs


def forward_ceiling(model: Any, sentences: Sequence[str], round_no: int,
                    duration_s: float) -> CeilingRun:
    """Sentences/s of the model's own forward passes (transformer, pooling, normalisation: the
    modules encode runs), no tokenizing, no HTTP, on the whole corpus sorted: what the model's
    work alone allows on these threads, whatever serves it (CEIL_FORWARD)."""
    import torch

    model.eval()  # as encode does: no dropout
    runs = sorted_runs(model, sentences)
    me_before = process_cpu_s(os.getpid())
    machine_before = machine_busy_s()
    done = 0
    per_pass: list[float] = []
    start = time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - start < duration_s:
            before = time.perf_counter()
            for run in runs:
                model.forward(dict(run))
            per_pass.append((time.perf_counter() - before) * 1000 / len(runs))
            done += len(sentences)
    elapsed = time.perf_counter() - start
    foreign = machine_busy_s() - machine_before - (process_cpu_s(os.getpid()) - me_before)
    run = CeilingRun(round_no, CEIL_FORWARD, done / elapsed, statistics.median(per_pass),
                     max(0.0, foreign) / elapsed)
    print(f"round {round_no} ceiling {CEIL_FORWARD}: {run.sentences_per_s:,.1f} "
          f"sentences/s, rest of the machine {run.foreign_cores:.2f} cores", file=sys.stderr)
    return run
