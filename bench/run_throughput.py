"""Throughput under load (issue 19, part 1): what the daemon costs beside what the model costs.

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_throughput.py [--duration 5] [--rounds 2] [--out FILE]

One daemon serves four preloaded, pinned models, each ``intra_op_threads = 1`` with batching at
the server's defaults (``max_batch_size = 32``, ``max_delay = 0``):

  ``null-64``, ``null-512``  one Relu, FP32 [batch, N] -> [batch, N]: the daemon's own cost
  ``mlp-64``, ``mlp-512``    MLP N -> 4N -> 4N -> N (512 is issue 3's 512-2048-2048-512)

Every request carries one row. For each width, encoding (JSON HTTP and binary HTTP through wrk
and ``post.lua``; gRPC through ``grpc_load.py``, a grpc.aio client in its own process) and
concurrency (1, 16, 64), the null model and the MLP run back to back, in an order reversed
every other round, so drift hits both alike: ``--warm-up`` seconds, then ``--duration``
measured. Around each measured run the script waits until the model has nothing in flight,
reads ``/admin/status`` (batches, rows, worker seconds) and the daemon's CPU time, and so gets
the mean rows per batch the server formed and how busy the model's worker thread was.

After the daemon stops, it times in-process ``session.run`` of each MLP on one thread at batch 1,
at 64 and at each batch size the served runs formed (their mean rows per batch, rounded): the
ceiling. The report gives served MLP req/s over null req/s (paired within each round) and served
rows/s over the ceiling at the batch the server formed, and c1 latency.

Then, unless ``--no-profile``, it serves the MLP 512 over JSON at c64 again and samples the
daemon with ``py-spy record --native --idle --threads`` (``--profile-duration`` s at
``--profile-rate`` Hz), and sums the samples by thread and by function group. Prints a
markdown report; ``--out FILE`` also writes it there, ``--json FILE`` the raw numbers.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from harness import (
    BENCH_DIR,
    Daemon,
    binary_request,
    check_infer,
    check_output,
    command_line,
    grpc_output,
    grpc_request,
    http_output,
    json_request,
    machine_line,
    new_session,
    process_cpu_s,
    random_rows,
    run_wrk,
    spread,
    time_calls,
    wait_idle,
    wait_loaded,
    wait_ready,
    wrk_errors,
)
from models import write_mlp, write_null

WIDTHS = (64, 512)
KINDS = ("null", "mlp")
JSON_HTTP = "JSON HTTP"
BINARY_HTTP = "binary HTTP"
GRPC = "gRPC"
ENCODINGS = (JSON_HTTP, BINARY_HTTP, GRPC)
CONCURRENCIES = (1, 16, 64)
CEILING_BATCHES = (1, 64)
PROFILE_CASE = ("mlp", 512, JSON_HTTP, 64)
HEADER_LENGTH = "Inference-Header-Content-Length"
# Issue 19's aim for later: served MLP req/s >= 0.8 x null req/s at c64.
AIM_RATIO_C64 = 0.8
RTOL = 1e-4
ATOL = 1e-4


def model_name(kind: str, width: int) -> str:
    return f"{kind}-{width}"


@dataclass(frozen=True)
class Run:
    """One measured run of one model, encoding and concurrency."""

    round: int
    kind: str
    width: int
    encoding: str
    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    batches: int
    rows: int
    worker_s: float  # seconds the model's worker spent on batches (merge, run, split)
    duration_s: float
    daemon_cpu_s: float
    client_cpu_s: float | None  # the gRPC client's own CPU; None for wrk
    inline: bool
    loop_cpu_s: float  # the main (event loop) thread's CPU over the run
    worker_cpu_s: float  # the busiest other thread's CPU (the model's worker, in HTTP runs)

    @property
    def rows_per_batch(self) -> float:
        return self.rows / self.batches if self.batches else float("nan")

    @property
    def worker_busy(self) -> float:
        return self.worker_s / self.duration_s

    @property
    def daemon_cpu_us(self) -> float:
        return self.daemon_cpu_s * 1e6 / max(self.requests_per_s * self.duration_s, 1.0)


@dataclass(frozen=True)
class Ceiling:
    width: int
    batch: int
    calls_per_s: float
    p50_ms: float

    @property
    def rows_per_s(self) -> float:
        return self.calls_per_s * self.batch


# --- setup --------------------------------------------------------------------------------


def write_config(workdir: Path) -> Path:
    entries = []
    for width in WIDTHS:
        write_null(workdir / f"null_{width}.onnx", width)
        write_mlp(workdir / f"mlp_{width}.onnx", (width, 4 * width, 4 * width, width))
        for kind in KINDS:
            entries.append(
                f'\n[[models]]\nname = "{model_name(kind, width)}"\n'
                f'path = "{kind}_{width}.onnx"\npreload = true\nintra_op_threads = 1\n'
            )
    config = workdir / "models.toml"
    config.write_text(
        '[server]\nhost = "127.0.0.1"\nhttp_port = 0\ngrpc_port = 0\nidle_timeout = "never"\n'
        + "".join(entries),
        encoding="utf-8",
    )
    return config


@dataclass(frozen=True)
class Bodies:
    """One width's one-row request as a JSON body file and a binary-extension body file."""

    model_input: np.ndarray
    json_file: Path
    binary_file: Path
    header_length: int


