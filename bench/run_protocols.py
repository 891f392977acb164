"""Protocol benchmark for the SnoozeML daemon (issue 4): JSON HTTP, binary HTTP and gRPC.

Usage (from the repository root)::

    .venv/bin/python bench/run_protocols.py [--requests 1000] [--duration 10] [--out FILE]

One daemon serves two preloaded, pinned models written by ``bench/models.py``:

  ``embedding``  FP32 [batch, 384] -> MatMul 384x384 -> FP32 [batch, 384]; one row per request
                 (a 1x384 FP32 answer, like an embedding)
  ``images``     FP32 [64, 3, 224, 224] (about 38.5 MB) -> per-image mean -> FP32 [64]

Every request goes over the three protocols: JSON HTTP, binary HTTP (the binary tensor data
extension, input and output binary) and gRPC (``raw_input_contents``/``raw_output_contents``).
Two kinds of Python client send them, the same kind for all three protocols in a row group:

  tritonclient  ``tritonclient.http`` (``binary_data=False``/``True``) and ``tritonclient.grpc``;
                each request is built from the numpy array and its answer decoded back to one,
                as an application using these clients does.
  pre-encoded   http.client (c1) or aiohttp (c16), and a grpcio stub (sync or aio), sending a
                request encoded once (orjson for JSON, so the shortest JSON text); each answer
                is decoded to a numpy array. This leaves out the client's encoding, so it shows
                what the protocol costs on the wire and in the daemon.

Measured: the embedding model at concurrency 1 (``--requests`` sequential requests after a
warm-up) with both clients; at concurrency 16 (asyncio, ``--duration`` seconds) with the
pre-encoded clients; and with wrk over JSON HTTP (c1 and c16) as a cross-check when wrk is
installed. The image batch at concurrency 1 (``--large-requests`` requests) with both clients.
Each protocol's answer is checked against onnxruntime in-process before anything is timed.
Prints a markdown report; ``--out FILE`` also writes it there. It never appends to any file.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from harness import (
    Daemon,
    Latency,
    binary_request,
    check_output,
    command_line,
    grpc_channel_options,
    grpc_output,
    grpc_request,
    http_output,
    json_request,
    machine_line,
    new_session,
    process_cpu_s,
    random_rows,
    run_wrk,
    summarize,
    time_count,
    wait_loaded,
    wait_ready,
    wrk_row,
)
from models import EMBEDDING_WIDTH, IMAGE_SHAPE, write_embedding, write_image_mean

from snoozeml.proto import inference_pb2_grpc as pb_grpc

JSON_HTTP = "JSON HTTP"
BINARY_HTTP = "binary HTTP"
GRPC = "gRPC"
PROTOCOLS = (JSON_HTTP, BINARY_HTTP, GRPC)
TRITON = "tritonclient"
HEADER_LENGTH = "Inference-Header-Content-Length"
PRE_ENCODED = "pre-encoded"
EMBEDDING = "embedding"
IMAGES = "images"
IMAGE_BATCH = 64
CONCURRENCY = 16
# Room for the image batch as tritonclient's JSON (about 200 MB of text) and as gRPC (38.5 MB).
MAX_REQUEST_SIZE = "1GiB"
GRPC_MAX_MESSAGE = 256 * 1024 * 1024
CLIENT_TIMEOUT_S = 600.0
# Issue 4's aims.
AIM_LARGE_SPEEDUP = 5.0

Call = Callable[[], np.ndarray]


@dataclass(frozen=True)
class Case:
    """One model with its fixed input and onnxruntime's answer to it."""

    model: str
    model_input: np.ndarray
    expected: np.ndarray

    @property
    def input_bytes(self) -> int:
        return int(self.model_input.nbytes)


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


def write_config(workdir: Path) -> Path:
    write_embedding(workdir / "embedding.onnx")
    write_image_mean(workdir / "image_mean.onnx")
    config = workdir / "models.toml"
    config.write_text(
        f"""\
[server]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
idle_timeout = "never"
max_request_size = "{MAX_REQUEST_SIZE}"
grpc_max_message_size = {GRPC_MAX_MESSAGE}

[[models]]
name = "{EMBEDDING}"
path = "embedding.onnx"
preload = true
intra_op_threads = 1

[[models]]
name = "{IMAGES}"
path = "image_mean.onnx"
preload = true
intra_op_threads = 1
""",
        encoding="utf-8",
    )
    return config


