"""Tabular models as their users export them (issue 33), against a real daemon: skl2onnx's and
onnxmltools' default exports, ZipMap outputs included, answer what the fitted model's `predict`
and `predict_proba` do; a pipeline with one input per column takes numbers and strings over
JSON, the binary extension and gRPC, and rows of concurrent requests share a batch; the
classification extension names the classes; an output with no tensor form fails the model
with a reason that says how to export it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from daemon import Daemon
from oip_http import index_of
from tabular_models import (
    Tabular,
    boosted_models,
    features,
    frame,
    multi_output,
    sklearn_models,
)

from snoozeml.cli import exit_codes
from snoozeml.cli.main import main
from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

# float32 trees and sums against scikit-learn's float64: within 1e-5.
CLOSE = {"rtol": 0, "atol": 1e-5}
EXACT_ROWS = 12

CONFIG = """
[server]
cache_dir = "cache"

[[models]]
name = "logistic"
path = "logistic.onnx"
[[models]]
name = "forest"
path = "forest.onnx"
[[models]]
name = "boosting"
path = "boosting.onnx"
[[models]]
name = "svc"
path = "svc.onnx"
[[models]]
name = "regressor"
path = "regressor.onnx"
[[models]]
name = "columns"
path = "columns.onnx"
[[models]]
name = "xgboost"
path = "xgboost.onnx"
[[models]]
name = "lightgbm"
path = "lightgbm.onnx"
[[models]]
name = "catboost"
path = "catboost.onnx"
[[models]]
name = "multi_output"
path = "multi_output.onnx"

# A batch leaves only when it holds exactly 12 rows (or after 10 s, which fails the test).
[[models]]
name = "columns_exact"
path = "columns.onnx"
preload = true
[models.batching]
max_batch_size = 12
max_delay = "10s"
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Tabular]]:
    folder = tmp_path_factory.mktemp("tabular")
    models = {**sklearn_models(folder), **boosted_models(folder)}
    multi_output(folder)
    return folder, models


@pytest.fixture(scope="module")
def daemon(module_serve: Any, made: tuple[Path, dict[str, Tabular]]) -> Daemon:
    return module_serve(CONFIG, directory=made[0])  # type: ignore[no-any-return]


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=120) as http:
        yield http