def write_bodies(workdir: Path, width: int) -> Bodies:
    model_input = random_rows(1, width)
    json_file = workdir / f"body_{width}.json"
    json_file.write_bytes(json_request(model_input))
    body, header_length = binary_request(model_input)
    binary_file = workdir / f"body_{width}.bin"
    binary_file.write_bytes(body)
    return Bodies(model_input, json_file, binary_file, header_length)


def check_answers(
    daemon: Daemon, client: httpx.Client, bodies: dict[int, Bodies], expected: dict[str, Any]
) -> None:
    """Each model over each encoding gives onnxruntime's answer, so nothing wrong is timed."""
    import grpc

    from snoozeml.proto import inference_pb2_grpc as pb_grpc

    with grpc.insecure_channel(daemon.grpc_target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        for width, body in bodies.items():
            for kind in KINDS:
                name = model_name(kind, width)
                want = expected[name]
                check_infer(client, name, body.model_input, want, RTOL, ATOL)
                raw = body.binary_file.read_bytes()
                headers = {
                    "Content-Type": "application/octet-stream",
                    HEADER_LENGTH: str(body.header_length),
                }
                response = client.post(f"/v2/models/{name}/infer", content=raw, headers=headers)
                got = http_output(response.content, response.headers.get(HEADER_LENGTH))
                check_output(f"{name} binary HTTP", got, want, RTOL, ATOL)
                answer = stub.ModelInfer(grpc_request(name, body.model_input), timeout=30)
                check_output(f"{name} gRPC", grpc_output(answer), want, RTOL, ATOL)


# --- load ---------------------------------------------------------------------------------


def grpc_load(
    daemon: Daemon, python: str, name: str, width: int, concurrency: int, duration_s: float,
    warm_up_s: float,
) -> dict[str, Any]:
    cmd = [python, str(BENCH_DIR / "grpc_load.py"), daemon.grpc_target, name, str(width)]
    cmd += [str(concurrency), str(duration_s), "--warm-up", str(warm_up_s)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"grpc_load failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def load(
    daemon: Daemon, args: argparse.Namespace, bodies: Bodies, name: str, encoding: str,
    concurrency: int, duration_s: float, warm_up_s: float,
) -> dict[str, Any]:
    """One load run; the summary has p50_ms, p99_ms, requests, duration_s, requests_per_s,
    errors and (gRPC only) client_cpu_s."""
    if encoding == GRPC:
        width = int(bodies.model_input.shape[1])
        return grpc_load(daemon, args.python, name, width, concurrency, duration_s, warm_up_s)
    url = f"{daemon.base_url}/v2/models/{name}/infer"
    threads = 1 if concurrency == 1 else 2
    if encoding == JSON_HTTP:
        body_file, header_length = bodies.json_file, None
    else:
        body_file, header_length = bodies.binary_file, bodies.header_length
    if warm_up_s > 0:
        run_wrk(url, body_file, threads, concurrency, warm_up_s, header_length)
    result = run_wrk(url, body_file, threads, concurrency, duration_s, header_length)
    result["errors"] = wrk_errors(result)
    return result


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds so far of each of the daemon's threads, by thread id. (Python 3.11 doesn't
    give OS threads their Python names, so the worker is found by its CPU: see ``measure``.)"""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def counters(entry: dict[str, Any]) -> tuple[int, int, float]:
    """(batches, rows, worker seconds) from a model's /admin/status entry."""
    stats = entry["batching"]
    batches = int(stats["batches"])
    return batches, int(stats["rows"]), float(stats["mean_run_ms"] or 0.0) * batches / 1e3


