"""Soak test of the SnoozeML daemon (issue 15 part 5): minutes of every kind of trouble at once,
then proof that nothing grew.

Usage (from the repository root)::

    .venv/bin/python bench/soak.py [--duration 10m] [--warm-up 20%] [--out FILE]

Setup: ONNX models written with ``bench/models.py`` into a temporary folder, served by one daemon
(``python -m snoozeml serve`` on ephemeral ports) with ``host_budget = --budget`` (40 MiB) and a
``cache_dir`` in that folder:

- ``hot``: the bench MLP 64→256→64, ``preload``, ``idle_timeout = "never"`` (pinned);
- ``blink`` (MLP 16→32→8) and ``blink-nb`` (MatMul 96 by 96, batching off): ``idle_timeout =
  "2s"``; only one client sends to them, every 2.3 to 3.5 s, so nearly every request rehydrates;
- ``churn-0`` … (``--churn``, 8): MLPs 128→1024→1024→128 of about 5 MiB each,
  ``idle_timeout = "3s"``, ``max_delay`` 0 or 1 ms alternately: more than the budget holds
  together, so loads evict. The budget leaves room for a first (default-path) load of one beside
  the pinned model, which can measure up to ~15 MiB (the first model loaded carries
  onnxruntime's one-off state), so no load waits for memory that nothing can free.

Traffic runs in **cycles** of ``--cycle`` seconds (10). During a cycle:

- ``--clients`` (4) threads, each with its own httpx client and gRPC channel, send back to back
  a mix of JSON infer, binary-extension infer, gRPC infer (1 to 4 rows) and metadata reads, to
  ``hot`` and, in the first half of the cycle only (``--calm`` 0.5), to the churn models: the
  churn half evicts all along, the calm half lets idle timers run out (an eviction would
  otherwise always come first). Every answer is checked against onnxruntime run in this
  process on the same input: each value within rtol 1e-5 / atol 1e-6, or else each row within
  1e-5 of its largest value (a 1024-wide layer summed in another order, pre-packed or batched
  with other rows, moves near-zero outputs by ~1e-6; a wrong answer misses by the row's scale);
- the same threads mix in bad requests that must get their own answer (wrong shape, element
  count, datatype or input name, garbage JSON, an unknown model, a binary header longer than
  the body: 400 or 404; gRPC: NOT_FOUND, INVALID_ARGUMENT), and clients that leave mid-request:
  raw sockets that send half a body, a whole request, or only headers with a reset, then close;
  an httpx read timeout of a few ms; gRPC calls cancelled or given a deadline of a few ms;
- one thread sends to the ``blink`` models (idle unload, rehydration), one calls repository
  load and unload (HTTP and gRPC) on a random non-pinned model every ~``--admin-every`` s (3).

Then a **quiet point**: every client finishes its request and closes its connections, the
script unloads every non-pinned model, waits until nothing is in flight, loading or reserved,
and reads the daemon's RSS, open file descriptors and threads (psutil on its pid) and its
asyncio tasks (``process`` in ``/admin/status``, counted on the event loop) until the three
counts are equal on three reads in a row (0.25 s apart, at most 10 s); then what the fds are
(by kind: TCP by port and state, pipes, files…) and the threads' names. A sampler thread also
reads the counts every ``--sample-interval`` (2 s) between quiet points, for the peaks.

**Why quiet points.** Tasks, threads and descriptors move with the traffic: a request in flight
is a task, a connection an fd, a loaded model a worker thread. Sampled at random moments they
differ by whatever happened to be in flight, so "grew at all" would be noise. At a quiet point
the daemon holds the same things every time (the pinned model, its listeners, one keep-alive
connection of this script), so the same count is expected to the unit, and anything more is
something a past cycle left behind. A phase's figure is the **minimum** over its quiet points:
a leak raises the floor for good, while a straggler still closing can only add to one reading.
RSS is compared by the **median** of the quiet points (the models unloaded and trimmed each
time). The peaks of the background samples are shown, not compared.

**Phases.** The cycles that start after ``--warm-up`` (20% of the duration, or seconds) are
split into ``--phases`` (4) groups of consecutive cycles of equal size. Warm-up fills the pools
that grow once and stay (the daemon's loader threads, allocator arenas, the weights cache).

The run **fails** (exit 1) when, from one phase to the next, RSS grows by more than 5% or open
fds, threads or asyncio tasks grow at all; when any answer is wrong, any good request fails, or
a bad request gets an unexpected answer; when the daemon logs an ERROR line or a traceback
(other than the known, harmless ones in ``KNOWN_ERRORS``, which are reported), dies, or
doesn't exit 0 on SIGTERM; or when the run didn't exercise what it claims (no idle unload,
eviction, repository call, disconnect, bad request or gRPC call). RSS from the first phase to
the last is reported too, not judged: a step that stays (an allocator arena) is no leak, and a
leak shows phase over phase. It prints a markdown report (per-phase and per-cycle tables, and
what the daemon held at each quiet point that differed); ``--out FILE`` writes it there,
``--json FILE`` every cycle and sample.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import psutil
from harness import (
    Daemon,
    binary_request,
    command_line,
    grpc_output,
    grpc_request,
    http_output,
    json_request,
    machine_line,
    new_session,
    wait_ready,
)
from models import write_bench_mlp, write_embedding, write_mlp

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

MIB = 1024 * 1024
RTOL, ATOL = 1e-5, 1e-6
CASES_PER_MODEL = 12
MAX_ROWS = 4
GOOD_TIMEOUT_S = 60.0
PARK_TIMEOUT_S = 90.0  # clients finishing their last request at a quiet point
QUIET_TIMEOUT_S = 60.0  # models unloaded and nothing in flight
SETTLE_READS = 3
SETTLE_INTERVAL_S = 0.25
SETTLE_TIMEOUT_S = 10.0
RSS_GROWTH_LIMIT = 0.05
BLINK_IDLE_S = 2.0
CHURN_IDLE_S = 3.0
EXAMPLES = 5  # first examples kept per problem
JSON_HEADERS = {"Content-Type": "application/json"}
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z (?P<level>[A-Z]+) (?P<event>\S+)(?P<rest>.*)$")
REASON = re.compile(r"\breason=(\S+)")
STATUS = re.compile(r"\bstatus=(\d+)")
RECORD_LINES = 30  # lines kept of one ERROR record (its traceback)
# ERROR records that are not the daemon's fault, with why: counted and shown, never failed on.
# Harmless ERROR lines, reported rather than failed on (none now: grpcio's "ExecuteBatchError"
# after a client's cancel is a debug event of the daemon's own, logs.py).
KNOWN_ERRORS: dict[str, tuple[re.Pattern[str], str]] = {}
CLIENT_KINDS = ("http_json", "http_binary", "grpc", "metadata", "bad", "disconnect", "blink",
                "admin")
PROBLEMS = ("wrong", "failed", "unexpected", "soak_error")


# --- models -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One request, pre-encoded three ways, and onnxruntime's answer to it."""

    model_input: np.ndarray
    expected: np.ndarray
    json_body: bytes
    binary_body: bytes
    header_length: int
    grpc: Any  # ModelInferRequest