def json_rows(x: np.ndarray) -> dict[str, Any]:
    inputs_name = "X"
    return {"inputs": [{"name": inputs_name, "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}


def outputs_of(body: dict[str, Any]) -> dict[str, np.ndarray]:
    return {out["name"]: np.asarray(out["data"]).reshape(out["shape"]) for out in body["outputs"]}


def column_inputs(table: Any) -> list[dict[str, Any]]:
    rows = len(table)
    return [
        {"name": "age", "shape": [rows, 1], "datatype": "FP32",
         "data": table["age"].tolist()},
        {"name": "visits", "shape": [rows, 1], "datatype": "INT64",
         "data": table["visits"].tolist()},
        {"name": "city", "shape": [rows, 1], "datatype": "BYTES",
         "data": table["city"].tolist()},
    ]


def assert_answers(tabular: Tabular, got: dict[str, np.ndarray], x: Any) -> None:
    """The label output equals `predict`, the probabilities `predict_proba` (classifiers)."""
    predicted = np.ravel(tabular.model.predict(x))  # CatBoost's is [N, 1]
    if tabular.probability_output is None:  # a regressor: [N, 1] FP32
        np.testing.assert_allclose(got[tabular.label_output].ravel(), predicted, rtol=1e-5)
        return
    labels = [v.decode() if isinstance(v, bytes) else str(v)
              for v in got[tabular.label_output].ravel()]
    assert labels == [str(v) for v in predicted]
    np.testing.assert_allclose(got[tabular.probability_output], tabular.model.predict_proba(x),
                               **CLOSE)


# --- every converter's default export ---------------------------------------------------------


@pytest.mark.parametrize("name", ["logistic", "forest", "boosting", "svc", "regressor",
                                  "xgboost", "lightgbm", "catboost"])
def test_a_default_export_answers_as_the_fitted_model(
    client: httpx.Client, made: tuple[Path, dict[str, Tabular]], name: str
) -> None:
    tabular = made[1][name]
    x, _ = features(rows=60, seed=7)
    metadata = client.get(f"/v2/models/{name}").json()
    (given,) = metadata["inputs"]

    response = client.post(f"/v2/models/{name}/infer", json={"inputs": [
        {"name": given["name"], "shape": list(x.shape), "datatype": "FP32",
         "data": x.ravel().tolist()}]})

    assert response.status_code == 200, response.text
    assert_answers(tabular, outputs_of(response.json()), x)
    kinds = {out["name"]: out for out in metadata["outputs"]}
    if tabular.probability_output is not None:
        # ZipMap's sequence of maps is served as its FP32 [N, classes] tensor.
        assert kinds[tabular.probability_output]["datatype"] == "FP32"
        assert kinds[tabular.probability_output]["shape"] == [-1, len(tabular.classes)]
        strings = not tabular.classes[0].lstrip("-").isdigit()
        assert kinds[tabular.label_output]["datatype"] == ("BYTES" if strings else "INT64")


def test_the_classification_extension_names_the_classes_of_a_zipmap_export(
    daemon: Daemon, made: tuple[Path, dict[str, Tabular]]
) -> None:
    forest = made[1]["forest"]
    x, _ = features(rows=5, seed=3)
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.http_port}")
    given = httpclient.InferInput("X", list(x.shape), "FP32")
    given.set_data_from_numpy(x)

    result = triton.infer("forest", [given], outputs=[
        httpclient.InferRequestedOutput("output_probability", class_count=2)])
    triton.close()

    probabilities = forest.model.predict_proba(x)
    got = result.as_numpy("output_probability")
    assert got.shape == (5, 2)
    for row, answer in zip(probabilities, got, strict=True):
        best = int(np.argmax(row))
        score, index, label = answer[0].decode().split(":")
        assert (int(index), label) == (best, forest.classes[best])
        assert abs(float(score) - row[best]) <= 1e-5


# --- one input per column ---------------------------------------------------------------------


def test_a_column_pipeline_answers_over_json(
    client: httpx.Client, made: tuple[Path, dict[str, Tabular]]
) -> None:
    columns = made[1]["columns"]
    table, _ = frame(rows=40, seed=5)

    response = client.post("/v2/models/columns/infer", json={"inputs": column_inputs(table)})

    assert response.status_code == 200, response.text
    assert_answers(columns, outputs_of(response.json()), table)
    metadata = client.get("/v2/models/columns").json()
    assert [(i["name"], i["datatype"], i["shape"]) for i in metadata["inputs"]] == [
        ("age", "FP32", [-1, 1]), ("visits", "INT64", [-1, 1]), ("city", "BYTES", [-1, 1])]


def triton_columns(module: Any, table: Any, binary: bool = True) -> list[Any]:
    """tritonclient inputs (http or grpc) of the frame's columns, [N, 1] each."""
    rows = len(table)
    made = []
    for name, datatype, values in (
        ("age", "FP32", table["age"].to_numpy(np.float32)),
        ("visits", "INT64", table["visits"].to_numpy(np.int64)),
        ("city", "BYTES", table["city"].to_numpy(object)),
    ):
        given = module.InferInput(name, [rows, 1], datatype)
        if module is httpclient:
            given.set_data_from_numpy(values.reshape(rows, 1), binary_data=binary)
        else:
            given.set_data_from_numpy(values.reshape(rows, 1))
        made.append(given)
    return made


def test_a_column_pipeline_answers_over_the_binary_extension_and_grpc(
    daemon: Daemon, made: tuple[Path, dict[str, Tabular]]
) -> None:
    columns = made[1]["columns"]
    table, _ = frame(rows=25, seed=6)
    wanted = ["output_label", "output_probability"]
    http = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.http_port}")
    grpc_client = grpcclient.InferenceServerClient(daemon.grpc_address)
    try:
        over_http = http.infer("columns", triton_columns(httpclient, table), outputs=[
            httpclient.InferRequestedOutput(name, binary_data=True) for name in wanted])
        over_grpc = grpc_client.infer("columns", triton_columns(grpcclient, table))
    finally:
        http.close()
        grpc_client.close()

    for result in (over_http, over_grpc):
        assert_answers(columns, {name: result.as_numpy(name) for name in wanted}, table)


def test_rows_of_concurrent_column_requests_share_one_batch(
    daemon: Daemon, made: tuple[Path, dict[str, Tabular]]
) -> None:
    # 6 requests of one row over JSON and 6 over gRPC make the 12 rows the model waits for:
    # one batch, strings stacked with numbers, each client its own row back.
    columns = made[1]["columns"]
    table, _ = frame(rows=EXACT_ROWS, seed=9)
    rows = [table.iloc[i:i + 1] for i in range(EXACT_ROWS)]

    answers, entry = asyncio.run(_send_rows(daemon, rows))

    for row, got in zip(rows, answers, strict=True):
        assert_answers(columns, got, row)
    batching = entry["batching"]
    assert (batching["batches"], batching["requests"], batching["rows"]) == (1, 12, 12)
    assert batching["largest_batch"] == 12
    assert entry["errors"] == 0


async def _send_rows(daemon: Daemon, rows: list[Any]) -> tuple[list[dict[str, np.ndarray]],
                                                                 dict[str, Any]]:
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=daemon.url, timeout=60, limits=limits) as http:
        import grpc

        async with grpc.aio.insecure_channel(daemon.grpc_address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)

            async def over_json(row: Any) -> dict[str, np.ndarray]:
                response = await http.post("/v2/models/columns_exact/infer",
                                           json={"inputs": column_inputs(row)})
                assert response.status_code == 200, response.text
                return outputs_of(response.json())

            async def over_grpc(row: Any) -> dict[str, np.ndarray]:
                request = pb.ModelInferRequest(model_name="columns_exact")
                for given in column_inputs(row):
                    tensor = request.inputs.add(name=given["name"], datatype=given["datatype"],
                                                shape=given["shape"])
                    if given["datatype"] == "BYTES":
                        tensor.contents.bytes_contents.extend(v.encode() for v in given["data"])
                    elif given["datatype"] == "INT64":
                        tensor.contents.int64_contents.extend(given["data"])
                    else:
                        tensor.contents.fp32_contents.extend(given["data"])
                response = await stub.ModelInfer(request, timeout=60)
                got = {}
                for out, raw in zip(response.outputs, response.raw_output_contents,
                                    strict=True):
                    got[out.name] = _decode(raw, out.datatype, list(out.shape))
                return got

            answers = await asyncio.gather(*(
                over_json(row) if i % 2 else over_grpc(row) for i, row in enumerate(rows)))
        status = (await http.get("/admin/status")).json()
    entry = next(m for m in status["models"] if m["name"] == "columns_exact")
    return list(answers), entry