def image_batch(seed: int = 9) -> np.ndarray:
    """A fixed-seed FP32 [64, 3, 224, 224] batch in [-1, 1], rounded to 4 decimals (so every
    protocol carries exactly the same values, JSON included)."""
    rng = np.random.default_rng(seed)
    shape = (IMAGE_BATCH, *IMAGE_SHAPE)
    return rng.uniform(-1, 1, size=shape).round(4).astype(np.float32)


# --- clients ------------------------------------------------------------------------------


class TritonClients:
    """tritonclient.http and tritonclient.grpc, unmodified; requests built per call."""

    def __init__(self, daemon: Daemon) -> None:
        self.http = triton_http.InferenceServerClient(
            f"127.0.0.1:{daemon.http_port}",
            connection_timeout=CLIENT_TIMEOUT_S,
            network_timeout=CLIENT_TIMEOUT_S,
        )
        self.grpc = triton_grpc.InferenceServerClient(daemon.grpc_target)

    def close(self) -> None:
        self.http.close()
        self.grpc.close()

    def calls(self, case: Case) -> dict[str, Call]:
        array, shape = case.model_input, list(case.model_input.shape)

        def over_http(binary: bool) -> Call:
            def call() -> np.ndarray:
                tensor = triton_http.InferInput("x", shape, "FP32")
                tensor.set_data_from_numpy(array, binary_data=binary)
                wanted = triton_http.InferRequestedOutput("y", binary_data=binary)
                result = self.http.infer(case.model, [tensor], outputs=[wanted])
                return _some(result.as_numpy("y"))

            return call

        def over_grpc() -> np.ndarray:
            tensor = triton_grpc.InferInput("x", shape, "FP32")
            tensor.set_data_from_numpy(array)
            wanted = triton_grpc.InferRequestedOutput("y")
            return _some(self.grpc.infer(case.model, [tensor], outputs=[wanted]).as_numpy("y"))

        return {JSON_HTTP: over_http(False), BINARY_HTTP: over_http(True), GRPC: over_grpc}

    @staticmethod
    def request_bytes(case: Case) -> dict[str, int]:
        """Sizes of the bodies tritonclient sends (HTTP) and of the gRPC message."""
        sizes: dict[str, int] = {}
        for protocol, binary in ((JSON_HTTP, False), (BINARY_HTTP, True)):
            tensor = triton_http.InferInput("x", list(case.model_input.shape), "FP32")
            tensor.set_data_from_numpy(case.model_input, binary_data=binary)
            wanted = triton_http.InferRequestedOutput("y", binary_data=binary)
            body, _ = triton_http.InferenceServerClient.generate_request_body(
                [tensor], outputs=[wanted]
            )
            sizes[protocol] = len(body)
        sizes[GRPC] = grpc_request(case.model, case.model_input).ByteSize()
        return sizes


def _some(array: np.ndarray | None) -> np.ndarray:
    if array is None:
        raise RuntimeError("the response has no output 'y'")
    return array


@dataclass(frozen=True)
class Encoded:
    """One case's requests, encoded once."""

    json_body: bytes
    binary_body: bytes
    binary_header_length: int
    grpc: Any  # ModelInferRequest

    @classmethod
    def of(cls, case: Case) -> Encoded:
        body, header_length = binary_request(case.model_input)
        return cls(
            json_request(case.model_input),
            body,
            header_length,
            grpc_request(case.model, case.model_input),
        )

    def http(self, protocol: str) -> tuple[bytes, dict[str, str]]:
        if protocol == JSON_HTTP:
            return self.json_body, {"Content-Type": "application/json"}
        headers = {
            "Content-Type": "application/octet-stream",
            HEADER_LENGTH: str(self.binary_header_length),
        }
        return self.binary_body, headers

    def sizes(self) -> dict[str, int]:
        return {
            JSON_HTTP: len(self.json_body),
            BINARY_HTTP: len(self.binary_body),
            GRPC: self.grpc.ByteSize(),
        }


def _answer(status: int, body: bytes, header_length: str | None) -> np.ndarray:
    if status != 200:
        raise RuntimeError(f"infer: {status} {body[:500]!r}")
    return http_output(body, header_length)


