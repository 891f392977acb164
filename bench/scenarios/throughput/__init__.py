"""Throughput under load (issue 19, part 1): what the daemon costs beside what the model costs.

One daemon serves four preloaded, pinned models, each ``intra_op_threads = 1`` with batching at
the server's defaults: ``null-64`` and ``null-512`` (one Relu, N -> N: the daemon's own cost)
and ``mlp-64`` and ``mlp-512`` (MLP N -> 4N -> 4N -> N). Every request carries one row. For each
width (``--widths``), encoding (``--encodings``: JSON HTTP and binary HTTP through wrk and
``post.lua``, gRPC through ``grpc_load.py`` in its own process) and ``--concurrency`` (1 16
64), the null model and the MLP run back to back, the order reversed every other round: a
``--warm-up`` run, then ``--duration`` seconds measured. Around each measured run it waits until
the model is idle and reads ``/admin/status`` (batches, rows, worker seconds) and the daemon's
CPU time by thread: the rows per batch the server formed and how busy the model's worker was.

After the daemon stops, in-process ``session.run`` of each MLP at batch 1, 64 and each batch
size the served runs formed is the ceiling. The report gives served MLP ÷ null (paired within
each round), served rows/s ÷ the ceiling at the batch the server formed, and c1 latency. Then,
unless ``--no-profile``, the MLP 512 over JSON at c64 again under ``py-spy record --native
--idle --threads``, its samples summed by thread and function group.
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from harness.cli import Bench
from harness.config import write_config
from harness.cpu import CpuWindow
from harness.daemon import Daemon
from harness.load import grpc_load, run_wrk, wrk_threads
from harness.oip import (
    HEADER_LENGTH,
    binary_headers,
    binary_request,
    check_output,
    grpc_output,
    grpc_request,
    grpc_stub,
    http_output,
    json_request,
    new_session,
    random_rows,
)
from harness.report import Outcome
from harness.rounds import alternate
from harness.status import batch_counters, check_infer, wait_idle
from harness.timing import warm_then_time
from models import write_mlp, write_null

from scenarios.throughput.profile import find_py_spy, profile
from scenarios.throughput.report import (
    ENCODINGS,
    GRPC,
    JSON_HTTP,
    KINDS,
    PROFILE_CASE,
    WIDTHS,
    Ceiling,
    Run,
    formed_batch,
    model_name,
    report,
)

CEILING_BATCHES = (1, 64)
RTOL = ATOL = 1e-4


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS),
                        choices=WIDTHS, help="model widths (64 512)")
    parser.add_argument("--encodings", nargs="+", default=list(ENCODINGS), choices=ENCODINGS,
                        help="encodings (all three)")
    parser.add_argument("--ceiling-duration", type=float, default=1.5,
                        help="seconds of in-process timing per batch size (1.5)")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the py-spy profile")
    parser.add_argument("--profile-duration", type=float, default=10.0, help="seconds (10)")
    parser.add_argument("--profile-rate", type=int, default=200, help="samples per s (200)")
    parser.add_argument("--keep-profile", type=Path, help="also copy py-spy's raw output here")


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


def check_answers(daemon: Daemon, bodies: dict[int, Bodies], expected: dict[str, Any]) -> None:
    """Each model over each encoding gives onnxruntime's answer, so nothing wrong is timed."""
    with grpc.insecure_channel(daemon.grpc_target) as channel:
        stub = grpc_stub(channel)
        for width, body in bodies.items():
            for kind in KINDS:
                name = model_name(kind, width)
                want = expected[name]
                check_infer(daemon.client, name, body.model_input, want, RTOL, ATOL)
                response = daemon.client.post(f"/v2/models/{name}/infer",
                                              content=body.binary_file.read_bytes(),
                                              headers=binary_headers(body.header_length))
                got = http_output(response.content, response.headers.get(HEADER_LENGTH))
                check_output(f"{name} binary HTTP", got, want, RTOL, ATOL)
                answer = stub.ModelInfer(grpc_request(name, body.model_input), timeout=30)
                check_output(f"{name} gRPC", grpc_output(answer), want, RTOL, ATOL)


def load(daemon: Daemon, args: argparse.Namespace, bodies: Bodies, name: str, encoding: str,
         concurrency: int, duration_s: float) -> dict[str, Any]:
    """One load run; the summary has p50_ms, p99_ms, requests, duration_s, requests_per_s,
    errors and (gRPC only) client_cpu_s."""
    if encoding == GRPC:
        width = int(bodies.model_input.shape[1])
        return grpc_load(daemon.grpc_target, name, width, concurrency, duration_s, 0,
                         args.python)
    body_file, header_length = ((bodies.json_file, None) if encoding == JSON_HTTP
                                else (bodies.binary_file, bodies.header_length))
    return run_wrk(daemon.infer_url(name), body_file, wrk_threads(concurrency), concurrency,
                   duration_s, header_length)


