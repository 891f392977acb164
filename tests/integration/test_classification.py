"""Triton's classification extension against a real daemon: tritonclient's `class_count` over
HTTP (JSON and binary outputs) and gRPC, and raw JSON over httpx, for an ONNX classifier with a
`labels` file, an ONNX-ML classifier that carries its labels, and a Hugging Face text
classifier whose config.json has id2label (served through PyTorch).

Every expected string is computed here from the model's own scores, run in this process
(onnxruntime, torch), and written as Triton writes it: "score:index:label", the score as
printf's %f, the best first.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import transformers
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from classifier_models import ANIMALS, write_labels, write_ml_classifier
from daemon import Daemon
from oip_http import status_of
from onnx_models import reference_session, write_classifier
from torch_models import TINY_BERT, forward, save_bert, token_rows
from tritonclient.utils import InferenceServerException

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

TIERS = ("bronze", "silver", "gold")
SENTIMENTS = {0: "negative", 1: "neutral", 2: "positive"}

# prepack = "on": the daemon's session is built as the reference session is, so that its
# scores, and so their %f strings, are the same bits.
CONFIG = """
[[models]]
name = "tabular"
path = "classifier.onnx"
labels = "tiers.txt"
prepack = "on"

[[models]]
name = "unlabelled"
path = "classifier.onnx"
prepack = "on"

[[models]]
name = "animals"
path = "animals.onnx"
prepack = "on"

[[models]]
name = "sentiment"
path = "sentiment"

[[models]]
name = "mislabelled"
path = "classifier.onnx"
labels = "two.txt"

[[models]]
name = "shared"
path = "classifier.onnx"
labels = "tiers.txt"
[models.batching]
max_batch_size = 3
max_delay = "2s"
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("classification")
    write_classifier(folder / "classifier.onnx")
    write_ml_classifier(folder / "animals.onnx")
    write_labels(folder / "tiers.txt", TIERS)
    write_labels(folder / "two.txt", ["yes", "no"])
    save_bert(folder / "sentiment", transformers.BertForSequenceClassification, seed=3,
              id2label=SENTIMENTS, label2id={v: k for k, v in SENTIMENTS.items()}, **TINY_BERT)
    return folder


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: Path) -> Daemon:
    return module_serve(CONFIG, directory=models)  # type: ignore[no-any-return]


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=120) as http:
        yield http


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.http_port}")
    yield triton
    triton.close()


@pytest.fixture
def grpc_client(daemon: Daemon) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(daemon.grpc_address)
    yield triton
    triton.close()


# --- the reference ----------------------------------------------------------------------------


def expected_classes(scores: np.ndarray, k: int, labels: Sequence[str] = ()) -> list[list[str]]:
    """Each row's k best classes as Triton writes them (equal scores: lower index first)."""
    rows = []
    for row in np.asarray(scores):
        order = sorted(range(len(row)), key=lambda i: (-float(row[i]), i))[:k]
        rows.append([f"{float(row[i]):f}:{i}" + (f":{labels[i]}" if labels else "")
                     for i in order])
    return rows


def assert_close_classes(got: list[list[str]], scores: np.ndarray, k: int,
                         labels: Sequence[str]) -> None:
    """The same classes in the same order, each score written as %f and within float32
    rounding of the reference (a batched or torch run may differ in the last bits)."""
    expected = expected_classes(scores, k, labels)
    assert len(got) == len(expected)
    for got_row, want_row in zip(got, expected, strict=True):
        assert [s.split(":", 1)[1] for s in got_row] == [s.split(":", 1)[1] for s in want_row]
        for text, want in zip(got_row, want_row, strict=True):
            score = text.split(":", 1)[0]
            assert re.fullmatch(r"-?\d+\.\d{6}", score), text
            assert abs(float(score) - float(want.split(":", 1)[0])) <= 2e-6, (text, want)


def texts(array: np.ndarray) -> list[Any]:
    """A BYTES result as nested lists of str (tritonclient gives bytes, or str from JSON)."""
    decode = np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else str(v),
                          otypes=[object])
    return decode(array).tolist()  # type: ignore[no-any-return]


def features(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)


def tabular_logits(models: Path, x: np.ndarray) -> np.ndarray:
    return reference_session(models / "classifier.onnx").run(["logits"], {"features": x})[0]


# --- tritonclient: an ONNX classifier with a labels file --------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_http_gets_the_top_k_labelled_classes_of_each_row(
    http: httpclient.InferenceServerClient, models: Path, binary: bool,
) -> None:
    x = features(4, seed=1)
    given = httpclient.InferInput("features", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=binary)
    wanted = [httpclient.InferRequestedOutput("logits", binary_data=binary, class_count=2),
              httpclient.InferRequestedOutput("probabilities", binary_data=binary)]

    result = http.infer("tabular", [given], outputs=wanted)

    logits = tabular_logits(models, x)
    assert result.get_output("logits")["datatype"] == "BYTES"
    assert result.get_output("logits")["shape"] == [4, 2]
    assert texts(result.as_numpy("logits")) == expected_classes(logits, 2, TIERS)
    # The other output is untouched: its numbers, as ever.
    probabilities = reference_session(models / "classifier.onnx").run(
        ["probabilities"], {"features": x})[0]
    np.testing.assert_array_equal(result.as_numpy("probabilities"), probabilities)