def _decode(raw: bytes, datatype: str, shape: list[int]) -> np.ndarray:
    if datatype == "BYTES":
        values, at = [], 0
        while at < len(raw):
            size = int.from_bytes(raw[at:at + 4], "little")
            values.append(raw[at + 4:at + 4 + size])
            at += 4 + size
        return np.array(values, dtype=object).reshape(shape)
    return np.frombuffer(raw, {"FP32": "<f4", "INT64": "<i8"}[datatype]).reshape(shape)


# --- what has no tensor form ------------------------------------------------------------------


def test_an_output_with_no_tensor_form_fails_the_model_saying_how_to_export_it(
    client: httpx.Client,
) -> None:
    x, _ = features(rows=1)

    response = client.post("/v2/models/multi_output/infer", json=json_rows(x))

    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert "output 'probabilities' has type seq(tensor(float))" in error
    assert "one model per target" in error
    assert index_of(client)["multi_output"]["state"] == "FAILED"
    # The daemon serves on.
    assert client.post("/v2/models/logistic/infer", json=json_rows(x)).status_code == 200


# --- snooze scan ------------------------------------------------------------------------------


def test_snooze_scan_writes_entries_that_serve_and_batch_the_default_exports(
    module_serve: Any, made: tuple[Path, dict[str, Tabular]],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("scan-tabular")
    for name in ("lightgbm", "columns", "multi_output"):
        (folder / "models").mkdir(exist_ok=True)
        (folder / "models" / f"{name}.onnx").write_bytes((made[0] / f"{name}.onnx").read_bytes())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(["scan", str(folder / "models"), "--write", str(folder / "scanned.toml")])
    assert code == exit_codes.OK, printed.getvalue()
    body = (folder / "scanned.toml").read_text()
    entries = {m["name"]: m for m in tomllib.loads(body)["models"]}
    # Both classifiers batch (LightGBM's label output is declared [1], its rows are [N]);
    # the sequence output is skipped, saying why.
    assert sorted(entries) == ["columns", "lightgbm"]
    assert all(entry["batching"]["max_batch_size"] > 1 for entry in entries.values())
    assert "one model per target" in printed.getvalue()

    daemon = module_serve(body, directory=folder)
    lightgbm, columns = made[1]["lightgbm"], made[1]["columns"]
    x, _ = features(rows=20, seed=11)
    table, _ = frame(rows=20, seed=12)
    with httpx.Client(base_url=daemon.url, timeout=120) as http:
        got = http.post("/v2/models/lightgbm/infer", json={"inputs": [
            {"name": "input", "shape": list(x.shape), "datatype": "FP32",
             "data": x.ravel().tolist()}]})
        assert got.status_code == 200, got.text
        assert_answers(lightgbm, outputs_of(got.json()), x)
        got = http.post("/v2/models/columns/infer", json={"inputs": column_inputs(table)})
        assert got.status_code == 200, got.text
        assert_answers(columns, outputs_of(got.json()), table)