class PreEncodedClients:
    """http.client (one keep-alive connection, the least a Python client can add) and a
    grpcio stub, sending pre-encoded requests."""

    def __init__(self, daemon: Daemon) -> None:
        self.http = http.client.HTTPConnection(
            "127.0.0.1", daemon.http_port, timeout=CLIENT_TIMEOUT_S
        )
        self.channel = grpc.insecure_channel(
            daemon.grpc_target, options=grpc_channel_options(GRPC_MAX_MESSAGE)
        )
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.http.close()
        self.channel.close()

    def _post(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes, str | None]:
        """POST on the keep-alive connection; reconnects once if the daemon closed it while
        it sat idle (between two measurements)."""
        for attempt in range(2):
            try:
                self.http.request("POST", path, body, headers)
                response = self.http.getresponse()
                return response.status, response.read(), response.getheader(HEADER_LENGTH)
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                self.http.close()  # the next request opens a new connection
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def calls(self, case: Case, encoded: Encoded) -> dict[str, Call]:
        path = f"/v2/models/{case.model}/infer"

        def over_http(protocol: str) -> Call:
            body, headers = encoded.http(protocol)

            def call() -> np.ndarray:
                return _answer(*self._post(path, body, headers))

            return call

        def over_grpc() -> np.ndarray:
            return grpc_output(self.stub.ModelInfer(encoded.grpc, timeout=CLIENT_TIMEOUT_S))

        return {
            JSON_HTTP: over_http(JSON_HTTP),
            BINARY_HTTP: over_http(BINARY_HTTP),
            GRPC: over_grpc,
        }


# --- concurrency 16 (asyncio, pre-encoded) ------------------------------------------------


async def _drive(
    call: Callable[[], Awaitable[np.ndarray]], concurrency: int, duration_s: float
) -> tuple[list[int], float]:
    """``concurrency`` tasks calling back to back for ``duration_s``; latencies (ns) and the
    elapsed seconds."""
    samples: list[int] = []
    start = time.perf_counter_ns()
    stop = start + int(duration_s * 1e9)

    async def worker() -> None:
        while time.perf_counter_ns() < stop:
            before = time.perf_counter_ns()
            await call()
            samples.append(time.perf_counter_ns() - before)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, (time.perf_counter_ns() - start) / 1e9


async def concurrent(
    daemon: Daemon,
    case: Case,
    encoded: Encoded,
    protocol: str,
    concurrency: int,
    duration_s: float,
    warm_up_s: float,
) -> tuple[Latency, float]:
    """One protocol at ``concurrency`` for ``duration_s`` after ``warm_up_s``; returns the
    latencies and the daemon's CPU ms per request over the measured window."""
    call: Callable[[], Awaitable[np.ndarray]]
    if protocol == GRPC:
        channel = grpc.aio.insecure_channel(
            daemon.grpc_target, options=grpc_channel_options(GRPC_MAX_MESSAGE)
        )
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]

        async def call() -> np.ndarray:
            return grpc_output(await stub.ModelInfer(encoded.grpc, timeout=CLIENT_TIMEOUT_S))

        close: Callable[[], Awaitable[None]] = channel.close
    else:
        connector = aiohttp.TCPConnector(limit=concurrency)
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
        session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        url = f"{daemon.base_url}/v2/models/{case.model}/infer"
        body, headers = encoded.http(protocol)

        async def call() -> np.ndarray:
            async with session.post(url, data=body, headers=headers) as response:
                content = await response.read()
                header_length = response.headers.get(HEADER_LENGTH)
                return _answer(response.status, content, header_length)

        close = session.close
    try:
        check_output(f"{protocol} asyncio", await call(), case.expected)
        await _drive(call, concurrency, warm_up_s)
        cpu_before = process_cpu_s(daemon.pid)
        samples, elapsed_s = await _drive(call, concurrency, duration_s)
        cpu_ms = (process_cpu_s(daemon.pid) - cpu_before) * 1e3 / max(len(samples), 1)
    finally:
        await close()
    return summarize(protocol, samples, elapsed_s), cpu_ms


# --- measuring ----------------------------------------------------------------------------


def sequential(
    daemon: Daemon,
    case: Case,
    client: str,
    calls: dict[str, Call],
    sizes: dict[str, int],
    warm_up: int,
    count: int,
) -> list[Row]:
    rows = []
    for protocol in PROTOCOLS:
        for _ in range(warm_up):
            calls[protocol]()
        cpu_before = process_cpu_s(daemon.pid)
        latency = time_count(calls[protocol], count, protocol)
        cpu_ms = (process_cpu_s(daemon.pid) - cpu_before) * 1e3 / count
        rows.append(Row(case.model, client, protocol, 1, sizes[protocol], latency, cpu_ms))
        print(
            f"{case.model} {client} {protocol} c1: p50 {latency.p50_ms:.3f} ms, "
            f"{latency.per_s:,.1f}/s, daemon CPU {cpu_ms:.3f} ms/request",
            file=sys.stderr,
        )
    return rows


