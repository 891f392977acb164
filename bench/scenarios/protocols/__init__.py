"""JSON HTTP, binary HTTP and gRPC (issue 4).

One daemon serves two preloaded, pinned models: ``embedding`` (FP32 [batch, 384] -> MatMul
384x384; one row per request) and ``images`` (FP32 [64, 3, 224, 224], about 38.5 MB -> the
mean of each image). Every request goes over JSON HTTP, binary HTTP (the binary tensor data
extension, input and output binary) and gRPC (``raw_input_contents``), from two kinds of
Python client, compared only within a kind: tritonclient (each request built from numpy, each
answer decoded) and pre-encoded (http.client or aiohttp and a grpcio stub sending a request
encoded once, orjson for JSON; each answer still decoded).

Measured: ``embedding`` at concurrency 1 (``--requests`` sequential requests after a warm-up)
with both clients; at concurrency 16 (asyncio, ``--warm-up`` then ``--duration`` seconds) with
the pre-encoded ones; wrk over JSON HTTP at c1 and c16 as a cross-check (``--no-wrk`` skips it,
and so does a missing wrk); the image batch at concurrency 1 (``--large-requests``) with both
clients. Every row gives the daemon's CPU ms per request. Each answer is checked against
onnxruntime in-process before anything is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
from dataclasses import dataclass

import numpy as np
from harness.cli import Bench
from harness.config import write_config
from harness.cpu import process_cpu_s
from harness.daemon import Daemon
from harness.load import run_wrk, wrk_threads
from harness.oip import check_output, new_session, random_rows
from harness.report import Outcome
from harness.timing import Latency, summarize, time_count
from models import EMBEDDING_WIDTH, IMAGE_SHAPE, write_embedding, write_image_mean

from scenarios.protocols.clients import (
    CONCURRENCY,
    EMBEDDING,
    GRPC_MAX_MESSAGE,
    IMAGE_BATCH,
    IMAGES,
    JSON_HTTP,
    PRE_ENCODED,
    PROTOCOLS,
    TRITON,
    Call,
    Case,
    Encoded,
    PreEncodedClients,
    TritonClients,
    async_call,
    drive,
)
from scenarios.protocols.report import report


@dataclass(frozen=True)
class Row:
    """One measured combination: model, client kind, protocol, concurrency."""

    model: str
    client: str
    protocol: str
    concurrency: int
    request_bytes: int | None
    latency: Latency
    daemon_cpu_ms: float  # the daemon's CPU time per request over the measured window


Kinds = dict[str, dict[str, dict[str, Call]]]  # client kind -> model -> protocol -> call


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=1000,
                        help="sequential requests per c1 row (1000)")
    parser.add_argument("--large-requests", type=int, default=5,
                        help="requests per image-batch row (5)")
    parser.add_argument("--no-wrk", dest="wrk", action="store_false", help="skip the wrk rows")


def image_batch(seed: int = 9) -> np.ndarray:
    """A fixed-seed FP32 [64, 3, 224, 224] batch in [-1, 1], rounded to 4 decimals (so every
    protocol carries exactly the same values, JSON included)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, size=(IMAGE_BATCH, *IMAGE_SHAPE)).round(4).astype(np.float32)


def sequential(daemon: Daemon, case: Case, client: str, calls: dict[str, Call],
               sizes: dict[str, int], warm_up: int, count: int) -> list[Row]:
    rows = []
    for protocol in PROTOCOLS:
        for _ in range(warm_up):
            calls[protocol]()
        cpu_before = process_cpu_s(daemon.pid)
        latency = time_count(calls[protocol], count, protocol)
        cpu_ms = (process_cpu_s(daemon.pid) - cpu_before) * 1e3 / count
        rows.append(Row(case.model, client, protocol, 1, sizes[protocol], latency, cpu_ms))
        print(f"{case.model} {client} {protocol} c1: p50 {latency.p50_ms:.3f} ms, "
              f"{latency.per_s:,.1f}/s, daemon CPU {cpu_ms:.3f} ms/request", file=sys.stderr)
    return rows


async def concurrent(daemon: Daemon, case: Case, encoded: Encoded, protocol: str,
                     args: argparse.Namespace) -> tuple[Latency, float]:
    """One protocol at c16 for ``--duration`` after the warm-up; the latencies and the
    daemon's CPU ms per request over the measured window."""
    call, close = async_call(daemon, case, encoded, protocol, CONCURRENCY)
    try:
        check_output(f"{protocol} asyncio", await call(), case.expected)
        await drive(call, CONCURRENCY, min(args.warm_up, args.duration))
        cpu_before = process_cpu_s(daemon.pid)
        samples, elapsed_s = await drive(call, CONCURRENCY, args.duration)
        cpu_ms = (process_cpu_s(daemon.pid) - cpu_before) * 1e3 / max(len(samples), 1)
    finally:
        await close()
    return summarize(protocol, samples, elapsed_s), cpu_ms