def measure(
    daemon: Daemon, client: httpx.Client, args: argparse.Namespace, bodies: Bodies,
    round_: int, kind: str, width: int, encoding: str, concurrency: int,
) -> Run:
    name = model_name(kind, width)
    if args.warm_up > 0:
        load(daemon, args, bodies, name, encoding, concurrency, args.warm_up, 0)
    before = counters(wait_idle(client, name))
    cpu_before, threads_before = process_cpu_s(daemon.pid), thread_cpu_s(daemon.pid)
    result = load(daemon, args, bodies, name, encoding, concurrency, args.duration, 0)
    cpu_s = process_cpu_s(daemon.pid) - cpu_before
    threads_after = thread_cpu_s(daemon.pid)
    spent = {tid: cpu - threads_before.get(tid, 0.0) for tid, cpu in threads_after.items()}
    loop_cpu_s = spent.pop(daemon.pid, 0.0)  # the main thread runs the event loop
    # Only one model gets traffic at a time, so in HTTP runs the busiest other thread is its
    # worker; in gRPC runs it may be grpcio's poller thread.
    busiest_cpu_s = max(spent.values(), default=0.0)
    entry = wait_idle(client, name)
    after = counters(entry)
    run = Run(
        round_, kind, width, encoding, concurrency, float(result["requests_per_s"]),
        float(result["p50_ms"]), float(result["p99_ms"]), int(result["errors"]),
        after[0] - before[0], after[1] - before[1], after[2] - before[2],
        float(result["duration_s"]), cpu_s, result.get("client_cpu_s"),
        bool(entry["batching"]["inline"]), loop_cpu_s, busiest_cpu_s,
    )
    print(
        f"round {round_} {name} {encoding} c{concurrency}: {run.requests_per_s:,.0f}/s "
        f"p50 {run.p50_ms:.3f} ms, {run.rows_per_batch:.1f} rows/batch, worker "
        f"{run.worker_busy:.0%} busy, daemon {run.daemon_cpu_us:.0f} µs CPU/req, loop "
        f"{run.loop_cpu_s / run.duration_s:.2f} + worker {run.worker_cpu_s / run.duration_s:.2f}"
        " cores"
        + (f", client CPU {run.client_cpu_s / run.duration_s:.0%}" if run.client_cpu_s else "")
        + (f", {run.errors} ERRORS {result.get('error_codes', '')}" if run.errors else ""),
        file=sys.stderr,
    )
    return run


def measure_all(
    daemon: Daemon, client: httpx.Client, args: argparse.Namespace, bodies: dict[int, Bodies]
) -> list[Run]:
    runs: list[Run] = []
    for round_ in range(args.rounds):
        kinds = KINDS if round_ % 2 == 0 else tuple(reversed(KINDS))
        for width in args.widths:
            for encoding in args.encodings:
                for concurrency in args.concurrency:
                    for kind in kinds:
                        runs.append(
                            measure(daemon, client, args, bodies[width], round_, kind, width,
                                    encoding, concurrency)
                        )
    return runs


# --- in-process ceiling --------------------------------------------------------------------