def verify(case: Case, client: str, calls: dict[str, Call]) -> None:
    for protocol, call in calls.items():
        check_output(f"{case.model} over {protocol} ({client})", call(), case.expected)


Kinds = dict[str, dict[str, dict[str, Call]]]  # client kind -> model -> protocol -> call


def measure_embedding(
    daemon: Daemon, case: Case, encoded: Encoded, kinds: Kinds, args: argparse.Namespace
) -> list[Row]:
    """c1 with both client kinds, then c16 with the pre-encoded ones (asyncio)."""
    sizes = {TRITON: TritonClients.request_bytes(case), PRE_ENCODED: encoded.sizes()}
    rows: list[Row] = []
    for kind in (TRITON, PRE_ENCODED):
        calls = kinds[kind][case.model]
        rows += sequential(
            daemon, case, kind, calls, sizes[kind], warm_up_count(args), args.requests
        )
    for protocol in PROTOCOLS:
        latency, cpu_ms = asyncio.run(
            concurrent(daemon, case, encoded, protocol, CONCURRENCY, args.duration, warm_up_s(args))
        )
        size = sizes[PRE_ENCODED][protocol]
        rows.append(Row(case.model, PRE_ENCODED, protocol, CONCURRENCY, size, latency, cpu_ms))
        print(
            f"{case.model} {PRE_ENCODED} {protocol} c{CONCURRENCY}: p50 {latency.p50_ms:.3f} ms, "
            f"{latency.per_s:,.0f}/s, daemon CPU {cpu_ms:.3f} ms/request",
            file=sys.stderr,
        )
    return rows


def measure_wrk(
    daemon: Daemon, encoded: Encoded, body_file: Path, args: argparse.Namespace
) -> list[Row]:
    """wrk with the pre-encoded JSON body at c1 and c16 (a cross-check of the JSON rows)."""
    body_file.write_bytes(encoded.json_body)
    url = f"{daemon.base_url}/v2/models/{EMBEDDING}/infer"
    rows = []
    for threads, connections in ((1, 1), (2, CONCURRENCY)):
        run_wrk(url, body_file, threads, connections, warm_up_s(args))
        cpu_before = process_cpu_s(daemon.pid)
        result = run_wrk(url, body_file, threads, connections, args.duration)
        cpu_ms = (process_cpu_s(daemon.pid) - cpu_before) * 1e3 / max(result["requests"], 1)
        print(f"wrk -c{connections}: {json.dumps(result)}", file=sys.stderr)
        latency = wrk_row(JSON_HTTP, result)
        size = len(encoded.json_body)
        rows.append(Row(EMBEDDING, "wrk", JSON_HTTP, connections, size, latency, cpu_ms))
    return rows


def measure_images(
    daemon: Daemon, case: Case, encoded: Encoded, kinds: Kinds, args: argparse.Namespace
) -> list[Row]:
    """The image batch at c1 with both client kinds, one warm-up request each."""
    sizes = {TRITON: TritonClients.request_bytes(case), PRE_ENCODED: encoded.sizes()}
    rows: list[Row] = []
    for kind in (PRE_ENCODED, TRITON):
        calls = kinds[kind][case.model]
        rows += sequential(daemon, case, kind, calls, sizes[kind], 1, args.large_requests)
    return rows


def warm_up_count(args: argparse.Namespace) -> int:
    return min(100, int(args.requests))


def warm_up_s(args: argparse.Namespace) -> float:
    return min(2.0, float(args.duration))


# --- report -------------------------------------------------------------------------------


def _yes(met: bool) -> str:
    return "yes" if met else "**no**"


def _size(count: int | None) -> str:
    if count is None:
        return "-"
    if count >= 1_000_000:
        return f"{count / 1e6:,.1f} MB"
    return f"{count:,} B"


def find(rows: Sequence[Row], model: str, client: str, protocol: str, concurrency: int) -> Row:
    return next(
        r
        for r in rows
        if (r.model, r.client, r.protocol, r.concurrency) == (model, client, protocol, concurrency)
    )