def measure_embedding(daemon: Daemon, case: Case, encoded: Encoded, kinds: Kinds,
                      args: argparse.Namespace) -> list[Row]:
    """c1 with both client kinds, then c16 with the pre-encoded ones (asyncio)."""
    sizes = {TRITON: TritonClients.request_bytes(case), PRE_ENCODED: encoded.sizes()}
    rows: list[Row] = []
    for kind in (TRITON, PRE_ENCODED):
        rows += sequential(daemon, case, kind, kinds[kind][case.model], sizes[kind],
                           min(100, args.requests), args.requests)
    for protocol in PROTOCOLS:
        latency, cpu_ms = asyncio.run(concurrent(daemon, case, encoded, protocol, args))
        rows.append(Row(case.model, PRE_ENCODED, protocol, CONCURRENCY,
                        sizes[PRE_ENCODED][protocol], latency, cpu_ms))
        print(f"{case.model} {PRE_ENCODED} {protocol} c{CONCURRENCY}: p50 "
              f"{latency.p50_ms:.3f} ms, {latency.per_s:,.0f}/s, daemon CPU {cpu_ms:.3f} "
              "ms/request", file=sys.stderr)
    return rows


def measure_wrk(bench: Bench, daemon: Daemon, encoded: Encoded) -> list[Row]:
    """wrk with the pre-encoded JSON body at c1 and c16 (a cross-check of the JSON rows)."""
    args = bench.args
    body_file = bench.workdir / "embedding.json"
    body_file.write_bytes(encoded.json_body)
    url = daemon.infer_url(EMBEDDING)
    rows = []
    for connections in (1, CONCURRENCY):
        threads = wrk_threads(connections)
        run_wrk(url, body_file, threads, connections, min(args.warm_up, args.duration))
        cpu_before = process_cpu_s(daemon.pid)
        result = run_wrk(url, body_file, threads, connections, args.duration)
        cpu_ms = (process_cpu_s(daemon.pid) - cpu_before) * 1e3 / max(result["requests"], 1)
        print(f"wrk -c{connections}: {json.dumps(result)}", file=sys.stderr)
        latency = Latency(JSON_HTTP, result["p50_ms"], result["p99_ms"],
                          result["requests_per_s"], result["errors"])
        rows.append(Row(EMBEDDING, "wrk", JSON_HTTP, connections, len(encoded.json_body),
                        latency, cpu_ms))
    return rows


def run(bench: Bench) -> Outcome:
    args, workdir = bench.args, bench.workdir
    use_wrk = args.wrk and shutil.which("wrk") is not None
    if args.wrk and not use_wrk:
        print("wrk not found (bash bench/setup.sh); skipping the wrk rows", file=sys.stderr)
    write_embedding(workdir / "embedding.onnx")
    write_image_mean(workdir / "image_mean.onnx")
    config = write_config(workdir / "models.toml", [
        {"name": EMBEDDING, "path": "embedding.onnx", "preload": True, "intra_op_threads": 1},
        {"name": IMAGES, "path": "image_mean.onnx", "preload": True, "intra_op_threads": 1},
    ], server={"idle_timeout": "never", "max_request_size": "1GiB",  # tritonclient's JSON
               "grpc_max_message_size": GRPC_MAX_MESSAGE})  # image batch is ~200 MB of text
    sessions = {EMBEDDING: new_session(workdir / "embedding.onnx"),
                IMAGES: new_session(workdir / "image_mean.onnx")}
    inputs = {EMBEDDING: random_rows(1, EMBEDDING_WIDTH), IMAGES: image_batch()}
    cases = {name: Case(name, inputs[name], sessions[name].run(None, {"x": inputs[name]})[0])
             for name in (EMBEDDING, IMAGES)}
    counts = {EMBEDDING: args.requests, IMAGES: args.large_requests}
    in_process = {name: time_count(lambda name=name: sessions[name].run(None, {"x": inputs[name]}),
                                   counts[name]) for name in cases}
    encoded = {name: Encoded.of(case) for name, case in cases.items()}
    rows: list[Row] = []
    with bench.serve(config, list(cases)) as daemon, contextlib.ExitStack() as clients:
        triton = TritonClients(daemon)
        clients.callback(triton.close)
        direct = PreEncodedClients(daemon)
        clients.callback(direct.close)
        kinds = {TRITON: {name: triton.calls(case) for name, case in cases.items()},
                 PRE_ENCODED: {name: direct.calls(case, encoded[name])
                               for name, case in cases.items()}}
        for kind, by_model in kinds.items():
            for name, calls in by_model.items():
                for protocol, call in calls.items():
                    check_output(f"{name} over {protocol} ({kind})", call(), cases[name].expected)
        rows += measure_embedding(daemon, cases[EMBEDDING], encoded[EMBEDDING], kinds, args)
        if use_wrk:
            rows += measure_wrk(bench, daemon, encoded[EMBEDDING])
        sizes = {TRITON: TritonClients.request_bytes(cases[IMAGES]),
                 PRE_ENCODED: encoded[IMAGES].sizes()}
        for kind in (PRE_ENCODED, TRITON):
            rows += sequential(daemon, cases[IMAGES], kind, kinds[kind][IMAGES], sizes[kind], 1,
                               args.large_requests)
    return Outcome(report(bench, rows, in_process, cases), {"rows": rows,
                                                           "in_process": in_process})
