"""Encoded images against a real daemon: an ONNX model whose entry describes its preprocessing,
and a Hugging Face image classifier with its own preprocessor_config.json (served through
PyTorch). Images go as raw bytes over the binary extension (tritonclient HTTP) and gRPC
(tritonclient gRPC), and as base64 over JSON (httpx). Every answer is held to what this process
computes from the same bytes: the reference preprocessing (tests/support/image_models.py) fed
through the echo model, whose `pixels` output is its input; the Hugging Face model's
AutoImageProcessor and forward pass.
"""

from __future__ import annotations

import base64
import concurrent.futures
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import transformers
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from daemon import Daemon
from image_models import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    decoded,
    encoded,
    picture,
    reference,
    rotated_jpeg,
    write_echo_model,
)
from torch_models import save_vit
from tritonclient.utils import InferenceServerException

CONFIG = """
[[models]]
name = "echo"
path = "echo.onnx"
labels = "scores.txt"
[models.image]
resize = 26
crop = [24, 20]
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]
max_image_pixels = 1000000
[models.batching]
max_batch_size = 8
max_delay = "50ms"

[[models]]
name = "echo-nhwc"
path = "echo-nhwc.onnx"
[models.image]
resize = 30
crop = [18, 22]
channels = "BGR"
interpolation = "bicubic"

[[models]]
name = "vit"
path = "vit"
"""
SCORES = ("red", "green", "blue", "all")
ID2LABEL = {0: "cat", 1: "dog", 2: "fish"}


def images() -> dict[str, bytes]:
    """Odd sizes, every mode a user sends, one sideways with its EXIF orientation."""
    return {
        "png 37x23": encoded(picture(37, 23, seed=1), "PNG"),
        "jpeg 23x41": encoded(picture(23, 41, seed=2), "JPEG", quality=90),
        "gray png 50x31": encoded(picture(50, 31, seed=3, mode="L"), "PNG"),
        "rgba png 29x29": encoded(picture(29, 29, seed=4, mode="RGBA"), "PNG"),
        "gray jpeg 640x480": encoded(picture(640, 480, seed=5, mode="L"), "JPEG"),
        "exif jpeg 45x27": rotated_jpeg(picture(45, 27, seed=6)),
        "webp 33x21": encoded(picture(33, 21, seed=7), "WEBP", lossless=True),
        "gif 19x25": encoded(picture(19, 25, seed=8).convert("P"), "GIF"),
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    write_echo_model(folder / "echo.onnx")
    write_echo_model(folder / "echo-nhwc.onnx", None, None, layout="NHWC")
    (folder / "scores.txt").write_text("\n".join(SCORES) + "\n")
    model = save_vit(folder / "vit")
    model.config.id2label = ID2LABEL
    model.config.label2id = {v: k for k, v in ID2LABEL.items()}
    model.config.save_pretrained(str(folder / "vit"))
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(
        str(folder / "vit"))
    return folder


@pytest.fixture(scope="module")
def daemon(module_serve: Any, folder: Path) -> Daemon:
    return module_serve(CONFIG, directory=folder)  # type: ignore[no-any-return]


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.http_port}")
    yield triton
    triton.close()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=120) as http:
        yield http


def echo_reference(data: Sequence[bytes]) -> np.ndarray:
    return reference([decoded(d) for d in data], 26, (24, 20), IMAGENET_MEAN, IMAGENET_STD)


def binary_infer(http: httpclient.InferenceServerClient, model: str, data: Sequence[bytes],
                 outputs: Sequence[str] = ("pixels",)) -> httpclient.InferResult:
    image = httpclient.InferInput("image", [len(data)], "BYTES")
    image.set_data_from_numpy(np.array(list(data), dtype=object), binary_data=True)
    wanted = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
    return http.infer(model, [image], outputs=wanted)


def base64_body(data: Sequence[bytes], output: str = "pixels") -> dict[str, Any]:
    return {"inputs": [{"name": "image", "shape": [len(data)], "datatype": "BYTES",
                        "parameters": {"content_type": "base64"},
                        "data": [base64.b64encode(d).decode() for d in data]}],
            "outputs": [{"name": output}]}


# --- answers ----------------------------------------------------------------------------------


def test_every_kind_of_image_over_the_binary_extension_equals_the_reference(
    http: httpclient.InferenceServerClient,
) -> None:
    data = list(images().values())
    got = binary_infer(http, "echo", data).as_numpy("pixels")
    np.testing.assert_allclose(got, echo_reference(data), rtol=1e-5, atol=1e-5)


def test_base64_json_and_grpc_give_the_same_answers(client: httpx.Client,
                                                     daemon: Daemon) -> None:
    data = list(images().values())[:4]
    want = echo_reference(data)
    response = client.post("/v2/models/echo/infer", json=base64_body(data))
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    assert out["shape"] == [4, 3, 24, 20]
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(4, 3, 24, 20), want,
                               rtol=1e-5, atol=1e-5)
    with grpcclient.InferenceServerClient(daemon.grpc_address) as grpc:
        image = grpcclient.InferInput("image", [len(data)], "BYTES")
        image.set_data_from_numpy(np.array(data, dtype=object))
        result = grpc.infer("echo", [image], outputs=[grpcclient.InferRequestedOutput("pixels")])
    np.testing.assert_allclose(result.as_numpy("pixels"), want, rtol=1e-5, atol=1e-5)