def test_tritonclient_grpc_gets_the_top_k_labelled_classes_of_each_row(
    grpc_client: grpcclient.InferenceServerClient, models: Path,
) -> None:
    x = features(3, seed=2)
    given = grpcclient.InferInput("features", list(x.shape), "FP32")
    given.set_data_from_numpy(x)

    result = grpc_client.infer("tabular", [given], outputs=[
        grpcclient.InferRequestedOutput("logits", class_count=3)])

    assert result.get_output("logits").datatype == "BYTES"
    assert list(result.get_output("logits").shape) == [3, 3]
    assert texts(result.as_numpy("logits")) == expected_classes(
        tabular_logits(models, x), 3, TIERS)


def test_without_a_label_source_each_class_is_its_score_and_index(
    grpc_client: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient,
    models: Path,
) -> None:
    x = features(2, seed=3)
    expected = expected_classes(tabular_logits(models, x), 2)
    over_grpc = grpcclient.InferInput("features", list(x.shape), "FP32")
    over_grpc.set_data_from_numpy(x)
    over_http = httpclient.InferInput("features", list(x.shape), "FP32")
    over_http.set_data_from_numpy(x)

    by_grpc = grpc_client.infer("unlabelled", [over_grpc], outputs=[
        grpcclient.InferRequestedOutput("logits", class_count=2)])
    by_http = http.infer("unlabelled", [over_http], outputs=[
        httpclient.InferRequestedOutput("logits", class_count=2)])

    assert texts(by_grpc.as_numpy("logits")) == expected
    assert texts(by_http.as_numpy("logits")) == expected


# --- raw JSON -----------------------------------------------------------------------------------


def test_raw_json_gets_strings_and_k_is_capped_at_the_class_count(
    client: httpx.Client, models: Path,
) -> None:
    x = features(2, seed=4)
    body = {"inputs": [{"name": "features", "shape": [2, 8], "datatype": "FP32",
                        "data": x.reshape(-1).tolist()}],
            "outputs": [{"name": "probabilities", "parameters": {"classification": 50}}]}

    response = client.post("/v2/models/tabular/infer", json=body)

    assert response.status_code == 200, response.text
    [entry] = response.json()["outputs"]
    probabilities = reference_session(models / "classifier.onnx").run(
        ["probabilities"], {"features": x})[0]
    assert (entry["name"], entry["datatype"], entry["shape"]) == ("probabilities", "BYTES",
                                                                   [2, 3])
    assert entry["data"] == [text for row in expected_classes(probabilities, 3, TIERS)
                             for text in row]  # flat, row-major


def test_requests_asking_for_different_k_share_a_batch_and_each_gets_its_own_answer(
    daemon: Daemon, client: httpx.Client, models: Path,
) -> None:
    rows = [features(1, seed=10 + i) for i in range(3)]
    asks: list[dict[str, Any]] = [{"classification": 1}, {"classification": 3}, {}]

    async def post_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as session:
            return list(await asyncio.gather(*(
                session.post("/v2/models/shared/infer", json={
                    "inputs": [{"name": "features", "shape": [1, 8], "datatype": "FP32",
                                "data": x.reshape(-1).tolist()}],
                    "outputs": [{"name": "logits", "parameters": ask}]})
                for x, ask in zip(rows, asks, strict=True))))

    responses = asyncio.run(post_all())

    for x, ask, response in zip(rows, asks, responses, strict=True):
        assert response.status_code == 200, response.text
        [entry] = response.json()["outputs"]
        logits = tabular_logits(models, x)
        if ask:
            assert entry["shape"] == [1, ask["classification"]]
            assert_close_classes([entry["data"]], logits, ask["classification"], TIERS)
        else:
            assert entry["datatype"] == "FP32"
            np.testing.assert_allclose(entry["data"], logits.reshape(-1), rtol=1e-5, atol=1e-6)
    assert status_of(client, "shared")["batching"]["largest_batch"] == 3


# --- the model's own labels: ONNX-ML, and a Hugging Face folder's id2label -------------------


def test_an_onnx_ml_classifier_names_its_classes_with_its_own_labels(
    grpc_client: grpcclient.InferenceServerClient, models: Path,
) -> None:
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    given = grpcclient.InferInput("features", [3, 4], "FP32")
    given.set_data_from_numpy(x)

    result = grpc_client.infer("animals", [given], outputs=[
        grpcclient.InferRequestedOutput("probabilities", class_count=1),
        grpcclient.InferRequestedOutput("label")])

    reference = reference_session(models / "animals.onnx")
    label, probabilities = reference.run(["label", "probabilities"], {"features": x})
    got = texts(result.as_numpy("probabilities"))
    assert got == expected_classes(probabilities, 1, ANIMALS)
    # The classifier's own answer agrees with its best class.
    assert [row[0].rsplit(":", 1)[1] for row in got] == list(label)


