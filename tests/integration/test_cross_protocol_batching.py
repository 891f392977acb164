"""HTTP and gRPC requests for one model share its batch queue (issue 4, Done means 3): they
land in the same batches, and each client gets exactly its own rows back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from daemon import Daemon
from onnx_models import reference_session, write_mlp

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

DIMS = (16, 32, 8)

CONFIG = """
[[models]]
name = "mlp"
path = "mlp.onnx"
preload = true
[models.batching]
max_batch_size = 64
max_delay = "20ms"

# A batch leaves only when it holds exactly 24 rows (or after 10 s, which would fail the
# test): the 24 rows of a test's requests can only travel together.
[[models]]
name = "mlp_exact"
path = "mlp.onnx"
preload = true
[models.batching]
max_batch_size = 24
max_delay = "10s"
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cross_protocol")
    write_mlp(folder / "mlp.onnx", dims=DIMS, seed=11)
    return folder


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: Path) -> Daemon:
    started: Daemon = module_serve(CONFIG, directory=models)
    for name in ("mlp", "mlp_exact"):
        started.wait_for_log(rf"model_loaded model={name} ")
    return started


def http_body(x: np.ndarray, request_id: str) -> dict[str, Any]:
    return {"id": request_id, "inputs": [
        {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    ]}


def grpc_request(model: str, x: np.ndarray, request_id: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request


async def send_both(
    daemon: Daemon, model: str, http_inputs: list[np.ndarray], grpc_inputs: list[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, Any]]:
    """All requests at once, over both protocols; their outputs and the model's status."""
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with (
        httpx.AsyncClient(base_url=daemon.url, timeout=60, limits=limits) as http,
        grpc.aio.insecure_channel(daemon.grpc_address) as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        async def over_http(i: int, x: np.ndarray) -> np.ndarray:
            response = await http.post(f"/v2/models/{model}/infer",
                                       json=http_body(x, f"http-{i}"))
            assert response.status_code == 200, response.text
            doc = response.json()
            assert doc["id"] == f"http-{i}"
            (out,) = doc["outputs"]
            return np.asarray(out["data"], np.float32).reshape(out["shape"])

        async def over_grpc(i: int, x: np.ndarray) -> np.ndarray:
            response = await stub.ModelInfer(grpc_request(model, x, f"grpc-{i}"), timeout=60)
            assert response.id == f"grpc-{i}"
            (out,) = response.outputs
            return np.frombuffer(response.raw_output_contents[0], "<f4").reshape(
                list(out.shape))

        results = await asyncio.gather(
            *(over_http(i, x) for i, x in enumerate(http_inputs)),
            *(over_grpc(i, x) for i, x in enumerate(grpc_inputs)),
        )
        status = (await http.get("/admin/status")).json()
    entry = next(m for m in status["models"] if m["name"] == model)
    return list(results[:len(http_inputs)]), list(results[len(http_inputs):]), entry


def assert_own_rows(models: Path, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
    """Each output equals onnxruntime's run on that request's input alone."""
    session = reference_session(models / "mlp.onnx")
    for x, got in zip(inputs, outputs, strict=True):
        alone = session.run(None, {"x": x})[0]
        assert got.shape == alone.shape
        np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-6)


def test_concurrent_http_and_grpc_requests_share_batches_and_get_their_own_rows(
    daemon: Daemon, models: Path
) -> None:
    rng = np.random.default_rng(2024)

    def rows() -> np.ndarray:
        return rng.standard_normal((int(rng.integers(1, 4)), DIMS[0])).astype(np.float32)

    http_inputs = [rows() for _ in range(32)]
    grpc_inputs = [rows() for _ in range(32)]

    http_out, grpc_out, entry = asyncio.run(send_both(daemon, "mlp", http_inputs, grpc_inputs))

    assert_own_rows(models, http_inputs, http_out)
    assert_own_rows(models, grpc_inputs, grpc_out)
    batching = entry["batching"]
    assert batching["requests"] == len(http_inputs) + len(grpc_inputs)
    assert batching["rows"] == sum(len(x) for x in http_inputs + grpc_inputs)
    assert batching["batches"] < batching["requests"]
    assert batching["largest_batch"] > 1
    assert entry["errors"] == 0


def test_one_batch_holds_requests_from_both_protocols(daemon: Daemon, models: Path) -> None:
    # 8 HTTP requests of 1 row and 8 gRPC requests of 2 rows make exactly the 24 rows that
    # mlp_exact waits for, whatever order they arrive in.
    rng = np.random.default_rng(24)
    http_inputs = [rng.standard_normal((1, DIMS[0])).astype(np.float32) for _ in range(8)]
    grpc_inputs = [rng.standard_normal((2, DIMS[0])).astype(np.float32) for _ in range(8)]

    http_out, grpc_out, entry = asyncio.run(
        send_both(daemon, "mlp_exact", http_inputs, grpc_inputs)
    )

    assert_own_rows(models, http_inputs, http_out)
    assert_own_rows(models, grpc_inputs, grpc_out)
    batching = entry["batching"]
    assert batching["batches"] == 1
    assert batching["requests"] == 16
    assert batching["largest_batch"] == 16
    assert batching["rows"] == 24
    assert entry["errors"] == 0