def ceilings(workdir: Path, runs: list[Run], duration_s: float) -> list[Ceiling]:
    """``session.run`` of each MLP on one thread at batch 1, 64 and every batch size the
    served runs formed."""
    found: list[Ceiling] = []
    for width in sorted({run.width for run in runs}):
        batches = set(CEILING_BATCHES)
        batches |= {formed_batch(r) for r in runs if r.kind == "mlp" and r.width == width}
        session = new_session(workdir / f"mlp_{width}.onnx")
        for batch in sorted(batches):
            call = functools.partial(session.run, None, {"x": random_rows(batch, width)})
            time_calls(call, min(0.5, duration_s))
            timed = time_calls(call, duration_s)
            found.append(Ceiling(width, batch, timed.per_s, timed.p50_ms))
            print(f"ceiling mlp-{width} batch {batch}: {timed.per_s * batch:,.0f} rows/s",
                  file=sys.stderr)
    return found


def formed_batch(run: Run) -> int:
    return max(1, round(run.rows_per_batch)) if run.batches else 1


# --- profile ------------------------------------------------------------------------------

# Function groups. A sample counts for the innermost frame that names a group (so a sample in
# libc's realloc under orjson counts for orjson); frames without a name of their own
# ("0x7f… (libc.so.6)") name only their library. Native frames come from --native
# ("uv__read (stream.c:1063)", "0x7f… (orjson/orjson.cpython-311-….so)"), Python frames are
# "function (file.py:line)".
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("onnxruntime run", ("onnxruntime", "Mlas", "mlas")),
    ("JSON (orjson)", ("orjson",)),
    ("our codec (api/codec.py)", ("snoozeml/api/codec",)),
    ("numpy", ("numpy",)),
    ("batching, queue, hand-off between threads", (
        "snoozeml/engine/batch", "snoozeml/engine/replicas", "snoozeml/runtime/stacking",
        "concurrent/futures", "call_soon_threadsafe", "asyncio/futures", "Future",
    )),
    ("HTTP (uvicorn, httptools, starlette)", ("uvicorn", "httptools", "starlette")),
    ("our request path (fastpath, boundary, manager, events)", ("snoozeml/",)),
    ("socket reads and writes", ("uv__read", "uv__write", "uv__try_write", "writev", "uv_try")),
    ("event loop (uvloop, asyncio)", ("loop.c", "uv_run", "uv__", "asyncio", "uvloop")),
    ("gRPC", ("grpc",)),
)
IDLE = "idle (blocked, waiting for work or I/O)"


def group_of(frames: Sequence[str]) -> str:
    """The function group of one sample (frames from the root to the leaf)."""
    stack = ";".join(frames)
    named = [f for f in frames if not f.startswith("0x") or "(lib" not in f]
    if named and named[-1].startswith("epoll_pwait") and "uv__io_poll" in stack:
        return IDLE  # the event loop waiting for sockets
    if "_queue_SimpleQueue_get" in stack and "_WorkItem.run" not in stack:
        return IDLE  # an executor thread waiting for its next job
    if "_poll_wrapper" in stack or "Condition.wait" in stack or "Event.wait" in stack:
        return IDLE
    for frame in reversed(named):
        for group, needles in GROUPS:
            if any(needle in frame for needle in needles):
                return group
    return "other (interpreter, libc)"


def find_py_spy(args: argparse.Namespace) -> str | None:
    """py-spy on PATH or next to the benchmark's Python (bench/setup.sh installs it there)."""
    found = shutil.which("py-spy") or str(Path(args.python).parent / "py-spy")
    return found if Path(found).exists() else None


