"""ModelMesh's side of the model-runtime SPI, played against the real daemon over gRPC: status,
sizes, loads of an ONNX file and a safetensors folder, inference routed by `mm-model-id` (and
by the injected id), unloads, cancelled loads, the purge at ModelMesh's restart, and errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import transformers
from daemon import Daemon
from oip_http import index_of
from onnx_models import reference_session, write_big_model, write_mlp
from torch_models import TINY_BERT, forward, save_bert, token_rows

from snoozeml import __version__
from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc
from snoozeml.proto import model_runtime_pb2 as mm
from snoozeml.proto import model_runtime_pb2_grpc as mm_grpc

BUDGET = 400 * 1024 * 1024
X = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mesh-models")
    write_mlp(root / "mlp.onnx", seed=1)
    (root / "mlp-folder").mkdir()  # ModelMesh's puller: a model's files in a folder of its own
    write_mlp(root / "mlp-folder" / "model.onnx", seed=2)
    save_bert(root / "bert", transformers.BertModel, seed=4, **TINY_BERT)
    write_big_model(root / "big.onnx", megabytes=40)
    (root / "two").mkdir()
    write_mlp(root / "two" / "a.onnx")
    write_mlp(root / "two" / "b.onnx")
    return root


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: Path) -> Daemon:
    started: Daemon = module_serve(f"""
[server]
modelmesh_port = 0
load_timeout = "90s"
modelmesh_loading_concurrency = 3
modelmesh_default_model_size = "32MiB"
[server.memory]
host_budget = {BUDGET}
memory_wait = "1s"

