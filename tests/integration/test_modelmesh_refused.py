"""A `loadModel` that fails, played against the real daemon over gRPC as ModelMesh does: refused
for memory, or failing on a bad file, it leaves nothing under the model's id (inference for it
is NOT_FOUND, ModelMesh's "not here", however the id is given), and a later `loadModel` of the
same id loads and serves as usual."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from broken_models import external_missing
from daemon import Daemon
from onnx_models import reference_session, write_mlp

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc
from snoozeml.proto import model_runtime_pb2 as mm
from snoozeml.proto import model_runtime_pb2_grpc as mm_grpc

X = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
DIMS = (4, 65536, 2)  # 1.5 MiB of weights, a 3.7 MiB peak: one fits the budget, two do not


@pytest.fixture(scope="module")
def daemon(module_serve: Any) -> Daemon:
    return module_serve("""
[server]
modelmesh_port = 0
[server.memory]
host_budget = "4MiB"
memory_wait = "0.2s"
""")


@pytest.fixture(scope="module")
def spi(daemon: Daemon) -> Iterator[mm_grpc.ModelRuntimeStub]:
    with grpc.insecure_channel(f"127.0.0.1:{daemon.modelmesh_port}") as channel:
        yield mm_grpc.ModelRuntimeStub(channel)


@pytest.fixture(scope="module")
def oip(daemon: Daemon) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def load(spi: mm_grpc.ModelRuntimeStub, model_id: str, path: Path) -> int:
    request = mm.LoadModelRequest(modelId=model_id, modelType="onnx", modelPath=str(path))
    return int(spi.loadModel(request).sizeInBytes)


def infer(oip: pb_grpc.GRPCInferenceServiceStub, name: str = "",
          metadata: tuple[tuple[str, str], ...] = ()) -> np.ndarray:
    request = pb.ModelInferRequest(model_name=name)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=list(X.shape))
    tensor.contents.fp32_contents.extend(X.reshape(-1).tolist())
    reply = oip.ModelInfer(request, metadata=metadata)
    return np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(
        reply.outputs[0].shape)


def codes_for(oip: pb_grpc.GRPCInferenceServiceStub, model_id: str) -> list[grpc.StatusCode]:
    """What ModelInfer (by `mm-model-id`, and by the injected name) and ModelReady answer for
    `model_id`: their status codes."""
    calls = (
        lambda: infer(oip, "", (("mm-model-id", model_id),)),
        lambda: infer(oip, model_id),
        lambda: oip.ModelReady(pb.ModelReadyRequest(), metadata=(("mm-model-id", model_id),)),
    )
    codes = []
    for call in calls:
        with pytest.raises(grpc.RpcError) as error:
            call()
        codes.append(error.value.code())
    return codes


def index(daemon: Daemon) -> list[str]:
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        return [m["name"] for m in client.post("/v2/repository/index").json()]


def test_a_load_refused_for_memory_leaves_nothing_and_loads_once_there_is_room(
    spi: mm_grpc.ModelRuntimeStub, oip: pb_grpc.GRPCInferenceServiceStub, daemon: Daemon,
    tmp_path: Path,
) -> None:
    first = write_mlp(tmp_path / "first.onnx", dims=DIMS, seed=1)
    second = write_mlp(tmp_path / "second.onnx", dims=DIMS, seed=2)
    load(spi, "first", first)
    with pytest.raises(grpc.RpcError) as error:
        load(spi, "second", second)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "not enough memory" in (error.value.details() or "")

    assert codes_for(oip, "second") == [grpc.StatusCode.NOT_FOUND] * 3  # not "no memory"
    assert "second" not in index(daemon)

    spi.unloadModel(mm.UnloadModelRequest(modelId="first"))  # ModelMesh makes room here
    assert load(spi, "second", second) > 0
    expected = reference_session(second).run(None, {"x": X})[0]
    np.testing.assert_allclose(infer(oip, "", (("mm-model-id", "second"),)), expected,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(infer(oip, "second"), expected, rtol=1e-5, atol=1e-6)
    spi.unloadModel(mm.UnloadModelRequest(modelId="second"))


def test_a_load_that_fails_on_a_bad_file_leaves_nothing_and_the_id_loads_later(
    spi: mm_grpc.ModelRuntimeStub, oip: pb_grpc.GRPCInferenceServiceStub, daemon: Daemon,
    tmp_path: Path,
) -> None:
    broken = external_missing(tmp_path)  # an ONNX file whose weights file is missing
    with pytest.raises(grpc.RpcError) as error:
        load(spi, "flaky", broken)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no-data.data" in (error.value.details() or "")
    assert codes_for(oip, "flaky") == [grpc.StatusCode.NOT_FOUND] * 3
    assert "flaky" not in index(daemon)

    good = write_mlp(tmp_path / "good" / "model.onnx", dims=DIMS, seed=3)
    assert load(spi, "flaky", good.parent) > 0
    expected = reference_session(good).run(None, {"x": X})[0]
    np.testing.assert_allclose(infer(oip, "flaky"), expected, rtol=1e-5, atol=1e-6)
    spi.unloadModel(mm.UnloadModelRequest(modelId="flaky"))