def report(
    machine: str,
    rows: list[Row],
    in_process: dict[str, Latency],
    cases: dict[str, Case],
    args: argparse.Namespace,
) -> str:
    large_mb = cases[IMAGES].input_bytes / 1e6
    lines = [
        "## Protocol benchmark: JSON HTTP, binary HTTP and gRPC",
        "",
        f"- {machine}",
        f"- command: `{command_line()}`",
        f"- models (preloaded, pinned, `intra_op_threads = 1`, batching at server defaults): "
        f"`{EMBEDDING}` FP32 [1, {EMBEDDING_WIDTH}] -> MatMul -> [1, {EMBEDDING_WIDTH}]; "
        f"`{IMAGES}` FP32 {list(cases[IMAGES].model_input.shape)} ({large_mb:.1f} MB) -> "
        f"per-image mean -> [{IMAGE_BATCH}]",
        f"- clients: **{TRITON}** = tritonclient.http (`binary_data=False`/`True`) and "
        f"tritonclient.grpc, building each request from numpy and decoding the answer; "
        f"**{PRE_ENCODED}** = http.client (c1) or aiohttp (c16) and a grpcio stub, sending a "
        "request encoded once (JSON by orjson), decoding each answer to numpy. c1: one request "
        "at a time on one keep-alive connection; c16: 16 asyncio tasks sharing one aiohttp "
        "pool of 16 connections or one gRPC channel. Every answer was checked against "
        "onnxruntime before timing; a failed request aborts the run.",
        "",
        f"### `{EMBEDDING}`: one row in, 1x{EMBEDDING_WIDTH} FP32 out",
        "",
        "| client | protocol | concurrency | request size | p50 ms | p99 ms | requests/s "
        "| daemon CPU ms/request | errors |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r.model == EMBEDDING:
            lat = r.latency
            errors = str(lat.errors) if r.client == "wrk" else "-"
            lines.append(
                f"| {r.client} | {r.protocol} | {r.concurrency} | {_size(r.request_bytes)} "
                f"| {lat.p50_ms:.3f} | {lat.p99_ms:.3f} | {lat.per_s:,.0f} "
                f"| {r.daemon_cpu_ms:.3f} | {errors} |"
            )
    embed_ref = in_process[EMBEDDING]
    lines += [
        f"| in-process session.run | - | 1 | - | {embed_ref.p50_ms:.3f} | "
        f"{embed_ref.p99_ms:.3f} | {embed_ref.per_s:,.0f} | - | - |",
        "",
        f"### `{IMAGES}`: {large_mb:.1f} MB FP32 in, {IMAGE_BATCH} floats out "
        f"({args.large_requests} requests per row, concurrency 1)",
        "",
        "| client | protocol | request size | p50 ms | p99 ms | requests/s | input MB/s "
        "| daemon CPU ms/request |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r.model == IMAGES:
            lat = r.latency
            lines.append(
                f"| {r.client} | {r.protocol} | {_size(r.request_bytes)} | {lat.p50_ms:,.1f} "
                f"| {lat.p99_ms:,.1f} | {lat.per_s:.2f} | {lat.per_s * large_mb:,.1f} "
                f"| {r.daemon_cpu_ms:,.1f} |"
            )
    image_ref = in_process[IMAGES]
    lines += [
        f"| in-process session.run | - | - | {image_ref.p50_ms:,.1f} | {image_ref.p99_ms:,.1f} "
        f"| {image_ref.per_s:.2f} | {image_ref.per_s * large_mb:,.1f} | - |",
        "",
        "### Against the aims of issue 4",
        "",
        "| aim | client | ours | met |",
        "| --- | --- | ---: | --- |",
    ]
    for client in (PRE_ENCODED, TRITON):
        json_p50 = find(rows, IMAGES, client, JSON_HTTP, 1).latency.p50_ms
        for protocol in (BINARY_HTTP, GRPC):
            p50 = find(rows, IMAGES, client, protocol, 1).latency.p50_ms
            speedup = json_p50 / p50
            lines.append(
                f"| {protocol} moves the {large_mb:.1f} MB tensor >= {AIM_LARGE_SPEEDUP:g}x "
                f"faster than JSON (p50 ratio) | {client} | {speedup:.1f}x ({json_p50:,.0f} / "
                f"{p50:,.0f} ms) | {_yes(speedup >= AIM_LARGE_SPEEDUP)} |"
            )
    for client in (PRE_ENCODED, TRITON):
        grpc_p50 = find(rows, EMBEDDING, client, GRPC, 1).latency.p50_ms
        json_p50 = find(rows, EMBEDDING, client, JSON_HTTP, 1).latency.p50_ms
        lines.append(
            f"| gRPC p50 at c1 <= JSON HTTP p50 (one row) | {client} | {grpc_p50:.3f} vs "
            f"{json_p50:.3f} ms ({grpc_p50 - json_p50:+.3f}) | {_yes(grpc_p50 <= json_p50)} |"
        )
    lines += [
        "",
        "- The two client kinds are compared only with themselves: tritonclient's JSON "
        "encoding (stdlib `json` over Python floats, about 20 bytes per value) is part of "
        "its JSON rows, the pre-encoded rows leave every client-side encoding out.",
        "- daemon CPU ms/request: the daemon process's user + system CPU time (all threads) "
        "over the measured window divided by the requests in it, so it leaves the client "
        "out.",
        "- wrk rows (when present) send the pre-encoded JSON body from C; they are a "
        "cross-check of the Python JSON rows, not part of the aims.",
        "- Python clients and the daemon share the machine's CPUs; at c16 the client side "
        "is often the limit. Compare rows of one run only.",
        "",
    ]
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=int, default=1000, help="sequential requests per c1 row (1000)"
    )
    parser.add_argument(
        "--large-requests", type=int, default=5, help="requests per image-batch row (5)"
    )
    parser.add_argument(
        "--duration", type=float, default=10.0, help="seconds per c16 and wrk run (10)"
    )
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the daemon")
    parser.add_argument("--no-wrk", dest="wrk", action="store_false", help="skip the wrk rows")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    use_wrk = args.wrk and shutil.which("wrk") is not None
    if args.wrk and not use_wrk:
        print("wrk not found (bash bench/setup.sh); skipping the wrk rows", file=sys.stderr)
    machine = machine_line()
    with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
        workdir = Path(tmp)
        config = write_config(workdir)
        sessions = {
            EMBEDDING: new_session(workdir / "embedding.onnx"),
            IMAGES: new_session(workdir / "image_mean.onnx"),
        }
        inputs = {EMBEDDING: random_rows(1, EMBEDDING_WIDTH), IMAGES: image_batch()}
        cases = {
            name: Case(name, inputs[name], sessions[name].run(None, {"x": inputs[name]})[0])
            for name in (EMBEDDING, IMAGES)
        }
        in_process = {
            EMBEDDING: time_count(
                lambda: sessions[EMBEDDING].run(None, {"x": inputs[EMBEDDING]}), args.requests
            ),
            IMAGES: time_count(
                lambda: sessions[IMAGES].run(None, {"x": inputs[IMAGES]}), args.large_requests
            ),
        }
        encoded = {name: Encoded.of(case) for name, case in cases.items()}

        rows: list[Row] = []
        daemon = Daemon(args.python, config)
        triton: TritonClients | None = None
        direct: PreEncodedClients | None = None
        try:
            print(f"daemon up: http={daemon.http_port} grpc={daemon.grpc_port}", file=sys.stderr)
            with httpx.Client(base_url=daemon.base_url, timeout=60.0) as client:
                wait_ready(client, "/health/ready")
                for name in cases:
                    wait_loaded(client, name)  # preloaded: no load inside the timings
            triton = TritonClients(daemon)
            direct = PreEncodedClients(daemon)
            kinds = {
                TRITON: {name: triton.calls(case) for name, case in cases.items()},
                PRE_ENCODED: {
                    name: direct.calls(case, encoded[name]) for name, case in cases.items()
                },
            }
            for client_kind, by_model in kinds.items():
                for name, calls in by_model.items():
                    verify(cases[name], client_kind, calls)

            rows += measure_embedding(daemon, cases[EMBEDDING], encoded[EMBEDDING], kinds, args)
            if use_wrk:
                rows += measure_wrk(daemon, encoded[EMBEDDING], workdir / "embedding.json", args)
            rows += measure_images(daemon, cases[IMAGES], encoded[IMAGES], kinds, args)
        except BaseException:
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
            raise
        finally:
            for clients in (triton, direct):
                if clients is not None:
                    clients.close()
            daemon.stop_and_warn()

    markdown = report(machine, rows, in_process, cases, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