def profile(
    daemon: Daemon, args: argparse.Namespace, bodies: Bodies, workdir: Path
) -> dict[str, Any]:
    """py-spy on the daemon while wrk serves the profile case; samples by thread and group."""
    py_spy = find_py_spy(args)
    if py_spy is None:
        raise RuntimeError("py-spy not found; run: bash bench/setup.sh")
    kind, width, encoding, concurrency = PROFILE_CASE
    name = model_name(kind, width)
    out = workdir / "profile.txt"
    loaded: dict[str, Any] = {}

    def serve() -> None:
        loaded.update(load(daemon, args, bodies, name, encoding, concurrency,
                           args.profile_duration + 3, 0))

    wrk = threading.Thread(target=serve)
    wrk.start()
    time.sleep(1.5)
    cmd = [py_spy, "record", "--pid", str(daemon.pid), "--native", "--idle", "--threads",
           "--rate", str(args.profile_rate), "--duration", str(round(args.profile_duration)),
           "--format", "raw", "--output", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wrk.join()
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    if args.keep_profile is not None:
        shutil.copyfile(out, args.keep_profile)
    return {"wrk": loaded, **summarize_profile(out.read_text(encoding="utf-8"))}


def summarize_profile(raw: str) -> dict[str, Any]:
    """Samples by thread, and by thread and group (idle samples apart), from py-spy's raw
    (collapsed) output with --threads: 'thread;frame;…;leaf COUNT' per line."""
    by_thread: collections.Counter[str] = collections.Counter()
    by_group: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    by_function: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].strip()
        by_thread[thread] += int(count)
        group = group_of(frames)
        by_group[thread][group] += int(count)
        if group != IDLE:
            python = [f for f in frames if ".py:" in f]
            if python:  # the innermost Python function, without its line
                by_function[thread][python[-1].rsplit(":", 1)[0] + ")"] += int(count)
    return {
        "by_thread": dict(by_thread.most_common()),
        "by_group": {thread: dict(groups.most_common()) for thread, groups in by_group.items()},
        "by_function": {
            thread: dict(functions.most_common(12)) for thread, functions in by_function.items()
        },
    }


# --- report -------------------------------------------------------------------------------


def paired_ratios(runs: list[Run], width: int, encoding: str, concurrency: int) -> list[float]:
    """MLP req/s over null req/s, one per round."""
    ratios = []
    for round_ in sorted({r.round for r in runs}):
        pair = {r.kind: r for r in runs if (r.round, r.width, r.encoding, r.concurrency)
                == (round_, width, encoding, concurrency)}
        if len(pair) == 2 and pair["null"].requests_per_s > 0:
            ratios.append(pair["mlp"].requests_per_s / pair["null"].requests_per_s)
    return ratios


def pick(runs: list[Run], kind: str, width: int, encoding: str, concurrency: int) -> list[Run]:
    return [r for r in runs if (r.kind, r.width, r.encoding, r.concurrency)
            == (kind, width, encoding, concurrency)]