@dataclass
class ServedModel:
    name: str
    role: str  # hot, blink or churn
    file: str
    width: int  # of input x
    settings: str  # the entry's TOML lines after name and path
    cases: list[Case] = field(default_factory=list)

    @property
    def pinned(self) -> bool:
        return self.role == "hot"


def write_models(folder: Path, churn: int, seed: int) -> list[ServedModel]:
    """The models' files, their entries, and CASES_PER_MODEL requests each with onnxruntime's
    answers (seeded)."""
    blink_idle = f'idle_timeout = "{BLINK_IDLE_S:g}s"'
    served = [
        ServedModel("hot", "hot", "hot.onnx", 64, 'idle_timeout = "never"\npreload = true'),
        ServedModel("blink", "blink", "blink.onnx", 16, blink_idle),
        ServedModel("blink-nb", "blink", "blink_nb.onnx", 96,
                    f"{blink_idle}\n[models.batching]\nmax_batch_size = 1"),
    ]
    write_bench_mlp(folder / "hot.onnx")
    write_mlp(folder / "blink.onnx", (16, 32, 8), seed=1)
    write_embedding(folder / "blink_nb.onnx", width=96, seed=2)
    for i in range(churn):
        write_mlp(folder / f"churn_{i}.onnx", (128, 1024, 1024, 128), seed=10 + i)
        served.append(ServedModel(
            f"churn-{i}", "churn", f"churn_{i}.onnx", 128,
            f'idle_timeout = "{CHURN_IDLE_S:g}s"\n[models.batching]\n'
            f'max_delay = "{"1ms" if i % 2 else "0ms"}"'))
    rng = np.random.default_rng(seed)
    for model in served:
        session = new_session(folder / model.file)
        for _ in range(CASES_PER_MODEL):
            rows = int(rng.integers(1, MAX_ROWS + 1))
            x = rng.uniform(-1, 1, size=(rows, model.width)).astype(np.float32)
            expected = np.asarray(session.run(["y"], {"x": x})[0])
            body, header_length = binary_request(x)
            model.cases.append(Case(x, expected, json_request(x), body, header_length,
                                    grpc_request(model.name, x)))
    return served


def write_config(folder: Path, models: Sequence[ServedModel], budget: str) -> Path:
    entries = "".join(f'\n[[models]]\nname = "{m.name}"\npath = "{m.file}"\n{m.settings}\n'
                      for m in models)
    config = folder / "models.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nidle_timeout = "30s"\ncache_dir = "cache"\n'
        f'drain_timeout = "10s"\n\n[server.memory]\nhost_budget = "{budget}"\n{entries}',
        encoding="utf-8",
    )
    return config


# --- what the clients saw -------------------------------------------------------------------


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
        match = LOG_LINE.match(line)
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
            event, rest = match["event"], match["rest"]
            self.counts[event] += 1
            if event == "model_unloaded" and (reason := REASON.search(rest)):
                self.counts[f"unloaded:{reason.group(1)}"] += 1
            if event == "request_failed" and (status := STATUS.search(rest)):
                self.counts[f"request_failed:{status.group(1)}"] += 1
            if match["level"] not in ("ERROR", "CRITICAL"):
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


