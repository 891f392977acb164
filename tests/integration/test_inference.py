"""Inference over HTTP against one shared daemon: cold loads, equality with onnxruntime,
metadata, health, status, and every kind of bad request (Done means 1 and 7)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from daemon import Daemon
from oip_http import index_of, output, status_of
from onnx_models import (
    SERVED,
    reference_session,
    write_classifier,
    write_fixed_shape_model,
    write_mlp,
    write_multi_dtype_model,
    write_run_failure_model,
)

CONFIG = """
[server]
max_request_size = "8KiB"

[[models]]
name = "first_contact"
path = "mlp.onnx"

[[models]]
name = "mlp"
path = "mlp.onnx"

[[models]]
name = "never_asked"
path = "mlp.onnx"

[[models]]
name = "classifier"
path = "classifier.onnx"

[[models]]
name = "multi"
path = "multi.onnx"

[[models]]
name = "fixed"
path = "fixed.onnx"

[[models]]
name = "breaks"
path = "breaks.onnx"

[[models]]
name = "preloaded"
path = "mlp.onnx"
preload = true

[[models]]
name = "wants_cuda"
path = "mlp.onnx"
device = "cuda"
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inference")
    write_mlp(folder / "mlp.onnx")
    write_classifier(folder / "classifier.onnx")
    write_multi_dtype_model(folder / "multi.onnx")
    write_fixed_shape_model(folder / "fixed.onnx")
    write_run_failure_model(folder / "breaks.onnx")
    return folder


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: Path) -> Daemon:
    return module_serve(CONFIG, directory=models)  # type: ignore[no-any-return]


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=60) as http:
        yield http


def mlp_rows(rows: int = 1, seed: int = 0) -> np.ndarray:
    # Three decimals keep a few rows' JSON well under the 8 KiB body limit of this daemon.
    rng = np.random.default_rng(seed)
    return np.round(rng.standard_normal((rows, 64)), 3).astype(np.float32)


def mlp_body(x: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.tolist()}], **extra}


def good_request(client: httpx.Client) -> None:
    response = client.post("/v2/models/mlp/infer", json=mlp_body(mlp_rows()))
    assert response.status_code == 200, response.text
    assert output(response.json(), "y").shape == (1, 64)


# --- Done means 1: the first request of a cold model ---------------------------------------


def test_cold_model_loads_on_its_first_request_and_answers_like_onnxruntime(
    daemon: Daemon, client: httpx.Client, models: Path
) -> None:
    before = index_of(client)["first_contact"]
    assert before["state"] == "UNLOADED"
    assert "model_loaded model=first_contact " not in daemon.log()

    x = mlp_rows(3, seed=1)
    mark = daemon.mark()
    response = client.post("/v2/models/first_contact/infer", json=mlp_body(x))

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_name"] == "first_contact"
    assert body["model_version"] == "1"
    (out,) = body["outputs"]
    assert out["name"] == "y"
    assert out["datatype"] == "FP32"
    assert out["shape"] == [3, 64]
    (expected,) = reference_session(models / "mlp.onnx").run(None, {"x": x})
    np.testing.assert_allclose(output(body, "y"), expected, **SERVED)
    loaded = daemon.wait_for_log(r"model_loaded model=first_contact ", start=mark)
    assert re.search(r" ms=[\d.]+ bytes=\d+", loaded), loaded
    assert index_of(client)["first_contact"] == {
        "name": "first_contact", "version": "1", "state": "READY", "reason": "",
    }


def test_loaded_model_answers_later_requests_without_loading_again(
    daemon: Daemon, client: httpx.Client, models: Path
) -> None:
    good_request(client)
    mark = daemon.mark()
    session = reference_session(models / "mlp.onnx")
    for seed in range(5):
        x = mlp_rows(2, seed=seed)
        response = client.post("/v2/models/mlp/infer", json=mlp_body(x))
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(output(response.json(), "y"),
                                   session.run(None, {"x": x})[0], **SERVED)
    assert status_of(client, "mlp")["loads"] == 1
    assert "model_loading model=mlp " not in "\n".join(daemon.lines[mark:])