def report(
    machine: str, runs: list[Run], found: list[Ceiling], prof: dict[str, Any] | None,
    args: argparse.Namespace,
) -> str:
    ceiling_of = {(c.width, c.batch): c for c in found}
    lines = [
        "### Throughput under load: null model against MLP, one row per request",
        "",
        f"- {machine}",
        f"- command: `{command_line()}`",
        f"- {args.rounds} round(s); each run {args.warm_up:g} s warm-up then {args.duration:g} s "
        "measured; null and MLP back to back, the order reversed every other round",
        "- models: `null-N` one Relu N→N, `mlp-N` N→4N→4N→N; `intra_op_threads = 1`, batching at "
        "the defaults (`max_batch_size = 32`, `max_delay = 0`), preloaded, pinned",
        "- load: wrk with `post.lua` for HTTP (`-t1` at c1, `-t2` above); `grpc_load.py` "
        "(grpc.aio, one channel, c calls in flight, its own process) for gRPC. **Client and "
        f"daemon share the same {_cpus()} CPU(s)**: every row measures contention too.",
        "",
        "#### Served throughput (median over rounds) and the ratio MLP ÷ null",
        "",
        "| width | encoding | c | null req/s | MLP req/s | MLP ÷ null (per round) | "
        "MLP rows/batch | MLP worker busy | ceiling rows/s at that batch | served ÷ ceiling | "
        "daemon CPU µs/req null / MLP | MLP cores: loop + busiest other thread "
        "| client CPU (gRPC) null / MLP | errors |",
        "| ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- "
        "| ---: |",
    ]
    for width in args.widths:
        for encoding in args.encodings:
            for concurrency in args.concurrency:
                null = pick(runs, "null", width, encoding, concurrency)
                mlp = pick(runs, "mlp", width, encoding, concurrency)
                if not null or not mlp:
                    continue
                ratios = paired_ratios(runs, width, encoding, concurrency)
                served_over_ceiling = [
                    r.requests_per_s / ceiling_of[(width, formed_batch(r))].rows_per_s
                    for r in mlp if (width, formed_batch(r)) in ceiling_of
                ]
                batches = [formed_batch(r) for r in mlp]
                ceiling_rows = [ceiling_of[(width, b)].rows_per_s for b in batches
                                if (width, b) in ceiling_of]
                client = "—"
                if encoding == GRPC:
                    client = " / ".join(
                        f"{_median([(r.client_cpu_s or 0) / r.duration_s for r in rs]):.0%}"
                        for rs in (null, mlp)
                    )
                lines.append(
                    f"| {width} | {encoding} | {concurrency} "
                    f"| {_median([r.requests_per_s for r in null]):,.0f} "
                    f"| {_median([r.requests_per_s for r in mlp]):,.0f} "
                    f"| {spread(ratios, '.2f')} "
                    f"| {_median([r.rows_per_batch for r in mlp]):.1f} "
                    f"| {_median([r.worker_busy for r in mlp]):.0%} "
                    f"| {_median(ceiling_rows):,.0f} "
                    f"| {spread(served_over_ceiling, '.2f')} "
                    f"| {_median([r.daemon_cpu_us for r in null]):.0f} / "
                    f"{_median([r.daemon_cpu_us for r in mlp]):.0f} "
                    f"| {_median([r.loop_cpu_s / r.duration_s for r in mlp]):.2f} + "
                    f"{_median([r.worker_cpu_s / r.duration_s for r in mlp]):.2f} "
                    f"| {client} | {sum(r.errors for r in null + mlp)} |"
                )
    lines += [
        "",
        "- MLP ÷ null: median (range) of the per-round ratios. *rows/batch*: Δrows ÷ Δbatches of "
        "`/admin/status` over the run; *worker busy*: the model's worker seconds (merge, run, "
        "split) over the run's seconds; *served ÷ ceiling*: served rows/s over in-process "
        "`session.run` rows/s at the run's mean rows per batch (rounded). *daemon CPU*: user + "
        "system of all its threads over the run, per request. *cores*: CPU seconds per second of "
        "the main thread (event loop: HTTP, codec, gRPC servicer) and of the busiest other "
        "thread: the model's worker (merge, `session.run`, split) over HTTP; over gRPC it can "
        "be grpcio's poller.",
        "",
        "#### In-process ceiling (MLP, `session.run`, 1 intra-op thread, one Python thread)",
        "",
        "| width | batch | rows/s | ms per call (p50) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {c.width} | {c.batch} | {c.rows_per_s:,.0f} | {c.p50_ms:.3f} |" for c in found
    ]
    if 1 in args.concurrency:
        lines += [
            "",
            "#### Latency at c1 (ms, median over rounds)",
            "",
            "| width | encoding | null p50 / p99 | MLP p50 / p99 | MLP in-process batch 1 p50 |",
            "| ---: | --- | --- | --- | ---: |",
        ]
        for width in args.widths:
            for encoding in args.encodings:
                null, mlp = (pick(runs, kind, width, encoding, 1) for kind in KINDS)
                if not null or not mlp:
                    continue
                single = ceiling_of.get((width, 1))
                lines.append(
                    f"| {width} | {encoding} "
                    f"| {_median([r.p50_ms for r in null]):.3f} / "
                    f"{_median([r.p99_ms for r in null]):.3f} "
                    f"| {_median([r.p50_ms for r in mlp]):.3f} / "
                    f"{_median([r.p99_ms for r in mlp]):.3f} "
                    f"| {single.p50_ms if single else float('nan'):.3f} |"
                )
    aim = [paired_ratios(runs, 512, JSON_HTTP, 64)]
    if aim[0]:
        ratio = _median(aim[0])
        lines += [
            "",
            f"Issue 19's later aim, MLP 512 ÷ null 512 ≥ {AIM_RATIO_C64} at c64 (JSON HTTP): "
            f"{ratio:.2f} — {'met' if ratio >= AIM_RATIO_C64 else 'not met'}.",
        ]
    if prof is not None:
        lines += ["", *profile_lines(prof, args)]
    return "\n".join(lines)