# --- clients --------------------------------------------------------------------------------


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
        self.grpc = pb_grpc.GRPCInferenceServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.http.close()
        self.channel.close()


@dataclass
class Traffic:
    """What every client thread shares."""

    daemon: Daemon
    models: list[ServedModel]
    gate: Gate
    tally: Tally
    churn_until: float = 0.0  # monotonic time: the workers send to churn models until then

    def check(self, label: str, got: np.ndarray, case: Case) -> None:
        if not answer_matches(got, case.expected):
            expected = case.expected
            diff = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else None
            self.tally.problem("wrong", f"{label}: shape {got.shape} {got.dtype}, expected "
                               f"{expected.shape} {expected.dtype}; max abs diff {diff}")

    # good requests

    def http_infer(self, c: Clients, model: ServedModel, case: Case, binary: bool) -> None:
        label = f"{'http_binary' if binary else 'http_json'} {model.name}"
        if binary:
            headers = {"Content-Type": "application/octet-stream",
                       "Inference-Header-Content-Length": str(case.header_length)}
            body = case.binary_body
        else:
            headers, body = JSON_HEADERS, case.json_body
        try:
            response = c.http.post(f"/v2/models/{model.name}/infer", content=body,
                                   headers=headers)
        except httpx.HTTPError as exc:
            self.tally.problem("failed", f"{label}: {exc!r}")
            return
        if response.status_code != 200:
            self.tally.problem("failed", f"{label}: {response.status_code} "
                               f"{response.text[:300]}")
            return
        header_length = response.headers.get("inference-header-content-length")
        self.check(label, http_output(response.content, header_length), case)

    def grpc_infer(self, c: Clients, model: ServedModel, case: Case) -> None:
        try:
            response = c.grpc.ModelInfer(case.grpc, timeout=GOOD_TIMEOUT_S)
        except grpc.RpcError as exc:
            self.tally.problem("failed", f"grpc {model.name}: {_rpc_error(exc)}")
            return
        self.check(f"grpc {model.name}", grpc_output(response), case)

    def infer(self, c: Clients, rng: random.Random, model: ServedModel) -> str:
        case = rng.choice(model.cases)
        kind = rng.choice(("http_json", "http_binary", "grpc"))
        if kind == "grpc":
            self.grpc_infer(c, model, case)
        else:
            self.http_infer(c, model, case, binary=kind == "http_binary")
        return kind

    def metadata(self, c: Clients, rng: random.Random, model: ServedModel) -> str | None:
        try:
            if rng.random() < 0.5:
                response = c.http.get(f"/v2/models/{model.name}")
                name = response.json().get("name") if response.status_code == 200 else None
                outcome = f"{response.status_code} {response.text[:200]}"
            else:
                reply = c.grpc.ModelMetadata(pb.ModelMetadataRequest(name=model.name),
                                             timeout=GOOD_TIMEOUT_S)
                name, outcome = reply.name, f"name {reply.name!r}"
        except (httpx.HTTPError, grpc.RpcError) as exc:
            name, outcome = None, _rpc_error(exc) if isinstance(exc, grpc.RpcError) else repr(exc)
        if name != model.name:
            self.tally.problem("failed", f"metadata {model.name}: {outcome}")
        return None

    # bad requests: each must get its own 4xx (or gRPC code), and nothing else

    def bad(self, c: Clients, rng: random.Random, model: ServedModel) -> str | None:
        w, name = model.width, model.name
        x = [0.5] * w

        def doc(tensor: dict[str, Any]) -> bytes:
            return orjson.dumps({"inputs": [{"name": "x", "shape": [1, w], "datatype": "FP32",
                                             "data": x, **tensor}]})

        http_cases: list[tuple[str, str, bytes, dict[str, str], int]] = [
            ("wrong shape", name, doc({"shape": [1, w + 1], "data": [*x, 0.5]}), {}, 400),
            ("element count", name, doc({"data": x[:-1]}), {}, 400),
            ("wrong datatype", name, doc({"datatype": "FP64"}), {}, 400),
            ("unknown input", name, doc({"name": "nope"}), {}, 400),
            ("garbage JSON", name, b'{"inputs": [{"name": "x", "shape": [1,', {}, 400),
            ("unknown model", "no-such-model", doc({}), {}, 404),
            ("binary header past the body", name, model.cases[0].binary_body,
             {"Inference-Header-Content-Length": str(len(model.cases[0].binary_body) + 8)}, 400),
        ]
        choice = rng.randrange(len(http_cases) + 2)
        if choice < len(http_cases):
            label, target, body, extra, want = http_cases[choice]
            headers = {**JSON_HEADERS, **extra}
            try:
                response = c.http.post(f"/v2/models/{target}/infer", content=body,
                                       headers=headers)
            except httpx.HTTPError as exc:
                self.tally.problem("failed", f"bad http ({label}) {name}: {exc!r}")
                return None
            if response.status_code != want or "error" not in response.text:
                self.tally.problem("unexpected", f"bad http ({label}) {name}: wanted {want}, "
                                   f"got {response.status_code} {response.text[:200]}")
            return None
        want_code: grpc.StatusCode
        if choice == len(http_cases):
            label, want_code = "unknown model", grpc.StatusCode.NOT_FOUND
            request = grpc_request("no-such-model", model.cases[0].model_input)
        else:
            label, want_code = "short raw contents", grpc.StatusCode.INVALID_ARGUMENT
            request = pb.ModelInferRequest()
            request.CopyFrom(model.cases[0].grpc)
            request.raw_input_contents[0] = request.raw_input_contents[0][:-4]
        try:
            c.grpc.ModelInfer(request, timeout=GOOD_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() != want_code:
                self.tally.problem("unexpected", f"bad grpc ({label}) {name}: wanted {want_code}, "
                                   f"got {_rpc_error(exc)}")
            return None
        self.tally.problem("unexpected", f"bad grpc ({label}) {name}: answered OK")
        return None

    # clients that leave before the answer

    def disconnect(self, c: Clients, rng: random.Random, model: ServedModel) -> str | None:
        self._disconnect(c, rng, model)
        return None

    def _disconnect(self, c: Clients, rng: random.Random, model: ServedModel) -> None:
        case = rng.choice(model.cases)
        choice = rng.randrange(6)
        if choice < 3:
            self._raw_socket(rng, model, case, choice)
        elif choice == 3:  # httpx gives up reading after a few ms and drops the connection
            timeout = httpx.Timeout(GOOD_TIMEOUT_S, read=rng.uniform(0.0005, 0.005))
            try:
                response = c.http.post(f"/v2/models/{model.name}/infer",
                                       content=case.json_body, headers=JSON_HEADERS,
                                       timeout=timeout)
            except httpx.TimeoutException:
                return
            except httpx.HTTPError as exc:
                self.tally.problem("failed", f"http read timeout {model.name}: {exc!r}")
                return
            if response.status_code != 200:
                self.tally.problem("failed", f"http read timeout {model.name}: "
                                   f"{response.status_code} {response.text[:200]}")
                return
            self.check(f"http read timeout {model.name}", http_output(response.content, None),
                       case)
        elif choice == 4:  # a gRPC call cancelled mid-flight
            future = c.grpc.ModelInfer.future(case.grpc, timeout=GOOD_TIMEOUT_S)
            time.sleep(rng.uniform(0, 0.004))
            if not future.cancel():
                self._grpc_outcome(f"grpc cancel {model.name}", future.exception, future.result,
                                   case, grpc.StatusCode.CANCELLED)
        else:  # a gRPC deadline of a few ms
            future = c.grpc.ModelInfer.future(case.grpc, timeout=rng.uniform(0.0005, 0.005))
            self._grpc_outcome(f"grpc deadline {model.name}", future.exception, future.result,
                               case, grpc.StatusCode.DEADLINE_EXCEEDED)

    def _grpc_outcome(self, label: str, exception: Callable[[], Any],
                      result: Callable[[], Any], case: Case, allowed: grpc.StatusCode) -> None:
        try:
            error = exception()
        except grpc.FutureCancelledError:
            return
        if error is None:
            self.check(label, grpc_output(result()), case)
        elif not isinstance(error, grpc.RpcError) or error.code() not in (
            allowed, grpc.StatusCode.CANCELLED
        ):
            self.tally.problem("failed", f"{label}: {_rpc_error(error)}")

    def _raw_socket(self, rng: random.Random, model: ServedModel, case: Case, how: int) -> None:
        body = case.json_body
        head = (f"POST /v2/models/{model.name}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        try:
            with socket.create_connection(("127.0.0.1", self.daemon.http_port), 10) as sock:
                if how == 0:  # half the body, a moment, then gone
                    sock.sendall(head + body[: len(body) // 2])
                    time.sleep(rng.uniform(0, 0.02))
                elif how == 1:  # the whole request, then gone before the answer
                    sock.sendall(head + body)
                else:  # the headers only, then a reset instead of a close
                    sock.sendall(head)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError as exc:
            self.tally.problem("failed", f"raw socket {model.name}: {exc!r}")

    # repository

    def admin(self, c: Clients, rng: random.Random, model: ServedModel) -> str | None:
        self._admin(c, rng, model)
        return None

    def _admin(self, c: Clients, rng: random.Random, model: ServedModel) -> None:
        action = rng.choice(("load", "unload"))
        try:
            if rng.random() < 0.5:
                response = c.http.post(f"/v2/repository/models/{model.name}/{action}")
                if response.status_code != 200:
                    self.tally.problem("failed", f"http {action} {model.name}: "
                                       f"{response.status_code} {response.text[:200]}")
            elif action == "load":
                c.grpc.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=model.name),
                                           timeout=GOOD_TIMEOUT_S)
            else:
                c.grpc.RepositoryModelUnload(
                    pb.RepositoryModelUnloadRequest(model_name=model.name), timeout=GOOD_TIMEOUT_S)
        except grpc.RpcError as exc:
            self.tally.problem("failed", f"grpc {action} {model.name}: {_rpc_error(exc)}")
        except httpx.HTTPError as exc:
            self.tally.problem("failed", f"http {action} {model.name}: {exc!r}")


def answer_matches(got: np.ndarray, expected: np.ndarray) -> bool:
    """Same shape and dtype, and each value within rtol 1e-5 / atol 1e-6 of onnxruntime's, or
    else each row within 1e-5 of that row's largest value: a 1024-wide layer summed in another
    order (pre-packed weights, rows batched with other requests') moves a near-zero output by
    about 1e-6, while a wrong answer (another row, model or garbage) misses by the row's scale."""
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return False
    if np.allclose(got, expected, rtol=RTOL, atol=ATOL):
        return True
    rows = max(1, expected.shape[0]) if expected.ndim else 1
    diff = np.abs(got - expected).reshape(rows, -1)
    scale = np.maximum(np.abs(expected).reshape(rows, -1).max(axis=1), 1.0)
    return bool(np.all(diff.max(axis=1) <= RTOL * scale))


def _rpc_error(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else ""
        return f"{code} {str(details)[:200]}"
    return repr(exc)


def _session(traffic: Traffic, body: Callable[[Clients], None]) -> None:
    """Run `body` once per cycle, inside the gate, with fresh connections."""
    while traffic.gate.enter():
        clients = Clients(traffic.daemon)
        try:
            body(clients)
        finally:
            clients.close()
            traffic.gate.leave()


def _guarded(traffic: Traffic, action: Callable[..., str | None], *args: Any) -> str | None:
    try:
        return action(*args)
    except Exception as exc:  # a bug of this script: counted (it fails the run), not fatal
        traffic.tally.problem("soak_error", repr(exc))
        return None


def worker(traffic: Traffic, seed: str) -> None:
    rng = random.Random(seed)
    hot = [m for m in traffic.models if m.role == "hot"]
    churn = [m for m in traffic.models if m.role == "churn"]
    actions: dict[str, Callable[[Clients, random.Random, ServedModel], str | None]] = {
        "infer": traffic.infer, "metadata": traffic.metadata, "bad": traffic.bad,
        "disconnect": traffic.disconnect,
    }
    weights = (72, 4, 12, 12)

    def cycle(c: Clients) -> None:
        while traffic.gate.is_open:
            churning = time.monotonic() < traffic.churn_until
            model = rng.choice(churn) if churning and rng.random() < 0.6 else rng.choice(hot)
            kind = rng.choices(list(actions), weights)[0]
            # infer answers which protocol it used; the others count under their own kind
            traffic.tally.count(_guarded(traffic, actions[kind], c, rng, model) or kind)

    _session(traffic, cycle)


def blinker(traffic: Traffic, seed: str) -> None:
    """Requests to the blink models more than their idle timeout apart."""
    rng = random.Random(seed)
    blinks = [m for m in traffic.models if m.role == "blink"]

    def cycle(c: Clients) -> None:
        while traffic.gate.pause(rng.uniform(BLINK_IDLE_S + 0.3, BLINK_IDLE_S + 1.5)):
            _guarded(traffic, traffic.infer, c, rng, rng.choice(blinks))
            traffic.tally.count("blink")

    _session(traffic, cycle)


def admin(traffic: Traffic, seed: str, every_s: float) -> None:
    """Repository load or unload of a random non-pinned model, every ~`every_s` seconds."""
    rng = random.Random(seed)
    targets = [m for m in traffic.models if not m.pinned]

    def cycle(c: Clients) -> None:
        while traffic.gate.pause(rng.uniform(0.5, 1.5) * every_s):
            _guarded(traffic, traffic.admin, c, rng, rng.choice(targets))
            traffic.tally.count("admin")

    _session(traffic, cycle)


# --- measuring ------------------------------------------------------------------------------


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


# --- the run --------------------------------------------------------------------------------


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


def soak(args: argparse.Namespace) -> Run:
    log = LogWatch()
    with tempfile.TemporaryDirectory(prefix="snooze-soak-") as tmp:
        folder = Path(tmp)
        models = write_models(folder, args.churn, args.seed)
        daemon = Daemon(args.python, write_config(folder, models, args.budget),
                        on_line=log.on_line)
        print(f"daemon up: http={daemon.http_port} grpc={daemon.grpc_port} pid={daemon.pid}",
              file=sys.stderr)
        start = time.monotonic()
        tally, gate = Tally(start), Gate()
        probe = Probe(daemon, start, tmp)
        died = threading.Event()

        def on_death() -> None:
            died.set()
            gate.stop()

        sampler = Sampler(probe, args.sample_interval, on_death)
        traffic = Traffic(daemon, models, gate, tally)
        threads = [threading.Thread(target=worker, args=(traffic, f"{args.seed}-w{i}"),
                                    name=f"soak-worker-{i}", daemon=True)
                   for i in range(args.clients)]
        threads.append(threading.Thread(target=blinker, args=(traffic, f"{args.seed}-blink"),
                                        name="soak-blinker", daemon=True))
        threads.append(threading.Thread(target=admin, name="soak-admin", daemon=True,
                                        args=(traffic, f"{args.seed}-admin", args.admin_every)))
        cycles: list[Cycle] = []
        final_models: list[dict[str, Any]] = []
        aborted: str | None = None
        try:
            wait_ready(probe.client, "/health/ready")
            for thread in threads:
                thread.start()
            sampler.start()
            while time.monotonic() - start + args.cycle / 2 < args.duration and not died.is_set():
                began = time.monotonic() - start
                traffic_s = min(args.cycle, args.duration - began)
                traffic.churn_until = time.monotonic() + traffic_s * (1 - args.calm)
                gate.open()
                gate.pause(traffic_s)
                reading, settled, settle_s, held = quiet_point(probe, gate, models, tally)
                cycles.append(Cycle(len(cycles), round(began, 2), round(traffic_s, 2), reading,
                                    settled, round(settle_s, 2),
                                    dict(tally.snapshot() + log.snapshot()), held))
                print(f"cycle {len(cycles)}: t={reading.t:.0f}s rss={reading.rss_bytes / MIB:.1f}"
                      f"MiB fds={reading.open_fds} threads={reading.threads} "
                      f"tasks={reading.asyncio_tasks} problems="
                      f"{sum(tally.counts[p] for p in PROBLEMS)}", file=sys.stderr)
            if died.is_set():
                raise SoakAbort("the daemon died")
            final_models = [{k: m[k] for k in ("name", "measured_bytes", "loads")}
                            for m in probe.status()["models"]]
        except (SoakAbort, httpx.HTTPError, psutil.Error) as exc:
            aborted = f"{type(exc).__name__}: {exc}"
        finally:
            gate.stop()
            for thread in threads:
                thread.join(timeout=PARK_TIMEOUT_S)
            sampler.stop()
            probe.close()
            elapsed = time.monotonic() - start
            exit_code = daemon.stop(timeout_s=60)
            if aborted:
                print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
        return Run(cycles, sampler.readings, _warm_up_s(args.warm_up, args.duration), tally, log,
                   exit_code, aborted, models, args.budget, elapsed, final_models)


# --- phases and verdict ---------------------------------------------------------------------


@dataclass
class Phase:
    label: str
    cycles: list[Cycle]
    before: dict[str, int]  # cumulative counts at the end of the cycle before it
    samples: list[Reading]

    def floor(self, metric: str) -> int:
        return min(int(getattr(c.quiet, metric)) for c in self.cycles)

    @property
    def rss(self) -> float:
        return float(statistics.median(c.quiet.rss_bytes for c in self.cycles))

    def peak(self, metric: str) -> int | None:
        values = [int(getattr(s, metric)) for s in self.samples]
        return max(values) if values else None

    def delta(self, *keys: str) -> int:
        end = self.cycles[-1].counts
        return sum(end.get(k, 0) - self.before.get(k, 0) for k in keys)


def phases(run: Run, count: int) -> tuple[Phase | None, list[Phase]]:
    """The warm-up and the `count` equal phases after it (fewer when cycles are short)."""
    warm = [c for c in run.cycles if c.start < run.warm_up_s]
    rest = [c for c in run.cycles if c.start >= run.warm_up_s]
    groups = [list(g) for g in np.array_split(np.arange(len(rest)), min(count, len(rest)))
              ] if rest else []
    result: list[Phase] = []
    for number, indices in enumerate(groups, 1):
        chosen = [rest[i] for i in indices]
        result.append(_phase(run, f"{number}", chosen))
    return (_phase(run, "warm-up", warm) if warm else None), result


def _phase(run: Run, label: str, cycles: list[Cycle]) -> Phase:
    first = cycles[0].index
    before = run.cycles[first - 1].counts if first > 0 else {}
    start = cycles[0].start
    end = cycles[-1].quiet.t
    samples = [s for s in run.samples if start <= s.t <= end]
    return Phase(label, cycles, before, samples)


def verdict(run: Run, compared: list[Phase]) -> list[str]:
    """Every reason the run fails; empty when it passes."""
    reasons: list[str] = []
    totals = Counter(run.tally.snapshot() + run.log.snapshot())
    if run.aborted:
        reasons.append(f"the run stopped early: {run.aborted}")
    if run.exit_code != 0:
        reasons.append(f"the daemon exited with {run.exit_code} on SIGTERM, not 0")
    elif not totals["server_stopped"]:
        reasons.append("the daemon exited without its server_stopped line")
    for problem, what in (("wrong", "wrong answers"), ("failed", "good requests failed"),
                          ("unexpected", "bad requests got an unexpected answer"),
                          ("soak_error", "errors in the soak script itself")):
        if totals[problem]:
            reasons.append(f"{totals[problem]} {what}: " + "; ".join(run.tally.examples[problem]))
    if totals["error_lines"] or totals["tracebacks"]:
        reasons.append(f"{totals['error_lines']} ERROR lines and {totals['tracebacks']} other "
                       f"tracebacks in the daemon log, first: {run.log.errors[0][0]}")
    if len(compared) < 2:
        reasons.append(f"only {len(compared)} phase(s) after the warm-up: nothing to compare "
                       "(a longer --duration, a shorter --cycle or --warm-up)")
    for a, b in itertools.pairwise(compared):
        if b.rss > a.rss * (1 + RSS_GROWTH_LIMIT):
            reasons.append(f"RSS grew {b.rss / a.rss - 1:.1%} from phase {a.label} "
                           f"({a.rss / MIB:.1f} MiB) to phase {b.label} ({b.rss / MIB:.1f} MiB)")
        for metric in ("open_fds", "threads", "asyncio_tasks"):
            if b.floor(metric) > a.floor(metric):
                reasons.append(f"{metric} grew from {a.floor(metric)} in phase {a.label} to "
                               f"{b.floor(metric)} in phase {b.label}")
    coverage = {
        "idle unloads": totals["unloaded:idle"],
        "evictions": totals["unloaded:memory_pressure"],
        "repository calls": totals["admin"],
        "client disconnects": totals["disconnect"],
        "bad requests": totals["bad"],
        "gRPC requests": totals["grpc"],
    }
    missing = [what for what, n in coverage.items() if not n]
    if missing:
        reasons.append("the run never exercised: " + ", ".join(missing))
    return reasons


# --- report ---------------------------------------------------------------------------------


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / MIB:.1f}"


def _n(value: int | None) -> str:
    return "—" if value is None else str(value)


def report(run: Run, args: argparse.Namespace, machine: str) -> tuple[str, bool]:
    warm, compared = phases(run, args.phases)
    reasons = verdict(run, compared)
    totals = Counter(run.tally.snapshot() + run.log.snapshot())
    lines = [
        "# SnoozeML soak",
        "",
        f"- Machine: {machine}",
        f"- Command: `{command_line()}`",
        f"- Ran {run.elapsed_s:.0f} s: {len(run.cycles)} cycles of {args.cycle:g} s traffic "
        f"and a quiet point; warm-up {run.warm_up_s:.0f} s, then {len(compared)} phases. "
        f"{args.clients} clients, host budget {run.budget}, models "
        + ", ".join(f"`{m.name}`" for m in run.models) + ".",
        "",
        "## Per phase",
        "",
        "Quiet-point figures (all traffic stopped, every non-pinned model unloaded): RSS is the "
        "median, fds, threads and tasks the minimum over the phase's quiet points; these are "
        "compared. Peaks are the highest of the background samples, under traffic. Requests "
        "and daemon events are counted over the phase.",
        "",
        "| phase | cycles | RSS MiB | fds | threads | tasks | peak RSS MiB | peak fds | "
        "peak threads | peak tasks | infer | meta | bad | disc. | blink | admin | wrong | "
        "failed | loads | idle unl. | admin unl. | evicted | 5xx logged |",
        "| --- |" + " ---: |" * 22,
    ]
    for phase in ([warm] if warm else []) + compared:
        lines.append(
            f"| {phase.label} | {len(phase.cycles)} | {_mib(phase.rss)} | "
            f"{phase.floor('open_fds')} | {phase.floor('threads')} | "
            f"{phase.floor('asyncio_tasks')} | {_mib(phase.peak('rss_bytes'))} | "
            f"{_n(phase.peak('open_fds'))} | {_n(phase.peak('threads'))} | "
            f"{_n(phase.peak('asyncio_tasks'))} | "
            f"{phase.delta('http_json', 'http_binary', 'grpc')} | {phase.delta('metadata')} | "
            f"{phase.delta('bad')} | {phase.delta('disconnect')} | {phase.delta('blink')} | "
            f"{phase.delta('admin')} | {phase.delta('wrong')} | "
            f"{phase.delta('failed', 'unexpected')} | {phase.delta('model_loaded')} | "
            f"{phase.delta('unloaded:idle')} | {phase.delta('unloaded:admin')} | "
            f"{phase.delta('unloaded:memory_pressure')} | {phase.delta('request_failed')} |"
        )
    lines += [
        "",
        "## Totals",
        "",
        f"- Requests: {totals['http_json']} JSON, {totals['http_binary']} binary, "
        f"{totals['grpc']} gRPC infer, {totals['blink']} to the blink models, {totals['metadata']} "
        f"metadata, {totals['bad']} bad, {totals['disconnect']} disconnects or cancels, "
        f"{totals['admin']} repository calls.",
        f"- Problems: {totals['wrong']} wrong answers, {totals['failed']} failed good requests, "
        f"{totals['unexpected']} unexpected answers to bad requests, {totals['soak_error']} "
        "soak errors.",
        f"- Daemon: {totals['model_loaded']} loads, unloads {totals['unloaded:idle']} idle / "
        f"{totals['unloaded:admin']} admin / {totals['unloaded:memory_pressure']} evicted / "
        f"{totals['unloaded:oom']} OOM, {totals['model_load_deferred']} loads deferred for "
        f"memory, {totals['model_load_failed']} load failures; request_failed by status: "
        + (", ".join(f"{k.split(':')[1]}: {v}" for k, v in sorted(totals.items())
                     if k.startswith("request_failed:")) or "none")
        + f"; {totals['error_lines']} unknown ERROR lines, {totals['tracebacks']} other "
        "tracebacks, known ERROR records: "
        + (", ".join(f"{k} {totals['known:' + k]}" for k in KNOWN_ERRORS
                     if totals["known:" + k]) or "none")
        + f"; exit code {run.exit_code}.",
        "- Models at the end (measured size of the last load, loads): "
        + ", ".join(f"`{m['name']}` {_mib(m['measured_bytes'])} MiB {m['loads']}"
                    for m in run.final_models) + ".",
        f"- RSS at the quiet points, first phase to last: {_growth(compared)} (compared "
        "phase to phase only: a step that stays, an allocator's arena, isn't a leak).",
        f"- Quiet points: {sum(c.settled for c in run.cycles)} of {len(run.cycles)} settled "
        f"(three equal reads), median settle {_median([c.settle_s for c in run.cycles])} s. "
        f"This script's own fds/threads at the quiet points: "
        f"{_span([c.quiet.soak_fds for c in run.cycles])} / "
        f"{_span([c.quiet.soak_threads for c in run.cycles])}.",
        "",
        "## Per cycle (quiet points)",
        "",
        "| cycle | t s | RSS MiB | fds | threads | tasks | settled | requests |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    previous = 0
    for cycle in run.cycles:
        sent = sum(cycle.counts.get(k, 0) for k in CLIENT_KINDS)
        lines.append(f"| {cycle.index + 1} | {cycle.quiet.t:.0f} | "
                     f"{_mib(cycle.quiet.rss_bytes)} | {cycle.quiet.open_fds} | "
                     f"{cycle.quiet.threads} | {cycle.quiet.asyncio_tasks} | "
                     f"{'yes' if cycle.settled else 'no'} | {sent - previous} |")
        previous = sent
    lines += _held(compared)
    if run.log.errors or run.log.known or run.log.other:
        lines += ["", "## Daemon log records of note", ""]
        for record in run.log.errors:
            lines += ["Unknown ERROR (fails the run):", "", "```", *record, "```", ""]
        for kind, record in run.log.known.items():
            lines += [f"Known, {totals['known:' + kind]} times (reported, not failed on): "
                      f"{KNOWN_ERRORS[kind][1]} The first:", "", "```", *record, "```", ""]
        if run.log.other:
            lines += ["Lines outside the log format:", "", "```", *run.log.other, "```"]
    lines += ["", "## Verdict", ""]
    lines += [f"- FAIL: {reason}" for reason in reasons] if reasons else [
        "PASS: no wrong answer, no failed good request, no log error, and from phase to phase "
        "RSS within 5% and no growth of fds, threads or asyncio tasks."]
    return "\n".join(lines) + "\n", not reasons


def _growth(compared: list[Phase]) -> str:
    if len(compared) < 2:
        return "—"
    first, last = compared[0].rss, compared[-1].rss
    return f"{_mib(first)} to {_mib(last)} MiB ({last / first - 1:+.1%})"


def _held(compared: list[Phase]) -> list[str]:
    """The first compared quiet point's fds and threads by kind, and how each later one
    differed from it: what a growth, or a straggler, was."""
    cycles = [cycle for phase in compared for cycle in phase.cycles]
    if not cycles:
        return []
    base = cycles[0]
    lines = ["", "## What the daemon held at the quiet points", "",
             f"Cycle {base.index + 1}, the first compared: fds "
             + _kinds(base.held["fds"]) + "; threads " + _kinds(base.held["threads"]) + ".", ""]
    changes = []
    for cycle in cycles[1:]:
        moved = [f"{after - before:+d} {what} {key}"
                 for what in ("fds", "threads")
                 for key in sorted(set(base.held[what]) | set(cycle.held[what]))
                 if (after := cycle.held[what].get(key, 0))
                 != (before := base.held[what].get(key, 0))]
        if moved:
            changes.append(f"- cycle {cycle.index + 1}: " + ", ".join(moved))
    return lines + (changes[:20] or ["Every later quiet point held the same."])


def _kinds(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def _median(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "—"


def _span(values: Sequence[int]) -> str:
    return "—" if not values else (f"{min(values)}" if min(values) == max(values)
                                   else f"{min(values)} to {max(values)}")


# --- command line ---------------------------------------------------------------------------


def duration_s(text: str) -> float:
    """`600`, `90s`, `10m` or `1h` as seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    text = text.strip()
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


def _warm_up_s(text: str, duration: float) -> float:
    text = text.strip()
    return duration * float(text[:-1]) / 100 if text.endswith("%") else duration_s(text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=duration_s, default=600.0,
                        help="how long traffic runs: seconds, or 90s, 10m, 1h (default 10m)")
    parser.add_argument("--warm-up", default="20%",
                        help="cycles starting before this are not compared: a share of "
                        "--duration (20%%) or a duration")
    parser.add_argument("--phases", type=int, default=4, help="phases compared after warm-up")
    parser.add_argument("--cycle", type=duration_s, default=10.0,
                        help="seconds of traffic between two quiet points (default 10)")
    parser.add_argument("--calm", type=float, default=0.5,
                        help="share of each cycle, at its end, without churn traffic (0.5)")
    parser.add_argument("--sample-interval", type=duration_s, default=2.0,
                        help="seconds between background samples (default 2)")
    parser.add_argument("--clients", type=int, default=4, help="traffic threads (default 4)")
    parser.add_argument("--churn", type=int, default=8, help="churn models (default 8)")
    parser.add_argument("--budget", default="40MiB", help="host_budget (default 40MiB)")
    parser.add_argument("--admin-every", type=duration_s, default=3.0,
                        help="mean seconds between repository calls (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    parser.add_argument("--json", type=Path, help="also write every cycle and sample here")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs -m snoozeml serve")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_line()
    run = soak(args)
    text, passed = report(run, args, machine)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps({
            "cycles": [asdict(c) for c in run.cycles],
            "samples": [asdict(s) for s in run.samples],
            "warm_up_s": run.warm_up_s,
        }, indent=1), encoding="utf-8")
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