def test_a_hugging_face_text_classifier_names_its_classes_with_id2label(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient,
    models: Path,
) -> None:
    ids, mask = token_rows([5, 7], width=7, seed=6)
    model = transformers.BertForSequenceClassification.from_pretrained(
        str(models / "sentiment")).eval()
    logits = forward(model, ids, mask).logits.numpy()
    labels = [SENTIMENTS[i] for i in range(3)]
    over_http = [httpclient.InferInput("input_ids", list(ids.shape), "INT64"),
                 httpclient.InferInput("attention_mask", list(mask.shape), "INT64")]
    over_grpc = [grpcclient.InferInput("input_ids", list(ids.shape), "INT64"),
                 grpcclient.InferInput("attention_mask", list(mask.shape), "INT64")]
    for tensors in (over_http, over_grpc):
        tensors[0].set_data_from_numpy(ids)
        tensors[1].set_data_from_numpy(mask)

    by_http = http.infer("sentiment", over_http, outputs=[
        httpclient.InferRequestedOutput("logits", class_count=2)])
    by_grpc = grpc_client.infer("sentiment", over_grpc, outputs=[
        grpcclient.InferRequestedOutput("logits", class_count=3)])

    assert_close_classes(texts(by_http.as_numpy("logits")), logits, 2, labels)
    assert_close_classes(texts(by_grpc.as_numpy("logits")), logits, 3, labels)


# --- what is refused ----------------------------------------------------------------------------


def test_classifying_an_output_that_is_not_numeric_is_a_400_and_invalid_argument(
    client: httpx.Client, daemon: Daemon,
) -> None:
    body = {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32",
                        "data": [0.0] * 4}],
            "outputs": [{"name": "label", "parameters": {"classification": 1}}]}
    response = client.post("/v2/models/animals/infer", json=body)

    request = pb.ModelInferRequest(model_name="animals")
    request.inputs.add(name="features", datatype="FP32", shape=[1, 4]).contents \
        .fp32_contents.extend([0.0] * 4)
    request.outputs.add(name="label").parameters["classification"].int64_param = 1
    with grpc.insecure_channel(daemon.grpc_address) as channel, \
            pytest.raises(grpc.RpcError) as failure:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)

    message = "output 'label' is BYTES: the classification extension ranks numeric outputs only"
    assert (response.status_code, response.json()) == (400, {"error": message})
    assert (failure.value.code(), failure.value.details()) == \
        (grpc.StatusCode.INVALID_ARGUMENT, message)


@pytest.mark.parametrize("k", [0, -1, 1.5, "2", True])
def test_a_class_count_that_is_not_a_positive_integer_is_a_400(
    client: httpx.Client, k: object,
) -> None:
    body = {"inputs": [{"name": "features", "shape": [1, 8], "datatype": "FP32",
                        "data": [0.0] * 8}],
            "outputs": [{"name": "logits", "parameters": {"classification": k}}]}

    response = client.post("/v2/models/tabular/infer", json=body)

    assert (response.status_code, response.json()) == (400, {"error": (
        "output 'logits': parameter 'classification' must be an integer of at least 1 (how "
        f"many classes to return), got {k!r}")})


def test_tritonclient_grpc_hears_invalid_argument_for_a_negative_class_count(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    given = grpcclient.InferInput("features", [1, 8], "FP32")
    given.set_data_from_numpy(np.zeros((1, 8), np.float32))

    with pytest.raises(InferenceServerException) as failure:
        grpc_client.infer("tabular", [given], outputs=[
            grpcclient.InferRequestedOutput("logits", class_count=-2)])

    assert failure.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "must be an integer of at least 1" in failure.value.message()


def test_a_labels_file_that_fits_no_output_fails_the_models_load_saying_why(
    client: httpx.Client, models: Path,
) -> None:
    body = {"inputs": [{"name": "features", "shape": [1, 8], "datatype": "FP32",
                        "data": [0.0] * 8}]}

    response = client.post("/v2/models/mislabelled/infer", json=body)

    assert response.status_code == 503, response.text
    assert response.json()["error"].startswith("model 'mislabelled' failed to load: ")
    assert (f"{models / 'two.txt'} has 2 labels, but no output of model 'mislabelled' has 2 "
            "classes (logits: 3, probabilities: 3); an output of shape [N, C] has C classes"
            ) in response.json()["error"]


def test_the_server_lists_the_classification_extension(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient,
) -> None:
    assert "classification" in http.get_server_metadata()["extensions"]
    assert "classification" in grpc_client.get_server_metadata().extensions
