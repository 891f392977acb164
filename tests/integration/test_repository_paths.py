"""The repository extension adds a model by path at run time (HTTP and gRPC), with the same
lifecycle as a configured one, and its unload forgets it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from daemon import Daemon
from oip_http import index_of, output, status_of
from onnx_models import reference_session, write_mlp

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

X = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo-models")
    write_mlp(root / "one.onnx", seed=11)
    (root / "folder").mkdir()
    write_mlp(root / "folder" / "model.onnx", seed=12)
    return root


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: Path) -> Daemon:
    started: Daemon = module_serve(f"""
[server]
idle_timeout = "1h"
[[models]]
name = "configured"
path = "{models / 'one.onnx'}"
""")
    return started


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        yield client


def infer(http: httpx.Client, name: str) -> httpx.Response:
    return http.post(f"/v2/models/{name}/infer", json={"inputs": [
        {"name": "x", "shape": list(X.shape), "datatype": "FP32",
         "data": X.reshape(-1).tolist()}]})


def test_an_http_load_with_a_path_adds_serves_and_an_unload_forgets(
    http: httpx.Client, daemon: Daemon, models: Path,
) -> None:
    mark = daemon.mark()
    response = http.post("/v2/repository/models/added/load",
                         json={"parameters": {"path": str(models / "folder")}})
    assert response.status_code == 200, response.text
    daemon.wait_for_log(r"model_added model=added origin=repository", start=mark)
    entry = status_of(http, "added")
    assert (entry["origin"], entry["state"], entry["pinned"]) == ("repository", "READY", False)
    assert entry["idle_timeout_s"] == 3600  # [server]'s, like a configured model's

    answer = infer(http, "added")
    assert answer.status_code == 200, answer.text
    expected = reference_session(models / "folder" / "model.onnx").run(None, {"x": X})[0]
    np.testing.assert_allclose(output(answer.json(), "y"), expected, rtol=1e-5, atol=1e-6)
    assert http.get("/v2/models/added").json()["inputs"][0]["name"] == "x"
    # The same path again: the same model, loaded.
    again = http.post("/v2/repository/models/added/load",
                      json={"parameters": {"path": str(models / "folder")}})
    assert again.status_code == 200

    assert http.post("/v2/repository/models/added/unload").status_code == 200
    assert "added" not in index_of(http)
    assert infer(http, "added").status_code == 404
    assert http.post("/v2/repository/models/added/unload").status_code == 404
    # A configured model's unload keeps it in the repository, unloaded.
    assert http.post("/v2/repository/models/configured/unload").status_code == 200
    assert index_of(http)["configured"]["state"] == "UNLOADED"


def test_a_grpc_load_with_a_path_parameter_adds_the_model(
    daemon: Daemon, http: httpx.Client, models: Path,
) -> None:
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.RepositoryModelLoadRequest(model_name="by-grpc")
        request.parameters["path"].string_param = str(models / "one.onnx")
        request.parameters["model_type"].string_param = "onnx"
        stub.RepositoryModelLoad(request)
        assert index_of(http)["by-grpc"]["state"] == "READY"
        assert infer(http, "by-grpc").status_code == 200
        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="by-grpc"))
        assert "by-grpc" not in index_of(http)

        bad = pb.RepositoryModelLoadRequest(model_name="by-grpc")
        bad.parameters["path"].int64_param = 3
        with pytest.raises(grpc.RpcError) as error:
            stub.RepositoryModelLoad(bad)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'path' must be a non-empty string" in (error.value.details() or "")


@pytest.mark.parametrize(("name", "body", "expected"), [
    ("new", {"parameters": {"path": "/no/such/model.onnx"}}, "no such file or folder"),
    ("new", {"parameters": {"path": "relative/model.onnx"}}, "must be absolute"),
    ("new", {"parameters": {"config": "{}"}}, "parameter 'config' is not supported"),
    ("new", {"parameters": {"file:1/model.onnx": "AAAA"}}, "is not supported"),
    ("new", {"parameters": {"colour": "red"}}, "unknown parameter 'colour'"),
    ("new", {"parameters": {"model_type": "onnx"}}, "'model_type' goes with 'path'"),
    ("new", {"parameters": "path"}, "'parameters' must be an object"),
    ("new", {"parameters": None}, "'parameters' must be an object"),
    ("new", {"parameters": {"path": None}}, "'path' must be a non-empty string"),
    ("new", {"parameters": {"path": " "}}, "'path' must be a non-empty string"),
    ("new", [], "request body must be a JSON object"),
    ("configured", {"parameters": {"path": "{folder}"}}, "is configured in models.toml"),
])
def test_bad_loads_by_path_are_400s_and_add_nothing(
    http: httpx.Client, models: Path, name: str, body: Any, expected: str,
) -> None:
    if isinstance(body, dict) and isinstance(body.get("parameters"), dict):
        body = {"parameters": {
            k: v.replace("{folder}", str(models / "folder")) if isinstance(v, str) else v
            for k, v in body["parameters"].items()}}
    response = http.post(f"/v2/repository/models/{name}/load", json=body)
    assert response.status_code == 400, response.text
    assert expected in response.json()["error"]
    assert "new" not in index_of(http)


def test_a_name_added_from_one_path_refuses_another_until_unloaded(
    http: httpx.Client, models: Path,
) -> None:
    first = {"parameters": {"path": str(models / "one.onnx")}}
    other = {"parameters": {"path": str(models / "folder")}}
    assert http.post("/v2/repository/models/twice/load", json=first).status_code == 200
    refused = http.post("/v2/repository/models/twice/load", json=other)
    assert refused.status_code == 400
    assert "unload it before adding another model under that name" in refused.json()["error"]
    assert http.post("/v2/repository/models/twice/unload").status_code == 200
    assert http.post("/v2/repository/models/twice/load", json=other).status_code == 200
    assert http.post("/v2/repository/models/twice/unload").status_code == 200


def test_added_models_have_metrics_that_go_with_them(http: httpx.Client, models: Path) -> None:
    body = {"parameters": {"path": str(models / "one.onnx")}}
    assert http.post("/v2/repository/models/counted/load", json=body).status_code == 200
    assert infer(http, "counted").status_code == 200
    text = http.get("/metrics").text
    assert 'snooze_model_loads_total{model="counted",result="ok"} 1.0' in text
    assert 'snooze_requests_total{code="200",model="counted",operation="infer",' \
        'protocol="http"} 1.0' in text
    assert http.post("/v2/repository/models/counted/unload").status_code == 200
    assert 'model="counted"' not in http.get("/metrics").text
