"""The binary tensor data extension over raw HTTP (httpx, no client library): binary inputs
after the JSON header, binary outputs on request, Inference-Header-Content-Length both ways,
and a 400 naming the tensor for every inconsistent size (issue 4)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from daemon import Daemon
from oip_http import output
from onnx_models import SERVED, reference_session, write_mlp, write_multi_dtype_model

CONFIG = """
[[models]]
name = "multi"
path = "multi.onnx"

[[models]]
name = "mlp"
path = "mlp.onnx"
"""

DATATYPES = {"f32": "FP32", "i64": "INT64", "flag": "BOOL", "half": "FP16", "text": "BYTES"}
OUTPUTS = [f"{name}_out" for name in DATATYPES]
WIRE = {"FP32": "<f4", "INT64": "<i8", "BOOL": "?", "FP16": "<f2"}
HEADER = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("binary_http")
    write_multi_dtype_model(folder / "multi.onnx")
    write_mlp(folder / "mlp.onnx")
    return folder


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: Path) -> Daemon:
    return module_serve(CONFIG, directory=models)  # type: ignore[no-any-return]


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=60) as http:
        yield http


# --- the wire format, written out by hand ------------------------------------------------


def raw_of(datatype: str, array: np.ndarray) -> bytes:
    """Little-endian, row-major; BYTES elements each get a 4-byte little-endian length."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in array.ravel())
    return np.ascontiguousarray(array, dtype=WIRE[datatype]).tobytes()