def test_versioned_paths_reach_the_same_model(client: httpx.Client) -> None:
    response = client.post("/v2/models/mlp/versions/1/infer", json=mlp_body(mlp_rows()))
    assert response.status_code == 200, response.text
    assert client.get("/v2/models/mlp/versions/1").json()["name"] == "mlp"
    missing = client.post("/v2/models/mlp/versions/7/infer", json=mlp_body(mlp_rows()))
    assert missing.status_code == 404
    assert "version" in missing.json()["error"]


# --- the protocol around inference -----------------------------------------------------------


def test_request_id_is_echoed_and_absent_when_not_sent(client: httpx.Client) -> None:
    with_id = client.post("/v2/models/mlp/infer", json=mlp_body(mlp_rows(), id="req-17"))
    assert with_id.json()["id"] == "req-17"
    without = client.post("/v2/models/mlp/infer", json=mlp_body(mlp_rows()))
    assert "id" not in without.json()


def test_only_the_requested_outputs_are_returned(client: httpx.Client, models: Path) -> None:
    features = np.round(np.random.default_rng(3).standard_normal((2, 8)), 3).astype(np.float32)
    inputs = [{"name": "features", "shape": [2, 8], "datatype": "FP32",
               "data": features.tolist()}]
    logits, probabilities = reference_session(models / "classifier.onnx").run(
        ["logits", "probabilities"], {"features": features}
    )

    both = client.post("/v2/models/classifier/infer", json={"inputs": inputs}).json()
    assert [o["name"] for o in both["outputs"]] == ["logits", "probabilities"]

    only = client.post("/v2/models/classifier/infer", json={
        "inputs": inputs, "outputs": [{"name": "probabilities"}],
    })
    assert only.status_code == 200, only.text
    assert [o["name"] for o in only.json()["outputs"]] == ["probabilities"]
    np.testing.assert_allclose(output(only.json(), "probabilities"), probabilities, **SERVED)
    np.testing.assert_allclose(output(both, "logits"), logits, **SERVED)


def test_every_datatype_of_a_model_round_trips_through_json_like_onnxruntime(
    client: httpx.Client, models: Path
) -> None:
    feed = {
        "f32": np.array([[0.5, -1.25, 3.0, 1e-3], [2.5, 0.0, -7.75, 100.0]], np.float32),
        "i64": np.array([[-(2**40), 0, 2**62]], np.int64),
        "flag": np.array([[True, False], [False, False], [True, True]]),
        "half": np.array([[0.5, -1.5]], np.float16),
        "text": np.array(["héllo", "", "snooze ml"], dtype=object),
    }
    datatypes = {"f32": "FP32", "i64": "INT64", "flag": "BOOL", "half": "FP16", "text": "BYTES"}
    body = {"inputs": [
        {"name": name, "shape": list(array.shape), "datatype": datatypes[name],
         "data": array.tolist()}
        for name, array in feed.items()
    ]}

    response = client.post("/v2/models/multi/infer", json=body)

    assert response.status_code == 200, response.text
    got_body = response.json()
    got = {o["name"]: o for o in got_body["outputs"]}
    names = [f"{name}_out" for name in feed]
    results = reference_session(models / "multi.onnx").run(names, feed)
    expected = dict(zip(names, results, strict=True))
    for name, datatype in zip(names, datatypes.values(), strict=True):
        assert got[name]["datatype"] == datatype
        assert got[name]["shape"] == list(expected[name].shape)
    np.testing.assert_allclose(output(got_body, "f32_out"),
                               expected["f32_out"], **SERVED)
    np.testing.assert_array_equal(output(got_body, "i64_out"), expected["i64_out"])
    assert got["i64_out"]["data"] == [-(2**40) + 1, 1, 2**62 + 1]  # exact, not via float
    np.testing.assert_array_equal(output(got_body, "flag_out"), expected["flag_out"])
    np.testing.assert_array_equal(output(got_body, "half_out").astype(np.float16),
                                  expected["half_out"])
    assert got["text_out"]["data"] == ["héllo", "", "snooze ml"]
    assert list(expected["text_out"]) == got["text_out"]["data"]


