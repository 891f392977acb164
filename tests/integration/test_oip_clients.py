"""Real Open Inference Protocol clients, unmodified: tritonclient.http and tritonclient.grpc
against one shared daemon (issue 4, Done means 1).

Every answer is compared with what onnxruntime itself computes for the same inputs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from daemon import Daemon
from onnx_models import SERVED, reference_session, write_mlp, write_multi_dtype_model
from tritonclient.utils import InferenceServerException

CONFIG = """
[[models]]
name = "multi"
path = "multi.onnx"

[[models]]
name = "mlp"
path = "mlp.onnx"

[[models]]
name = "mlp_http_repo"
path = "mlp.onnx"

[[models]]
name = "mlp_grpc_repo"
path = "mlp.onnx"
"""

DATATYPES = {"f32": "FP32", "i64": "INT64", "flag": "BOOL", "half": "FP16", "text": "BYTES"}
OUTPUTS = [f"{name}_out" for name in DATATYPES]
# tritonclient reports an error's status as a string: the HTTP status, or the gRPC code.
NOT_FOUND = {"http": "404", "grpc": "StatusCode.NOT_FOUND"}
INVALID = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}

Client = httpclient.InferenceServerClient | grpcclient.InferenceServerClient


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("oip_clients")
    write_multi_dtype_model(folder / "multi.onnx")
    write_mlp(folder / "mlp.onnx")
    return folder


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: Path) -> Daemon:
    return module_serve(CONFIG, directory=models)  # type: ignore[no-any-return]


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.http_port}")
    yield client
    client.close()


@pytest.fixture
def grpc(daemon: Daemon) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(daemon.grpc_address)
    yield client
    client.close()


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(protocol: str, request: pytest.FixtureRequest) -> Client:
    return request.getfixturevalue(protocol)  # type: ignore[no-any-return]


def multi_feed() -> dict[str, np.ndarray]:
    """One tensor per input of the multi-dtype model, with awkward values in each."""
    return {
        "f32": np.array([[0.5, -1.25, 3.0, 1e-3], [2.5, 0.0, -7.75, 1e30]], np.float32),
        "i64": np.array([[-(2**40), 0, 2**62], [7, -1, 2**31]], np.int64),
        "flag": np.array([[True, False], [False, False], [True, True]]),
        "half": np.array([[0.5, -1.5], [1000.0, 2.0**-14]], np.float16),
        "text": np.array(
            ["héllo".encode(), b"", "日本語 ✓".encode(), b"plain ascii"], dtype=object
        ),
    }


def expected_outputs(models: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # onnxruntime takes STRING tensors as str (it would str() a bytes object).
    text = np.array([v.decode() for v in feed["text"].ravel()], dtype=object)
    feed = {**feed, "text": text.reshape(feed["text"].shape)}
    results = reference_session(models / "multi.onnx").run(OUTPUTS, feed)
    return dict(zip(OUTPUTS, results, strict=True))


def assert_equal_to_onnxruntime(
    got: dict[str, np.ndarray], expected: dict[str, np.ndarray]
) -> None:
    for name in ("f32_out", "i64_out", "flag_out", "half_out"):
        assert got[name].dtype == expected[name].dtype, name
        assert got[name].shape == expected[name].shape, name
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    text = [v if isinstance(v, bytes) else str(v).encode() for v in got["text_out"].ravel()]
    assert text == [v.encode() for v in expected["text_out"].ravel()]
    assert got["text_out"].shape == expected["text_out"].shape


def http_inputs(
    feed: dict[str, np.ndarray], binary: bool
) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in feed.items():
        tensor = httpclient.InferInput(name, list(array.shape), DATATYPES[name])
        # With binary_data=False tritonclient sends FP16 as JSON numbers, which we accept.
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs


# --- server and model metadata -----------------------------------------------------------


def test_server_is_live_and_ready_and_names_its_extensions(client: Client) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    meta = client.get_server_metadata()
    if isinstance(meta, dict):
        name, version, extensions = meta["name"], meta["version"], meta["extensions"]
    else:
        name, version, extensions = meta.name, meta.version, list(meta.extensions)
    assert name == "snoozeml"
    assert version
    assert set(extensions) == {"binary_tensor_data", "classification", "model_repository",
                               "statistics"}


def test_model_metadata_and_readiness_describe_every_tensor(client: Client) -> None:
    assert client.is_model_ready("multi") is True
    meta = client.get_model_metadata("multi")
    if not isinstance(meta, dict):
        meta = grpc_metadata_as_dict(meta)
    assert meta["name"] == "multi"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": "f32", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "i64", "datatype": "INT64", "shape": [-1, 3]},
        {"name": "flag", "datatype": "BOOL", "shape": [-1, 2]},
        {"name": "half", "datatype": "FP16", "shape": [-1, 2]},
        {"name": "text", "datatype": "BYTES", "shape": [-1]},
    ]
    assert [o["name"] for o in meta["outputs"]] == OUTPUTS
    assert [o["datatype"] for o in meta["outputs"]] == list(DATATYPES.values())


def grpc_metadata_as_dict(meta: Any) -> dict[str, Any]:
    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]

    return {"name": meta.name, "versions": list(meta.versions), "platform": meta.platform,
            "inputs": tensors(meta.inputs), "outputs": tensors(meta.outputs)}


# --- inference ---------------------------------------------------------------------------


def test_http_binary_inference_of_every_datatype_equals_onnxruntime(
    http: httpclient.InferenceServerClient, models: Path
) -> None:
    feed = multi_feed()
    # tritonclient's default: binary inputs, and binary outputs through the request's
    # binary_data_output parameter (no outputs named).
    result = http.infer("multi", http_inputs(feed, binary=True), request_id="bin-1")

    response = result.get_response()
    assert response["id"] == "bin-1"
    assert all("data" not in o for o in response["outputs"])
    got = {name: result.as_numpy(name) for name in OUTPUTS}
    assert_equal_to_onnxruntime(got, expected_outputs(models, feed))


def test_http_binary_outputs_named_one_by_one_equal_onnxruntime(
    http: httpclient.InferenceServerClient, models: Path
) -> None:
    feed = multi_feed()
    outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in OUTPUTS]

    result = http.infer("multi", http_inputs(feed, binary=True), outputs=outputs)

    got = {name: result.as_numpy(name) for name in OUTPUTS}
    assert_equal_to_onnxruntime(got, expected_outputs(models, feed))


def test_http_json_inference_of_every_datatype_equals_onnxruntime(
    http: httpclient.InferenceServerClient, models: Path
) -> None:
    feed = multi_feed()
    outputs = [httpclient.InferRequestedOutput(name, binary_data=False) for name in OUTPUTS]

    result = http.infer("multi", http_inputs(feed, binary=False), outputs=outputs)

    response = result.get_response()
    assert all("data" in o for o in response["outputs"]), response
    got = {name: result.as_numpy(name) for name in OUTPUTS}
    # JSON numbers come back as Python ints/floats; give them the model's dtypes to compare.
    expected = expected_outputs(models, feed)
    for name in ("f32_out", "i64_out", "flag_out", "half_out"):
        got[name] = np.asarray(got[name]).astype(expected[name].dtype)
    assert_equal_to_onnxruntime(got, expected)
    assert list(got["text_out"]) == ["héllo", "", "日本語 ✓", "plain ascii"]


def test_grpc_raw_inference_of_every_datatype_equals_onnxruntime(
    grpc: grpcclient.InferenceServerClient, models: Path
) -> None:
    feed = multi_feed()
    inputs = []
    for name, array in feed.items():
        tensor = grpcclient.InferInput(name, list(array.shape), DATATYPES[name])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)

    result = grpc.infer("multi", inputs, request_id="grpc-1")

    response = result.get_response()
    assert response.id == "grpc-1"
    assert response.model_name == "multi"
    assert len(response.raw_output_contents) == len(OUTPUTS)
    got = {name: result.as_numpy(name) for name in OUTPUTS}
    assert_equal_to_onnxruntime(got, expected_outputs(models, feed))


def test_grpc_returns_only_the_requested_outputs(
    grpc: grpcclient.InferenceServerClient, models: Path
) -> None:
    feed = multi_feed()
    inputs = []
    for name, array in feed.items():
        tensor = grpcclient.InferInput(name, list(array.shape), DATATYPES[name])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [grpcclient.InferRequestedOutput("half_out"),
               grpcclient.InferRequestedOutput("text_out")]

    result = grpc.infer("multi", inputs, outputs=outputs)

    assert [o.name for o in result.get_response().outputs] == ["half_out", "text_out"]
    expected = expected_outputs(models, feed)
    np.testing.assert_array_equal(result.as_numpy("half_out"), expected["half_out"])
    assert result.as_numpy("f32_out") is None


@pytest.mark.parametrize("rows", [1, 5])
def test_both_clients_get_the_mlp_rows_onnxruntime_computes(
    client: Client, protocol: str, models: Path, rows: int
) -> None:
    x = np.random.default_rng(rows).standard_normal((rows, 64)).astype(np.float32)
    module = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)

    result = client.infer("mlp", [tensor])

    expected = reference_session(models / "mlp.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(result.as_numpy("y"), expected, **SERVED)


# --- the repository extension ------------------------------------------------------------


def index_states(client: Client) -> dict[str, str]:
    if isinstance(client, grpcclient.InferenceServerClient):
        entries = client.get_model_repository_index(as_json=True)["models"]
    else:
        entries = client.get_model_repository_index()
    return {entry["name"]: entry["state"] for entry in entries}


def test_repository_index_load_and_unload_through_each_client(
    client: Client, protocol: str, daemon: Daemon
) -> None:
    name = f"mlp_{protocol}_repo"
    assert index_states(client)[name] == "UNLOADED"
    assert set(index_states(client)) >= {"multi", "mlp", "mlp_http_repo", "mlp_grpc_repo"}

    mark = daemon.mark()
    client.load_model(name)
    daemon.wait_for_log(rf"model_loaded model={name} ", start=mark)
    assert index_states(client)[name] == "READY"
    assert client.is_model_ready(name) is True

    mark = daemon.mark()
    client.unload_model(name)
    daemon.wait_for_log(rf"model_unloaded model={name} reason=admin", start=mark)
    assert index_states(client)[name] == "UNLOADED"


# --- errors ------------------------------------------------------------------------------


def test_an_unknown_model_is_not_found_for_every_call(
    client: Client, protocol: str
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("x", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
    calls = [
        lambda: client.get_model_metadata("nope"),
        lambda: client.infer("nope", [tensor]),
        lambda: client.load_model("nope"),
        lambda: client.unload_model("nope"),
    ]
    for call in calls:
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert caught.value.status() == NOT_FOUND[protocol]
        assert "unknown model 'nope'" in caught.value.message()


def test_an_unknown_model_is_not_ready(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    assert http.is_model_ready("nope") is False  # tritonclient.http: any non-200 is "not ready"
    with pytest.raises(InferenceServerException) as caught:
        grpc.is_model_ready("nope")
    assert caught.value.status() == NOT_FOUND["grpc"]


def test_a_bad_input_is_invalid_argument_naming_the_tensor_then_the_client_works_again(
    client: Client, protocol: str
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    wrong = module.InferInput("x", [1, 64], "FP64")
    wrong.set_data_from_numpy(np.zeros((1, 64), np.float64))

    with pytest.raises(InferenceServerException) as caught:
        client.infer("mlp", [wrong])

    assert caught.value.status() == INVALID[protocol]
    assert caught.value.message() == "input 'x': datatype FP64 does not match the model's FP32"

    good = module.InferInput("x", [1, 64], "FP32")
    good.set_data_from_numpy(np.ones((1, 64), np.float32))
    assert client.infer("mlp", [good]).as_numpy("y").shape == (1, 64)


# --- one process -------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [
    ("tritonclient.grpc", "snoozeml.api.grpc.service"),
    ("snoozeml.api.grpc.service", "tritonclient.grpc"),
])
def test_tritonclient_grpc_and_the_snoozeml_grpc_modules_import_into_one_process(
    first: str, second: str
) -> None:
    # Both define messages named inference.*, from different files: in protobuf's one default
    # descriptor pool the second import would fail with "duplicate symbol
    # 'inference.ServerLiveRequest'" (MLServer and KServe have had this bug). A process that
    # embeds SnoozeML and talks to a Triton server, or this test run, needs both.
    done = subprocess.run([sys.executable, "-c", f"import {first}; import {second}"],
                          capture_output=True, text=True, timeout=120, check=False)

    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]