def array_of(datatype: str, shape: list[int], raw: bytes) -> np.ndarray:
    if datatype != "BYTES":
        return np.frombuffer(raw, WIRE[datatype]).reshape(shape)
    items, offset = [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        items.append(raw[offset + 4:offset + 4 + length])
        offset += 4 + length
    return np.array(items, dtype=object).reshape(shape)


def with_binary(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a request: the JSON header, then the blobs in order."""
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {HEADER: str(len(head)),
                                    "Content-Type": "application/octet-stream"}


def binary_input(name: str, datatype: str, array: np.ndarray) -> tuple[dict[str, Any], bytes]:
    raw = raw_of(datatype, array)
    return ({"name": name, "datatype": datatype, "shape": list(array.shape),
             "parameters": {"binary_data_size": len(raw)}}, raw)


def split_response(response: httpx.Response) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON header of a response and its binary outputs, decoded."""
    assert response.status_code == 200, response.text
    length = int(response.headers[HEADER])
    assert int(response.headers["content-length"]) == len(response.content)
    body = json.loads(response.content[:length])
    binary: dict[str, np.ndarray] = {}
    offset = length
    for entry in body["outputs"]:
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is None:
            continue
        assert "data" not in entry
        raw = response.content[offset:offset + size]
        binary[entry["name"]] = array_of(entry["datatype"], entry["shape"], raw)
        offset += size
    assert offset == len(response.content), "the outputs' sizes cover the body exactly"
    return body, binary


def multi_feed() -> dict[str, np.ndarray]:
    return {
        "f32": np.array([[0.5, -1.25, 3.0, 1e-3], [2.5, 0.0, -7.75, 1e30]], np.float32),
        "i64": np.array([[-(2**40), 0, 2**62]], np.int64),
        "flag": np.array([[True, False], [False, False], [True, True]]),
        "half": np.array([[0.5, -1.5], [1000.0, 2.0**-14]], np.float16),
        "text": np.array(["héllo".encode(), b"", "日本語 ✓".encode()], dtype=object),
    }


def expected_outputs(models: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    reference = {**feed, "text": np.array([v.decode() for v in feed["text"]], dtype=object)}
    return dict(zip(OUTPUTS, reference_session(models / "multi.onnx").run(OUTPUTS, reference),
                    strict=True))


def all_binary(feed: dict[str, np.ndarray], **extra: Any) -> tuple[bytes, dict[str, str]]:
    entries, blobs = zip(*(binary_input(n, DATATYPES[n], a) for n, a in feed.items()),
                         strict=True)
    return with_binary({"inputs": list(entries), **extra}, *blobs)


def assert_numeric_equal(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got.astype(expected.dtype), expected)


# --- binary inputs -----------------------------------------------------------------------


def test_binary_inputs_of_every_datatype_answer_like_onnxruntime(
    client: httpx.Client, models: Path
) -> None:
    feed = multi_feed()
    body, headers = all_binary(feed, id="all-binary")

    response = client.post("/v2/models/multi/infer", content=body, headers=headers)

    assert response.status_code == 200, response.text
    assert HEADER.lower() not in response.headers  # no binary output was asked for
    assert response.headers["content-type"] == "application/json"
    doc = response.json()
    assert doc["id"] == "all-binary"
    expected = expected_outputs(models, feed)
    for name in ("f32_out", "i64_out", "flag_out", "half_out"):
        assert_numeric_equal(output(doc, name), expected[name])
    text = next(o for o in doc["outputs"] if o["name"] == "text_out")["data"]
    assert text == ["héllo", "", "日本語 ✓"]


def test_binary_and_json_inputs_mix_in_one_request(client: httpx.Client, models: Path) -> None:
    feed = multi_feed()
    half, half_raw = binary_input("half", "FP16", feed["half"])
    text, text_raw = binary_input("text", "BYTES", feed["text"])
    header = {"inputs": [
        {"name": "f32", "datatype": "FP32", "shape": [2, 4], "data": feed["f32"].tolist()},
        half,
        {"name": "i64", "datatype": "INT64", "shape": [1, 3], "data": feed["i64"].tolist()},
        {"name": "flag", "datatype": "BOOL", "shape": [3, 2], "data": feed["flag"].tolist()},
        text,
    ]}
    body, headers = with_binary(header, half_raw, text_raw)

    response = client.post("/v2/models/multi/infer", content=body, headers=headers)

    assert response.status_code == 200, response.text
    expected = expected_outputs(models, feed)
    assert_numeric_equal(output(response.json(), "half_out"), expected["half_out"])
    assert_numeric_equal(output(response.json(), "i64_out"), expected["i64_out"])


# --- binary outputs ----------------------------------------------------------------------


def test_binary_data_output_makes_every_output_binary_with_the_header_length(
    client: httpx.Client, models: Path
) -> None:
    feed = multi_feed()
    body, headers = all_binary(feed, parameters={"binary_data_output": True})

    response = client.post("/v2/models/multi/infer", content=body, headers=headers)

    assert response.headers["content-type"] == "application/octet-stream"
    doc, binary = split_response(response)
    assert sorted(binary) == sorted(OUTPUTS)
    expected = expected_outputs(models, feed)
    for entry in doc["outputs"]:
        name = entry["name"]
        assert entry["shape"] == list(expected[name].shape)
        size = entry["parameters"]["binary_data_size"]
        if name == "text_out":
            assert binary[name].tolist() == [v.encode() for v in expected[name]]
            assert size == sum(4 + len(v.encode()) for v in expected[name])
        else:
            assert binary[name].dtype == expected[name].dtype
            np.testing.assert_array_equal(binary[name], expected[name])
            assert size == expected[name].nbytes


def test_an_outputs_own_binary_data_flag_wins_over_the_request_default(
    client: httpx.Client, models: Path
) -> None:
    feed = multi_feed()
    body, headers = all_binary(feed, outputs=[
        {"name": "half_out", "parameters": {"binary_data": True}},
        {"name": "f32_out"},
        {"name": "i64_out", "parameters": {"binary_data": False}},
    ], parameters={"binary_data_output": False})

    response = client.post("/v2/models/multi/infer", content=body, headers=headers)

    doc, binary = split_response(response)
    expected = expected_outputs(models, feed)
    assert [o["name"] for o in doc["outputs"]] == ["half_out", "f32_out", "i64_out"]
    assert list(binary) == ["half_out"]
    np.testing.assert_array_equal(binary["half_out"], expected["half_out"])
    assert_numeric_equal(output(doc, "f32_out"), expected["f32_out"])
    assert_numeric_equal(output(doc, "i64_out"), expected["i64_out"])


def test_binary_data_false_on_one_output_keeps_it_json_under_binary_data_output(
    client: httpx.Client, models: Path
) -> None:
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 64],
                          "data": x.tolist()}],
              "parameters": {"binary_data_output": True},
              "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}

    response = client.post("/v2/models/mlp/infer", json=header)

    assert response.status_code == 200, response.text
    assert HEADER.lower() not in response.headers
    expected = reference_session(models / "mlp.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(output(response.json(), "y"), expected, **SERVED)


def test_a_json_request_can_ask_for_binary_outputs(client: httpx.Client, models: Path) -> None:
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 64],
                          "data": x.ravel().tolist()}],
              "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}

    response = client.post("/v2/models/mlp/infer", json=header)

    doc, binary = split_response(response)
    assert doc["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [3, 64],
                               "parameters": {"binary_data_size": 3 * 64 * 4}}]
    expected = reference_session(models / "mlp.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(binary["y"], expected, **SERVED)


def test_server_metadata_lists_the_binary_tensor_data_extension(client: httpx.Client) -> None:
    response = client.get("/v2")

    assert response.status_code == 200
    assert "binary_tensor_data" in response.json()["extensions"]


# --- inconsistent sizes ------------------------------------------------------------------

X = np.arange(64, dtype=np.float32).reshape(1, 64)
X_RAW = X.tobytes()


def x_header(size: int = len(X_RAW), **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64],
                        "parameters": {"binary_data_size": size}, **extra}]}


def two_inputs_header(first: int, second: int) -> dict[str, Any]:
    return {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 64],
         "parameters": {"binary_data_size": first}},
        {"name": "x2", "datatype": "FP32", "shape": [1, 64],
         "parameters": {"binary_data_size": second}},
    ]}