def profile_lines(prof: dict[str, Any], args: argparse.Namespace) -> list[str]:
    kind, width, encoding, concurrency = PROFILE_CASE
    served = prof["wrk"]
    lines = [
        f"#### Profile: {model_name(kind, width)}, {encoding}, c{concurrency}",
        "",
        f"`py-spy record --native --idle --threads --rate {args.profile_rate} --duration "
        f"{args.profile_duration:g}` on the daemon while wrk served it "
        f"({served.get('requests_per_s', 0):,.0f} req/s under the profiler). Each thread's "
        "samples by the innermost frame that names a group; *idle* is a thread blocked "
        "waiting for work or I/O. py-spy's native stacks don't name `take_gil` here, so a "
        "thread waiting for the GIL counts under the frame that waits.",
        "",
    ]
    by_thread: dict[str, int] = prof["by_thread"]
    quiet = []
    for thread, count in by_thread.items():
        groups: dict[str, int] = prof["by_group"][thread]
        if groups.get(IDLE, 0) >= 0.98 * count:
            quiet.append(thread)
            continue
        functions: dict[str, int] = prof["by_function"].get(thread, {})
        lines += [
            f"- **{thread}** ({count} samples)",
            *(f"  - {group}: {n / count:.0%}" for group, n in groups.items() if n >= 0.01 * count),
            "  - innermost Python functions of its busy samples: "
            + ", ".join(f"`{f}` {n / count:.0%}" for f, n in functions.items()
                        if n >= 0.01 * count),
        ]
    if quiet:
        lines.append(f"- idle 98% of the time or more: {', '.join(quiet)}")
    return lines


def _median(values: Sequence[float]) -> float:
    clean = [v for v in values if v == v]
    return statistics.median(clean) if clean else float("nan")


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run (5)")
    parser.add_argument("--warm-up", type=float, default=1.0, help="seconds before each run (1)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every case (2)")
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS),
                        choices=WIDTHS, help="model widths (64 512)")
    parser.add_argument("--encodings", nargs="+", default=list(ENCODINGS), choices=ENCODINGS,
                        help="encodings (all three)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES),
                        help="concurrency levels (1 16 64)")
    parser.add_argument("--ceiling-duration", type=float, default=1.5,
                        help="seconds of in-process timing per batch size (1.5)")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the py-spy profile")
    parser.add_argument("--profile-duration", type=float, default=10.0, help="seconds (10)")
    parser.add_argument("--profile-rate", type=int, default=200, help="samples per s (200)")
    parser.add_argument("--keep-profile", type=Path, help="also copy py-spy's raw output here")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the daemon")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk not found; run: bash bench/setup.sh", file=sys.stderr)
        return 2
    if args.profile and find_py_spy(args) is None:  # checked now, not after the whole run
        print("py-spy not found; run: bash bench/setup.sh (or pass --no-profile)", file=sys.stderr)
        return 2
    machine = machine_line()
    with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
        workdir = Path(tmp)
        config = write_config(workdir)
        bodies = {width: write_bodies(workdir, width) for width in WIDTHS}
        expected = {
            model_name(kind, width): new_session(workdir / f"{kind}_{width}.onnx").run(
                None, {"x": bodies[width].model_input})[0]
            for kind in KINDS for width in WIDTHS
        }
        prof: dict[str, Any] | None = None
        daemon = Daemon(args.python, config)
        try:
            with httpx.Client(base_url=daemon.base_url, timeout=60.0) as client:
                wait_ready(client, "/health/ready")
                for kind in KINDS:
                    for width in WIDTHS:
                        wait_loaded(client, model_name(kind, width))
                check_answers(daemon, client, bodies, expected)
                runs = measure_all(daemon, client, args, bodies)
                if args.profile:
                    prof = profile(daemon, args, bodies[PROFILE_CASE[1]], workdir)
                check_answers(daemon, client, bodies, expected)  # still right after the load
        except BaseException:
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
            raise
        finally:
            daemon.stop_and_warn()
        found = ceilings(workdir, runs, args.ceiling_duration)

    markdown = report(machine, runs, found, prof, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    if args.json is not None:
        raw = {
            "machine": machine,
            "runs": [asdict(r) for r in runs],
            "ceilings": [asdict(c) for c in found],
            "profile": prof,
        }
        args.json.write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