def test_model_metadata_comes_from_the_session_with_minus_one_for_dynamic_dims(
    client: httpx.Client,
) -> None:
    response = client.get("/v2/models/classifier")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "name": "classifier",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 8]}],
        "outputs": [
            {"name": "logits", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
        ],
    }
    fixed = client.get("/v2/models/fixed").json()
    assert fixed["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [2, 3]}]
    multi = {t["name"]: t for t in client.get("/v2/models/multi").json()["inputs"]}
    assert multi["text"] == {"name": "text", "datatype": "BYTES", "shape": [-1]}
    assert multi["half"] == {"name": "half", "datatype": "FP16", "shape": [-1, 2]}
    assert multi["flag"]["datatype"] == "BOOL"
    assert multi["i64"]["datatype"] == "INT64"


def test_a_cold_model_is_ready_without_being_loaded(
    daemon: Daemon, client: httpx.Client
) -> None:
    response = client.get("/v2/models/never_asked/ready")
    assert response.status_code == 200
    assert response.json() == {"name": "never_asked", "ready": True}
    assert client.get("/v2/models/never_asked/versions/1/ready").status_code == 200
    assert index_of(client)["never_asked"]["state"] == "UNLOADED"
    assert "model_loading model=never_asked " not in daemon.log()


def test_only_a_model_marked_preload_is_loaded_at_start(
    daemon: Daemon, client: httpx.Client
) -> None:
    daemon.wait_for_log(r"model_loaded model=preloaded ")
    assert index_of(client)["preloaded"]["state"] == "READY"
    assert status_of(client, "preloaded")["requests"] == 0
    started = daemon.log().split("server_started", 1)[1]
    assert "model_loading model=never_asked " not in started
    assert index_of(client)["never_asked"]["state"] == "UNLOADED"


def test_a_device_whose_provider_is_missing_falls_back_to_cpu_with_a_warning(
    daemon: Daemon, client: httpx.Client, models: Path
) -> None:
    x = mlp_rows(1, seed=9)
    mark = daemon.mark()
    response = client.post("/v2/models/wants_cuda/infer", json=mlp_body(x))
    assert response.status_code == 200, response.text
    (expected,) = reference_session(models / "mlp.onnx").run(None, {"x": x})
    np.testing.assert_allclose(output(response.json(), "y"), expected, **SERVED)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        warning = daemon.wait_for_log(r"provider_unavailable ", start=mark)
        assert "CUDAExecutionProvider" in warning
        assert "fallback=CPUExecutionProvider" in warning


def test_health_endpoints_and_their_v2_aliases_answer(client: httpx.Client) -> None:
    for path in ("/health/live", "/v2/health/live"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.json() == {"live": True}
    for path in ("/health/ready", "/v2/health/ready"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.json() == {"ready": True}


def test_server_metadata_names_the_server_and_its_extensions(client: httpx.Client) -> None:
    body = client.get("/v2").json()
    assert body["name"] == "snoozeml"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", body["version"])
    assert "model_repository" in body["extensions"]


def test_admin_status_reports_devices_and_every_model(client: httpx.Client) -> None:
    good_request(client)
    response = client.get("/admin/status")
    assert response.status_code == 200
    status = response.json()
    assert status["server"]["draining"] is False
    assert status["server"]["uptime_s"] >= 0
    (cpu,) = [d for d in status["devices"] if d["name"] == "cpu"]
    assert 0 < cpu["budget_bytes"] <= cpu["total_bytes"]
    assert cpu["used_bytes"] > 0
    models = {m["name"]: m for m in status["models"]}
    assert set(models) == {"first_contact", "mlp", "never_asked", "classifier", "multi",
                           "fixed", "breaks", "preloaded", "wants_cuda"}
    fields = {"name", "format", "device", "state", "reason", "replicas", "in_flight", "queued",
              "last_used", "expires_at", "idle_timeout_s", "measured_bytes", "last_load_ms",
              "loads", "load_failures", "requests", "errors"}
    for entry in models.values():
        assert fields <= entry.keys()
    mlp = models["mlp"]
    assert mlp["state"] == "READY"
    assert mlp["format"] == "onnx"
    assert mlp["replicas"] == 1
    assert mlp["in_flight"] == 0
    assert mlp["requests"] >= 1
    assert mlp["loads"] == 1
    assert mlp["measured_bytes"] is not None
    assert mlp["last_load_ms"] > 0
    assert mlp["idle_timeout_s"] == 300.0
    assert mlp["last_used"].endswith("Z")
    assert mlp["expires_at"].endswith("Z")
    cold = models["never_asked"]
    assert cold["state"] == "UNLOADED"
    assert cold["replicas"] == 0
    assert cold["loads"] == 0
    assert cold["expires_at"] is None
    assert cold["last_used"] is None


# --- Done means 7: every malformed body gets its 400, and the next request is served ------


def mlp_input(**changes: Any) -> dict[str, Any]:
    return {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64, **changes}


MULTI_GOOD = [
    {"name": "f32", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
    {"name": "i64", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]},
    {"name": "flag", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
    {"name": "half", "shape": [1, 2], "datatype": "FP16", "data": [0.5, 1.5]},
    {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]},
]

BAD_BODIES = [
    pytest.param("mlp", {"inputs": [mlp_input(name="z")]}, ["unknown input 'z'", "'x'"],
                 id="unknown-input"),
    pytest.param("multi", {"inputs": MULTI_GOOD[:1] + MULTI_GOOD[2:]}, ["missing input 'i64'"],
                 id="missing-input"),
    pytest.param("mlp", {"inputs": [mlp_input(datatype="FP64")]},
                 ["input 'x'", "datatype FP64", "FP32"], id="wrong-datatype"),
    pytest.param("mlp", {"inputs": [mlp_input(datatype="FLOAT")]},
                 ["input 'x'", "unknown datatype 'FLOAT'"], id="unknown-datatype"),
    pytest.param("mlp", {"inputs": [mlp_input(data=[0.5] * 63)]},
                 ["input 'x'", "needs 64 elements, data has 63"], id="element-count"),
    pytest.param("mlp", {"inputs": [mlp_input(shape=[2, 32])]},
                 ["input 'x'", "shape [2, 32]", "[-1, 64]"], id="fixed-trailing-dim"),
    pytest.param("fixed", {"inputs": [{"name": "x", "shape": [6], "datatype": "FP32",
                                       "data": [1, 2, 3, 4, 5, 6]}]},
                 ["input 'x'", "shape [6]", "[2, 3]"], id="wrong-rank"),
    pytest.param("fixed", {"inputs": [{"name": "x", "shape": [3, 2], "datatype": "FP32",
                                       "data": [1, 2, 3, 4, 5, 6]}]},
                 ["input 'x'", "shape [3, 2]", "[2, 3]"], id="wrong-fixed-dim"),
    pytest.param("mlp", {"inputs": [mlp_input(data=["a"] * 64)]},
                 ["input 'x'", "must be numbers"], id="strings-for-fp32"),
    pytest.param("multi", {"inputs": [MULTI_GOOD[0], {**MULTI_GOOD[1], "data": [1.5, 2, 3]},
                                      *MULTI_GOOD[2:]]},
                 ["input 'i64'", "must be integers"], id="floats-for-int64"),
    pytest.param("multi", {"inputs": [*MULTI_GOOD[:4], {**MULTI_GOOD[4], "data": [7]}]},
                 ["input 'text'", "must be strings"], id="numbers-for-bytes"),
    pytest.param("mlp", {"inputs": [mlp_input(shape=[2, 2], data=[[1, 2], [3]])]},
                 ["input 'x'", "equal length"], id="ragged"),
    pytest.param("mlp", {"inputs": [mlp_input(shape=[1, -64])]}, ["input 'x'", "'shape'"],
                 id="negative-shape"),
    pytest.param("mlp", {"inputs": [mlp_input()], "outputs": [{"name": "nope"}]},
                 ["unknown output 'nope'", "'y'"], id="unknown-output"),
    pytest.param("mlp", {"inputs": []}, ["'inputs'"], id="no-inputs"),
    pytest.param("mlp", [1, 2, 3], ["JSON object"], id="not-an-object"),
]


@pytest.mark.parametrize(("model", "body", "fragments"), BAD_BODIES)
def test_malformed_body_gets_a_400_naming_the_problem_then_a_good_request_works(
    client: httpx.Client, model: str, body: Any, fragments: list[str]
) -> None:
    response = client.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    for fragment in fragments:
        assert fragment in error
    good_request(client)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"\xff\xfe"], ids=["broken", "empty", "binary"])
def test_a_body_that_is_not_json_gets_a_400(client: httpx.Client, raw: bytes) -> None:
    response = client.post("/v2/models/mlp/infer", content=raw,
                           headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert "not valid JSON" in response.json()["error"]
    good_request(client)


def test_a_body_over_max_request_size_gets_a_413(client: httpx.Client) -> None:
    big = mlp_body(np.full((16, 64), 0.123456, np.float32))  # well over 8 KiB of JSON
    response = client.post("/v2/models/mlp/infer", json=big)
    assert response.status_code == 413, response.text
    assert "8192" in response.json()["error"]
    good_request(client)


def test_a_chunked_body_over_max_request_size_gets_a_413(client: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(9):
            yield b" " * 1024  # no Content-Length: the daemon counts while it reads

    response = client.post("/v2/models/mlp/infer", content=chunks(),
                           headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    assert "error" in response.json()
    good_request(client)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/models/ghost/infer"),
        ("GET", "/v2/models/ghost"),
        ("GET", "/v2/models/ghost/ready"),
        ("POST", "/v2/repository/models/ghost/load"),
        ("POST", "/v2/repository/models/ghost/unload"),
    ],
)
def test_an_unknown_model_gets_a_404_with_an_error(
    client: httpx.Client, method: str, path: str
) -> None:
    response = client.request(method, path, json=mlp_body(mlp_rows()))
    assert response.status_code == 404, response.text
    assert "ghost" in response.json()["error"]
    good_request(client)


def test_an_unknown_path_gets_a_json_404(client: httpx.Client) -> None:
    response = client.get("/v3/nothing")
    assert response.status_code == 404
    assert "error" in response.json()


def test_a_failure_inside_onnxruntime_is_a_500_for_that_request_only(
    daemon: Daemon, client: httpx.Client, models: Path
) -> None:
    def body(rows: int) -> dict[str, Any]:
        return {"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32",
                            "data": [[float(i)] * 4 for i in range(rows)]}]}

    mark = daemon.mark()
    failed = client.post("/v2/models/breaks/infer", json=body(1))

    assert failed.status_code == 500, failed.text
    assert "breaks" in failed.json()["error"]
    assert "reshape" in failed.json()["error"].lower()
    daemon.wait_for_log(r"request_failed .*model=breaks", start=mark)
    # The same model keeps serving inputs it can run, and so does everything else.
    fine = client.post("/v2/models/breaks/infer", json=body(3))
    assert fine.status_code == 200, fine.text
    x = np.array(body(3)["inputs"][0]["data"], np.float32)
    np.testing.assert_array_equal(output(fine.json(), "y"),
                                  reference_session(models / "breaks.onnx").run(None, {"x": x})[0])
    assert status_of(client, "breaks")["state"] == "READY"
    good_request(client)