def request_parts(
    header: dict[str, Any], tail: bytes, header_length: int | str | None = "exact"
) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    headers = {"Content-Type": "application/octet-stream"}
    if header_length == "exact":
        headers[HEADER] = str(len(head))
    elif header_length is not None:
        headers[HEADER] = str(header_length)
    return head + tail, headers


INCONSISTENT: list[tuple[str, tuple[bytes, dict[str, str]], str]] = [
    ("binary_data_size larger than what follows",
     request_parts(x_header(len(X_RAW) + 4), X_RAW),
     "input 'x': binary_data_size 260 runs past the end of the binary data (256 bytes left)"),
    ("second input's size runs past the end",
     request_parts(two_inputs_header(256, 256), X_RAW + X_RAW[:100]),
     "input 'x2': binary_data_size 256 runs past the end of the binary data (100 bytes left)"),
    ("leftover bytes after the last input",
     request_parts(x_header(), X_RAW + b"\x00" * 8),
     "8 bytes of binary data follow the JSON header but no input claims them"),
    ("binary_data_size that does not match the shape",
     request_parts(x_header(252), X_RAW[:252]),
     "input 'x': FP32 [1, 64] needs 256 bytes of binary data, got 252"),
    ("header length larger than the body",
     request_parts(x_header(), X_RAW, header_length=10_000),
     "Inference-Header-Content-Length 10000 does not fit a body of"),
    ("header length that is not a number",
     request_parts(x_header(), X_RAW, header_length="lots"),
     "invalid Inference-Header-Content-Length header"),
    ("header length that is negative",
     request_parts(x_header(), X_RAW, header_length=-1),
     "invalid Inference-Header-Content-Length header (expected a number of bytes)"),
    # From the fuzzer: int() takes these, a byte count does not.
    ("header length with a sign",
     request_parts(x_header(), X_RAW, header_length="+104"),
     "invalid Inference-Header-Content-Length header"),
    ("header length of 5,000 digits",
     request_parts(x_header(), X_RAW, header_length="9" * 5000),
     "invalid Inference-Header-Content-Length header"),
    ("header length with an underscore",
     request_parts(x_header(), X_RAW, header_length="1_04"),
     "invalid Inference-Header-Content-Length header"),
    ("header length that cuts the JSON",
     request_parts(x_header(), X_RAW, header_length=20),
     "request body is not valid JSON"),
    ("binary_data_size without the header",
     request_parts(x_header(), b"", header_length=None),
     "input 'x' has 'binary_data_size' but the request has no binary data "
     "(send the Inference-Header-Content-Length header)"),
    ("binary bytes without the header",
     request_parts(x_header(), X_RAW, header_length=None),
     "request body is not valid JSON"),
    ("both data and binary_data_size",
     request_parts(x_header(data=X.tolist()), X_RAW),
     "input 'x' has both 'data' and 'binary_data_size'"),
    ("a negative binary_data_size",
     request_parts(x_header(-4), X_RAW),
     "input 'x': 'binary_data_size' must be a non-negative integer"),
    ("a binary_data_size that is a string",
     request_parts(x_header("256"), X_RAW),  # type: ignore[arg-type]
     "input 'x': 'binary_data_size' must be a non-negative integer"),
]


@pytest.mark.parametrize(("parts", "message"), [(p, m) for _, p, m in INCONSISTENT],
                         ids=[i for i, _, _ in INCONSISTENT])
def test_inconsistent_binary_sizes_get_a_400_that_says_what_is_wrong(
    client: httpx.Client, models: Path, parts: tuple[bytes, dict[str, str]], message: str
) -> None:
    body, headers = parts

    response = client.post("/v2/models/mlp/infer", content=body, headers=headers)

    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    # The server keeps serving.
    good, good_headers = with_binary(x_header(), X_RAW)
    answer = client.post("/v2/models/mlp/infer", content=good, headers=good_headers)
    assert answer.status_code == 200, answer.text
    expected = reference_session(models / "mlp.onnx").run(None, {"x": X})[0]
    np.testing.assert_allclose(output(answer.json(), "y"), expected, **SERVED)


def test_a_bytes_element_that_runs_past_its_tensor_gets_a_400_naming_it(
    client: httpx.Client,
) -> None:
    feed = multi_feed()
    entries, blobs = zip(*(binary_input(n, DATATYPES[n], a) for n, a in feed.items()),
                         strict=True)
    broken = struct.pack("<I", 50) + b"short"
    entries[-1]["parameters"]["binary_data_size"] = len(broken)
    body, headers = with_binary({"inputs": list(entries)}, *blobs[:-1], broken)

    response = client.post("/v2/models/multi/infer", content=body, headers=headers)

    assert response.status_code == 400, response.text
    assert response.json()["error"] == \
        "input 'text': a BYTES element of 50 bytes runs past the end of the data"