def measure(daemon: Daemon, args: argparse.Namespace, bodies: Bodies, round_: int, kind: str,
            width: int, encoding: str, concurrency: int) -> Run:
    name = model_name(kind, width)
    if args.warm_up > 0:
        load(daemon, args, bodies, name, encoding, concurrency, args.warm_up)
    before = batch_counters(wait_idle(daemon.client, name))
    with CpuWindow(daemon.pid) as cpu:
        result = load(daemon, args, bodies, name, encoding, concurrency, args.duration)
    entry = wait_idle(daemon.client, name)
    after = batch_counters(entry)
    # Only one model gets traffic at a time, so in HTTP runs the busiest other thread is its
    # worker; in gRPC runs it may be grpcio's poller thread.
    run = Run(round_, kind, width, encoding, concurrency, float(result["requests_per_s"]),
              float(result["p50_ms"]), float(result["p99_ms"]), int(result["errors"]),
              after[0] - before[0], after[1] - before[1], after[2] - before[2],
              float(result["duration_s"]), cpu.process_s, result.get("client_cpu_s"),
              bool(entry["batching"]["inline"]), cpu.loop_s, cpu.busiest_other_s)
    print(f"round {round_} {name} {encoding} c{concurrency}: {run.requests_per_s:,.0f}/s p50 "
          f"{run.p50_ms:.3f} ms, {run.rows_per_batch:.1f} rows/batch, worker "
          f"{run.worker_busy:.0%} busy, daemon {run.daemon_cpu_us:.0f} µs CPU/req, loop "
          f"{run.loop_cpu_s / run.duration_s:.2f} + worker "
          f"{run.worker_cpu_s / run.duration_s:.2f} cores"
          + (f", client CPU {run.client_cpu_s / run.duration_s:.0%}" if run.client_cpu_s else "")
          + (f", {run.errors} ERRORS {result.get('error_codes', '')}" if run.errors else ""),
          file=sys.stderr)
    return run


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
            timed = warm_then_time(call, duration_s, warm_up_s=0.5)
            found.append(Ceiling(width, batch, timed.per_s, timed.p50_ms))
            print(f"ceiling mlp-{width} batch {batch}: {timed.per_s * batch:,.0f} rows/s",
                  file=sys.stderr)
    return found


def run(bench: Bench) -> Outcome:
    args, workdir = bench.args, bench.workdir
    if args.profile and find_py_spy(args) is None:  # checked now, not after the whole run
        raise SystemExit("py-spy not found; run: bash bench/setup.sh (or pass --no-profile)")
    entries = []
    for width in WIDTHS:
        write_null(workdir / f"null_{width}.onnx", width)
        write_mlp(workdir / f"mlp_{width}.onnx", (width, 4 * width, 4 * width, width))
        entries += [{"name": model_name(kind, width), "path": f"{kind}_{width}.onnx",
                     "preload": True, "intra_op_threads": 1} for kind in KINDS]
    config = write_config(workdir / "models.toml", entries, server={"idle_timeout": "never"})
    bodies = {width: write_bodies(workdir, width) for width in WIDTHS}
    expected = {model_name(kind, width): new_session(workdir / f"{kind}_{width}.onnx").run(
        None, {"x": bodies[width].model_input})[0] for kind in KINDS for width in WIDTHS}
    prof: dict[str, Any] | None = None
    with bench.serve(config, list(expected)) as daemon:
        check_answers(daemon, bodies, expected)
        runs = [measure(daemon, args, bodies[width], round_, kind, width, encoding, concurrency)
                for round_ in range(args.rounds) for width in args.widths
                for encoding in args.encodings for concurrency in args.concurrency
                for kind in alternate(KINDS, round_)]
        if args.profile:
            kind, width, encoding, concurrency = PROFILE_CASE
            prof = profile(daemon, args, lambda seconds: load(
                daemon, args, bodies[width], model_name(kind, width), encoding, concurrency,
                seconds), workdir)
        check_answers(daemon, bodies, expected)  # still right after the load
    found = ceilings(workdir, runs, args.ceiling_duration)
    return Outcome(report(bench, runs, found, prof),
                   {"runs": runs, "ceilings": found, "profile": prof})