def test_layout_channels_and_filter_from_the_entry(http: httpclient.InferenceServerClient) -> None:
    """NHWC read from the model (which takes any size), BGR, bicubic and the crop from the
    entry."""
    data = [images()["png 37x23"], images()["exif jpeg 45x27"]]
    got = binary_infer(http, "echo-nhwc", data).as_numpy("pixels")
    want = reference([decoded(d) for d in data], 30, (18, 22), interpolation="bicubic",
                     layout="NHWC", bgr=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_metadata_offers_image_next_to_the_tensor(client: httpx.Client) -> None:
    inputs = client.get("/v2/models/echo").json()["inputs"]
    assert {"name": "image", "datatype": "BYTES", "shape": [-1]} in inputs
    assert {"name": "pixel_values", "datatype": "FP32", "shape": [-1, 3, 24, 20]} in inputs


def test_the_tensor_is_still_taken_as_it_is(http: httpclient.InferenceServerClient) -> None:
    pixels = np.random.default_rng(0).random((2, 3, 24, 20), dtype=np.float32)
    tensor = httpclient.InferInput("pixel_values", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels, binary_data=True)
    got = http.infer("echo", [tensor]).as_numpy("pixels")
    assert np.array_equal(got, pixels)


def test_classification_names_the_classes_of_an_image(
    http: httpclient.InferenceServerClient,
) -> None:
    data = [images()["png 37x23"]]
    scores = binary_infer(http, "echo", data, ["scores"]).as_numpy("scores")
    image = httpclient.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(np.array(data, dtype=object), binary_data=True)
    result = http.infer("echo", [image], outputs=[
        httpclient.InferRequestedOutput("scores", binary_data=False, class_count=2)])
    best = np.argsort(-scores[0])[:2]
    got = [s.decode() if isinstance(s, bytes) else s for s in result.as_numpy("scores")[0]]
    assert [s.split(":", 1)[1] for s in got] == [f"{i}:{SCORES[i]}" for i in best]


def test_a_hugging_face_classifier_answers_as_its_processor_and_model_in_process(
    http: httpclient.InferenceServerClient, folder: Path,
) -> None:
    data = [images()["jpeg 23x41"], images()["rgba png 29x29"], images()["gif 19x25"]]
    processor = transformers.AutoImageProcessor.from_pretrained(str(folder / "vit"))
    model = transformers.ViTForImageClassification.from_pretrained(str(folder / "vit")).eval()
    pixels = processor(images=[decoded(d) for d in data], return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        want = model(pixel_values=pixels).logits.numpy()
    got = binary_infer(http, "vit", data, ["logits"]).as_numpy("logits")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    image = httpclient.InferInput("image", [len(data)], "BYTES")
    image.set_data_from_numpy(np.array(data, dtype=object), binary_data=True)
    result = http.infer("vit", [image], outputs=[
        httpclient.InferRequestedOutput("logits", binary_data=False, class_count=1)])
    labels = [str(s).split(":")[2] for s in result.as_numpy("logits").reshape(-1)]
    assert labels == [ID2LABEL[int(i)] for i in want.argmax(axis=1)]


# --- refusals ---------------------------------------------------------------------------------


def refusal(http: httpclient.InferenceServerClient, data: Sequence[bytes]) -> str:
    with pytest.raises(InferenceServerException) as caught:
        binary_infer(http, "echo", data)
    assert caught.value.status() == "400", caught.value
    return str(caught.value.message())


def test_bad_rows_are_400s_naming_the_row(http: httpclient.InferenceServerClient) -> None:
    good = images()["png 37x23"]
    jpeg = images()["gray jpeg 640x480"]
    assert "row 1 is not an image" in refusal(http, [good, b"<html>not found</html>"])
    assert "row 2 (JPEG 640x480) cannot be decoded" in refusal(
        http, [good, good, jpeg[: len(jpeg) // 2]])
    assert "row 0 is empty" in refusal(http, [b"", good])
    big = encoded(picture(1001, 1000, seed=1, mode="L"), "PNG")
    assert "row 1 is 1001x1000, 1001000 pixels, over the model's max_image_pixels" in refusal(
        http, [good, big])


def test_invalid_base64_and_both_inputs_are_400s(client: httpx.Client) -> None:
    body = base64_body([images()["png 37x23"]])
    body["inputs"][0]["data"] = ["bm90IGJhc2U2NA"]  # padding missing
    response = client.post("/v2/models/echo/infer", json=body)
    assert response.status_code == 400
    assert "element 0 is not valid base64" in response.json()["error"]
    body = base64_body([images()["png 37x23"]])
    body["inputs"].append({"name": "pixel_values", "shape": [1, 3, 24, 20], "datatype": "FP32",
                           "data": [0.0] * (3 * 24 * 20)})
    response = client.post("/v2/models/echo/infer", json=body)
    assert response.status_code == 400
    assert "send 'image' or 'pixel_values', not both" in response.json()["error"]


def test_a_bad_image_fails_alone_among_requests_batched_together(daemon: Daemon) -> None:
    """Eight requests at once (the model batches up to 8, waiting 50 ms for them): the broken
    ones get their 400, the others their own answers."""
    data = list(images().values())

    def send(i: int) -> tuple[int, Any]:
        with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.http_port}") as triton:
            payload = [b"broken"] if i % 3 == 0 else [data[i]]
            try:
                return 200, binary_infer(triton, "echo", payload).as_numpy("pixels")
            except InferenceServerException as exc:
                return int(exc.status() or 0), exc.message()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, range(8)))
    for i, (status, answer) in enumerate(answers):
        if i % 3 == 0:
            assert status == 400
            assert "row 0 is not an image" in answer
        else:
            assert status == 200, answer
            np.testing.assert_allclose(answer, echo_reference([data[i]]), rtol=1e-5, atol=1e-5)