[[models]]
name = "configured"
path = "{models / 'mlp.onnx'}"
""")
    assert started.modelmesh_port
    return started


@pytest.fixture(scope="module")
def spi(daemon: Daemon) -> Iterator[mm_grpc.ModelRuntimeStub]:
    with grpc.insecure_channel(f"127.0.0.1:{daemon.modelmesh_port}") as channel:
        yield mm_grpc.ModelRuntimeStub(channel)


@pytest.fixture(scope="module")
def oip(daemon: Daemon) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=120) as client:
        yield client


def load_request(model_id: str, path: Path, model_type: str = "", key: str = "") -> Any:
    return mm.LoadModelRequest(modelId=model_id, modelType=model_type, modelPath=str(path),
                               modelKey=key)


def infer_mlp(oip: pb_grpc.GRPCInferenceServiceStub, name: str = "",
              metadata: tuple[tuple[str, Any], ...] = ()) -> np.ndarray:
    request = pb.ModelInferRequest(model_name=name)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=list(X.shape))
    tensor.contents.fp32_contents.extend(X.reshape(-1).tolist())
    reply = oip.ModelInfer(request, metadata=metadata)
    out = reply.outputs[0]
    return np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(out.shape)


def memory(http: httpx.Client) -> dict[str, Any]:
    status = http.get("/admin/status").json()
    return next(d for d in status["devices"] if d["name"] == "cpu")


def model_status(http: httpx.Client, name: str) -> dict[str, Any] | None:
    return next((m for m in http.get("/admin/status").json()["models"] if m["name"] == name),
                None)


def test_runtime_status_reports_the_budget_config_and_id_injection(
    spi: mm_grpc.ModelRuntimeStub, http: httpx.Client,
) -> None:
    status = spi.runtimeStatus(mm.RuntimeStatusRequest())
    assert status.status == mm.RuntimeStatusResponse.READY
    assert status.capacityInBytes == BUDGET == memory(http)["budget_bytes"]
    assert status.maxLoadingConcurrency == 3
    assert status.modelLoadingTimeoutMs == 90_000
    assert status.defaultModelSizeInBytes == 32 * 1024 * 1024
    assert status.runtimeVersion == __version__
    infer = status.methodInfos["inference.GRPCInferenceService/ModelInfer"]
    assert list(infer.idInjectionPath) == [1]
    assert list(status.methodInfos["inference.GRPCInferenceService/ModelMetadata"]
                .idInjectionPath) == [1]


def test_an_onnx_file_loads_serves_by_mm_model_id_and_unloads(
    spi: mm_grpc.ModelRuntimeStub, oip: pb_grpc.GRPCInferenceServiceStub, http: httpx.Client,
    models: Path,
) -> None:
    before = memory(http)["used_bytes"]
    path = models / "mlp-folder"
    predicted = spi.predictModelSize(mm.PredictModelSizeRequest(
        modelId="mlp__isvc-1", modelType="onnx", modelPath=str(path))).sizeInBytes
    assert predicted >= (path / "model.onnx").stat().st_size

    loaded = spi.loadModel(load_request("mlp__isvc-1", path, "onnx"))
    assert loaded.sizeInBytes > 0
    assert spi.modelSize(mm.ModelSizeRequest(modelId="mlp__isvc-1")).sizeInBytes == \
        loaded.sizeInBytes
    entry = model_status(http, "mlp__isvc-1")
    assert entry is not None
    assert (entry["origin"], entry["state"], entry["pinned"]) == ("modelmesh", "READY", True)
    assert memory(http)["used_bytes"] == before + loaded.sizeInBytes

    expected = reference_session(path / "model.onnx").run(None, {"x": X})[0]
    # Routed by metadata alone, by the binary header, and by the injected id alone.
    np.testing.assert_allclose(infer_mlp(oip, "", (("mm-model-id", "mlp__isvc-1"),)),
                               expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(infer_mlp(oip, "", (("mm-model-id-bin", b"mlp__isvc-1"),)),
                               expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(infer_mlp(oip, "mlp__isvc-1"), expected, rtol=1e-5, atol=1e-6)
    # The metadata wins over whatever the request's own name says.
    np.testing.assert_allclose(infer_mlp(oip, "configured", (("mm-model-id", "mlp__isvc-1"),)),
                               expected, rtol=1e-5, atol=1e-6)
    metadata = oip.ModelMetadata(pb.ModelMetadataRequest(),
                                 metadata=(("mm-model-id", "mlp__isvc-1"),))
    assert (metadata.name, metadata.inputs[0].name) == ("mlp__isvc-1", "x")

    spi.unloadModel(mm.UnloadModelRequest(modelId="mlp__isvc-1"))
    with pytest.raises(grpc.RpcError) as error:
        infer_mlp(oip, "", (("mm-model-id", "mlp__isvc-1"),))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "mlp__isvc-1" not in index_of(http)
    assert memory(http)["used_bytes"] == before
    with pytest.raises(grpc.RpcError) as error:
        spi.modelSize(mm.ModelSizeRequest(modelId="mlp__isvc-1"))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    # Unknown, or already gone: OK at once.
    spi.unloadModel(mm.UnloadModelRequest(modelId="mlp__isvc-1"))


def test_a_safetensors_folder_loads_and_matches_torch(
    spi: mm_grpc.ModelRuntimeStub, oip: pb_grpc.GRPCInferenceServiceStub, http: httpx.Client,
    models: Path,
) -> None:
    key = json.dumps({"model_type": {"name": "pytorch"}, "storage_key": "local"})
    predicted = spi.predictModelSize(mm.PredictModelSizeRequest(
        modelId="bert", modelKey=key, modelPath=str(models / "bert"))).sizeInBytes
    weights = sum(f.stat().st_size for f in (models / "bert").glob("*.safetensors"))
    assert predicted >= weights
    loaded = spi.loadModel(load_request("bert", models / "bert", key=key))
    assert loaded.sizeInBytes > 0
    try:
        ids, mask = token_rows([5, 9], 9, seed=2)
        request = pb.ModelInferRequest()
        for name, array in (("input_ids", ids), ("attention_mask", mask)):
            tensor = request.inputs.add(name=name, datatype="INT64", shape=list(array.shape))
            tensor.contents.int64_contents.extend(array.reshape(-1).tolist())
        request.outputs.add(name="last_hidden_state")
        reply = oip.ModelInfer(request, metadata=(("mm-model-id", "bert"),))
        hidden = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(
            reply.outputs[0].shape)
        reference = transformers.BertModel.from_pretrained(str(models / "bert")).eval()
        expected = forward(reference, ids, mask).last_hidden_state.numpy()
        np.testing.assert_allclose(hidden, expected, rtol=1e-4, atol=1e-5)
    finally:
        spi.unloadModel(mm.UnloadModelRequest(modelId="bert"))
    assert model_status(http, "bert") is None


@pytest.mark.parametrize(("path", "model_type", "expected"), [
    ("missing-folder", "onnx", "no such file or folder"),
    ("mlp.onnx", "sklearn", "model type 'sklearn' is not one SnoozeML serves"),
    ("bert", "onnx", "no ONNX model found"),
    ("two", "", "holds 2 models"),
])
def test_a_load_that_cannot_be_attempted_is_invalid_argument_and_holds_nothing(
    spi: mm_grpc.ModelRuntimeStub, http: httpx.Client, models: Path, path: str,
    model_type: str, expected: str,
) -> None:
    before = memory(http)
    with pytest.raises(grpc.RpcError) as error:
        spi.loadModel(load_request("bad", models / path, model_type))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in (error.value.details() or "")
    assert model_status(http, "bad") is None
    assert memory(http)["used_bytes"] == before["used_bytes"]


def test_ids_of_configured_models_and_bad_ids_are_refused(
    spi: mm_grpc.ModelRuntimeStub, models: Path,
) -> None:
    for model_id, expected in (("configured", "configured in models.toml"),
                               ("", "invalid model name"), ("a/b", "invalid model name")):
        with pytest.raises(grpc.RpcError) as error:
            spi.loadModel(load_request(model_id, models / "mlp.onnx"))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, model_id
        assert expected in (error.value.details() or "")


# The moments of a load a cancel may hit, each seen in the daemon's log.
PHASES = (None, r"model_added model=big", r"model_loading model=big", r"model_loaded model=big")


@pytest.mark.parametrize("phase", PHASES)
def test_a_cancelled_load_then_unload_leaves_nothing_loaded_or_reserved(
    spi: mm_grpc.ModelRuntimeStub, oip: pb_grpc.GRPCInferenceServiceStub, http: httpx.Client,
    daemon: Daemon, models: Path, phase: str | None,
) -> None:
    before = memory(http)
    for _ in range(3):
        mark = daemon.mark()
        call = spi.loadModel.future(load_request("big", models / "big.onnx", "onnx"))
        if phase is not None:
            daemon.wait_for_log(phase, start=mark, timeout=60)
        call.cancel()
        spi.unloadModel(mm.UnloadModelRequest(modelId="big"))
        assert model_status(http, "big") is None
        after = memory(http)
        assert (after["used_bytes"], after["reserved_bytes"]) == (before["used_bytes"], 0)
        with pytest.raises(grpc.RpcError) as error:
            oip.ModelReady(pb.ModelReadyRequest(), metadata=(("mm-model-id", "big"),))
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_runtime_status_purges_what_modelmesh_loaded_and_keeps_the_configured_models(
    spi: mm_grpc.ModelRuntimeStub, http: httpx.Client, models: Path,
) -> None:
    http.post("/v2/repository/models/configured/load").raise_for_status()
    spi.loadModel(load_request("first", models / "mlp.onnx"))
    spi.loadModel(load_request("second", models / "mlp-folder"))
    assert {"first", "second", "configured"} <= set(index_of(http))

    # ModelMesh's container restarted: it asks for the status again, and knows of no model.
    status = spi.runtimeStatus(mm.RuntimeStatusRequest())

    assert status.status == mm.RuntimeStatusResponse.READY
    names = index_of(http)
    assert not {"first", "second"} & set(names)
    assert names["configured"]["state"] == "READY"
    assert memory(http)["used_bytes"] == model_status(http, "configured")["resident_bytes"]
