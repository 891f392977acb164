"""Three daemons on loopback, each with a small budget, and a test client that places twelve
models the way ModelMesh does: by the capacity each runtime reports and the sizes it predicts
and measures. Every model is served where it was loaded, no daemon exceeds its budget, and an
unload makes room for a load that did not fit."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
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
from snoozeml.proto import model_runtime_pb2 as mm
from snoozeml.proto import model_runtime_pb2_grpc as mm_grpc

BUDGET_MIB = 40
WIDTHS = (4096, 6144, 8192, 10240)  # 2, 3, 4 and 5 MiB of weights
X = np.random.default_rng(9).standard_normal((2, 64)).astype(np.float32)


@dataclass
class Pod:
    """One daemon, as ModelMesh sees it: its SPI, its data endpoint and what it placed."""

    daemon: Daemon
    spi: mm_grpc.ModelRuntimeStub
    oip: pb_grpc.GRPCInferenceServiceStub
    http: httpx.Client
    capacity: int = 0
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return self.capacity - sum(self.sizes.values())

    def memory(self) -> dict[str, Any]:
        status = self.http.get("/admin/status").json()
        return next(d for d in status["devices"] if d["name"] == "cpu")


@pytest.fixture
def pods(serve: Any, tmp_path: Path) -> Iterator[list[Pod]]:
    channels: list[grpc.Channel] = []
    pods = []
    for index in range(3):
        folder = tmp_path / f"pod{index}"
        folder.mkdir()
        daemon = serve(f"""
[server]
modelmesh_port = 0
[server.memory]
host_budget = "{BUDGET_MIB}MiB"
memory_wait = "0.2s"
""", directory=folder)
        spi_channel = grpc.insecure_channel(f"127.0.0.1:{daemon.modelmesh_port}")
        oip_channel = grpc.insecure_channel(daemon.grpc_address)
        channels += [spi_channel, oip_channel]
        pods.append(Pod(daemon, mm_grpc.ModelRuntimeStub(spi_channel),
                        pb_grpc.GRPCInferenceServiceStub(oip_channel),
                        httpx.Client(base_url=daemon.url, timeout=60)))
    yield pods
    for pod in pods:
        pod.http.close()
    for channel in channels:
        channel.close()


def infer(pod: Pod, model_id: str) -> np.ndarray:
    request = pb.ModelInferRequest()
    tensor = request.inputs.add(name="x", datatype="FP32", shape=list(X.shape))
    tensor.contents.fp32_contents.extend(X.reshape(-1).tolist())
    reply = pod.oip.ModelInfer(request, metadata=(("mm-model-id", model_id),))
    return np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(
        reply.outputs[0].shape)


def place(pods: list[Pod], model_id: str, path: Path) -> Pod:
    """ModelMesh's placement: predict the size, pick the runtime with the most room left, load
    there and keep the size it measured."""
    predicted = pods[0].spi.predictModelSize(mm.PredictModelSizeRequest(
        modelId=model_id, modelType="onnx", modelPath=str(path))).sizeInBytes
    pod = max(pods, key=lambda p: p.free)
    assert pod.free >= predicted, f"no room for {model_id} anywhere"
    loaded = pod.spi.loadModel(mm.LoadModelRequest(modelId=model_id, modelType="onnx",
                                                   modelPath=str(path)))
    size = loaded.sizeInBytes or pod.spi.modelSize(
        mm.ModelSizeRequest(modelId=model_id)).sizeInBytes
    pod.sizes[model_id] = size
    return pod


def test_twelve_models_placed_across_three_daemons_by_capacity_and_size(
    pods: list[Pod], tmp_path: Path,
) -> None:
    for pod in pods:
        status = pod.spi.runtimeStatus(mm.RuntimeStatusRequest())
        assert status.status == mm.RuntimeStatusResponse.READY
        pod.capacity = status.capacityInBytes
        assert pod.capacity == BUDGET_MIB * 1024 * 1024
    paths = {}
    for i in range(12):
        paths[f"m{i}"] = write_mlp(tmp_path / f"m{i}.onnx", dims=(64, WIDTHS[i % 4], 64),
                                   seed=i)
    where = {model_id: place(pods, model_id, path) for model_id, path in paths.items()}

    assert {id(pod) for pod in where.values()} == {id(pod) for pod in pods}  # all used
    for model_id, pod in where.items():
        expected = reference_session(paths[model_id]).run(None, {"x": X})[0]
        np.testing.assert_allclose(infer(pod, model_id), expected, rtol=1e-5, atol=1e-6)
        for other in pods:
            if other is not pod:
                with pytest.raises(grpc.RpcError) as error:
                    infer(other, model_id)
                assert error.value.code() == grpc.StatusCode.NOT_FOUND
    for pod in pods:
        memory = pod.memory()
        assert memory["used_bytes"] == sum(pod.sizes.values()) <= memory["budget_bytes"]

    # The fullest daemon has no room for a big model; unloading there makes some.
    fullest = min(pods, key=lambda p: p.free)
    big = write_mlp(tmp_path / "big.onnx", dims=(64, 32768, 64), seed=99)  # 16 MiB
    request = mm.LoadModelRequest(modelId="big", modelType="onnx", modelPath=str(big))
    with pytest.raises(grpc.RpcError) as error:
        fullest.spi.loadModel(request)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "memory" in (error.value.details() or "")
    fullest.spi.unloadModel(mm.UnloadModelRequest(modelId="big"))  # as ModelMesh does
    codes = []
    while "big" not in fullest.sizes:
        assert fullest.sizes, "the big model never fitted the emptied daemon"
        victim = max(fullest.sizes, key=lambda m: fullest.sizes[m])
        fullest.spi.unloadModel(mm.UnloadModelRequest(modelId=victim))
        del fullest.sizes[victim]
        answer = fullest.spi.loadModel.future(request)
        if answer.exception() is None:
            fullest.sizes["big"] = answer.result().sizeInBytes
        else:
            codes.append(answer.code())
    assert set(codes) <= {grpc.StatusCode.UNAVAILABLE}  # refused for memory until it fits
    expected = reference_session(big).run(None, {"x": X})[0]
    np.testing.assert_allclose(infer(fullest, "big"), expected, rtol=1e-5, atol=1e-6)
    memory = fullest.memory()
    assert memory["used_bytes"] == sum(fullest.sizes.values()) <= memory["budget_bytes"]
