"""The protocol scenario's clients: tritonclient (requests built per call, as an application
does) and pre-encoded ones (http.client or aiohttp, a grpcio stub) sending requests encoded
once, each over JSON HTTP, binary HTTP and gRPC."""

from __future__ import annotations

import asyncio
import http.client
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from harness.daemon import Daemon
from harness.oip import (
    HEADER_LENGTH,
    JSON_HEADERS,
    binary_headers,
    binary_request,
    grpc_channel_options,
    grpc_output,
    grpc_request,
    grpc_stub,
    http_output,
    json_request,
)

JSON_HTTP, BINARY_HTTP, GRPC = "JSON HTTP", "binary HTTP", "gRPC"
TRITON, PRE_ENCODED = "tritonclient", "pre-encoded"  # the two kinds of client
EMBEDDING, IMAGES = "embedding", "images"  # the two models
IMAGE_BATCH = 64
CONCURRENCY = 16
PROTOCOLS = (JSON_HTTP, BINARY_HTTP, GRPC)
GRPC_MAX_MESSAGE = 256 * 1024 * 1024
CLIENT_TIMEOUT_S = 600.0

Call = Callable[[], np.ndarray]


@dataclass(frozen=True)
class Case:
    """One model with its fixed input and onnxruntime's answer to it."""

    model: str
    model_input: np.ndarray
    expected: np.ndarray


class TritonClients:
    """tritonclient.http and tritonclient.grpc, unmodified; requests built per call."""

    def __init__(self, daemon: Daemon) -> None:
        self.http = triton_http.InferenceServerClient(
            f"127.0.0.1:{daemon.http_port}", connection_timeout=CLIENT_TIMEOUT_S,
            network_timeout=CLIENT_TIMEOUT_S)
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
                return _some(self.http.infer(case.model, [tensor], outputs=[wanted])
                             .as_numpy("y"))

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
                [tensor], outputs=[wanted])
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
        return cls(json_request(case.model_input), body, header_length,
                   grpc_request(case.model, case.model_input))

    def http(self, protocol: str) -> tuple[bytes, dict[str, str]]:
        if protocol == JSON_HTTP:
            return self.json_body, JSON_HEADERS
        return self.binary_body, binary_headers(self.binary_header_length)

    def sizes(self) -> dict[str, int]:
        return {JSON_HTTP: len(self.json_body), BINARY_HTTP: len(self.binary_body),
                GRPC: self.grpc.ByteSize()}


def answer(status: int, body: bytes, header_length: str | None) -> np.ndarray:
    if status != 200:
        raise RuntimeError(f"infer: {status} {body[:500]!r}")
    return http_output(body, header_length)


class PreEncodedClients:
    """http.client (one keep-alive connection, the least a Python client can add) and a
    grpcio stub, sending pre-encoded requests."""

    def __init__(self, daemon: Daemon) -> None:
        self.http = http.client.HTTPConnection("127.0.0.1", daemon.http_port,
                                               timeout=CLIENT_TIMEOUT_S)
        self.channel = grpc.insecure_channel(daemon.grpc_target,
                                             options=grpc_channel_options(GRPC_MAX_MESSAGE))
        self.stub = grpc_stub(self.channel)

    def close(self) -> None:
        self.http.close()
        self.channel.close()

    def _post(self, path: str, body: bytes,
              headers: dict[str, str]) -> tuple[int, bytes, str | None]:
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
            return lambda: answer(*self._post(path, body, headers))

        def over_grpc() -> np.ndarray:
            return grpc_output(self.stub.ModelInfer(encoded.grpc, timeout=CLIENT_TIMEOUT_S))

        return {JSON_HTTP: over_http(JSON_HTTP), BINARY_HTTP: over_http(BINARY_HTTP),
                GRPC: over_grpc}


async def drive(call: Callable[[], Awaitable[np.ndarray]], concurrency: int,
                duration_s: float) -> tuple[list[int], float]:
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


def async_call(daemon: Daemon, case: Case, encoded: Encoded, protocol: str, concurrency: int,
               ) -> tuple[Callable[[], Awaitable[np.ndarray]], Callable[[], Awaitable[None]]]:
    """An asyncio call of one protocol (grpc.aio, or aiohttp with a pool of ``concurrency``
    connections) and what closes its client; made inside the running loop."""
    if protocol == GRPC:
        channel = grpc.aio.insecure_channel(daemon.grpc_target,
                                            options=grpc_channel_options(GRPC_MAX_MESSAGE))
        stub = grpc_stub(channel)

        async def grpc_call() -> np.ndarray:
            return grpc_output(await stub.ModelInfer(encoded.grpc, timeout=CLIENT_TIMEOUT_S))

        return grpc_call, channel.close
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                    timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S))
    url = daemon.infer_url(case.model)
    body, headers = encoded.http(protocol)

    async def http_call() -> np.ndarray:
        async with session.post(url, data=body, headers=headers) as response:
            content = await response.read()
            return answer(response.status, content, response.headers.get(HEADER_LENGTH))

    return http_call, session.close
