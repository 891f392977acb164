"""Edges of the HTTP contract a client can hit: methods and paths (405 with Allow, HEAD, no
redirects, a WebSocket upgrade refused), request shapes numpy cannot describe, text that is not
UTF-8 for a string model, BF16 tensors, and versioned repository paths. Each must get its own
clear answer, and never a 500 or a neighbour's failure."""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from daemon import Daemon
from oip_http import index_of
from onnx_models import write_bf16_model, write_flag_model, write_mlp, write_text_model
from raw_http import closed_by_server, read_response

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

CONFIG = """
[server]
max_request_size = "1MiB"

[[models]]
name = "mlp"
path = "mlp.onnx"

[[models]]
name = "text"
path = "text.onnx"
[models.batching]
max_batch_size = 64
max_delay = "2ms"

[[models]]
name = "bf16"
path = "bf16.onnx"

[[models]]
name = "flags"
path = "flags.onnx"
"""

HEADER = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def daemon(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    folder = tmp_path_factory.mktemp("http_edges")
    write_mlp(folder / "mlp.onnx")
    write_text_model(folder / "text.onnx")
    write_bf16_model(folder / "bf16.onnx")
    write_flag_model(folder / "flags.onnx")
    return module_serve(CONFIG, directory=folder)  # type: ignore[no-any-return]


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=60) as http:
        yield http


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    return text + b"".join(blobs), {HEADER: str(len(text))}


def mlp_row() -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


# --- methods and paths -------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
@pytest.mark.parametrize("path", ["/v2/models/mlp/infer", "/v2/models/mlp/versions/1/infer"])
def test_infer_with_another_method_is_405_naming_post(
    client: httpx.Client, method: str, path: str
) -> None:
    response = client.request(method, path)

    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json() == {"error": "Method Not Allowed"}


def test_a_405_on_any_endpoint_says_which_methods_are_allowed(client: httpx.Client) -> None:
    response = client.put("/v2/health/ready")

    assert response.status_code == 405
    assert set(response.headers["allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}
    assert "error" in response.json()


@pytest.mark.parametrize("path", ["/v2", "/v2/health/live", "/health/ready", "/v2/models/mlp"])
def test_head_answers_like_get_without_a_body(client: httpx.Client, path: str) -> None:
    get = client.get(path)
    head = client.head(path)

    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == str(len(get.content))


@pytest.mark.parametrize("path", ["/v2/", "/v2/models/mlp/", "/health/live/"])
def test_a_trailing_slash_is_a_json_404_not_a_redirect(client: httpx.Client, path: str) -> None:
    response = client.get(path)

    assert response.status_code == 404
    assert response.json() == {"error": "Not Found"}


WEBSOCKET = (b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")


@pytest.mark.parametrize("handshake", [
    WEBSOCKET, b"Upgrade: websocket\r\nConnection: Upgrade\r\n",
], ids=["valid", "without-a-key"])
@pytest.mark.parametrize("path", ["/v2/health/ready", "/v2/models/mlp/infer", "/nowhere"])
def test_a_websocket_upgrade_is_a_403_and_the_connection_closes(
    daemon: Daemon, client: httpx.Client, handshake: bytes, path: str
) -> None:
    with socket.create_connection(("127.0.0.1", daemon.http_port), timeout=10) as sock:
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: snooze\r\n%s\r\n" % (path.encode(), handshake))
        status, headers, body = read_response(sock)
        assert (status, body) == (403, b"")
        assert headers["connection"] == "close"
        assert closed_by_server(sock)
    assert client.get("/v2/health/ready").status_code == 200


def test_a_request_pipelined_before_a_websocket_upgrade_is_answered_first(daemon: Daemon) -> None:
    with socket.create_connection(("127.0.0.1", daemon.http_port), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: snooze\r\n\r\n"
                     b"GET /v2/health/ready HTTP/1.1\r\nHost: snooze\r\n%s\r\n" % WEBSOCKET)
        received = b""
        while chunk := sock.recv(65536):  # both answers, then the server closes
            received += chunk
    first, second = received.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 OK\r\n")
    assert first.endswith(b'\r\n\r\n{"ready":true}')
    assert second.startswith(b"403 Forbidden\r\n")
    assert second.endswith(b"\r\n\r\n")  # no body


def test_repository_load_and_unload_take_the_optional_version_segment(
    client: httpx.Client,
) -> None:
    loaded = client.post("/v2/repository/models/mlp/versions/1/load")
    assert loaded.status_code == 200, loaded.text
    assert index_of(client)["mlp"]["state"] == "READY"

    unloaded = client.post("/v2/repository/models/mlp/versions/1/unload")
    assert unloaded.status_code == 200, unloaded.text
    assert index_of(client)["mlp"]["state"] == "UNLOADED"

    missing = client.post("/v2/repository/models/mlp/versions/2/load")
    assert missing.status_code == 404
    assert "version '2'" in missing.json()["error"]


# --- shapes numpy cannot describe --------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        pytest.param([2**62, 0], "too large", id="huge-dim-beside-zero"),
        pytest.param([2**32, 2**32, 0], "too large", id="huge-product-beside-zero"),
        pytest.param([1] * 65, "at most 32", id="rank-65"),
    ],
)
@pytest.mark.parametrize("model", ["mlp", "no-such-model"])
def test_impossible_shapes_are_a_400_naming_the_input(
    client: httpx.Client, shape: list[int], words: str, model: str
) -> None:
    data: list[float] = [] if 0 in shape else [1.0]
    body = {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": data}]}

    response = client.post(f"/v2/models/{model}/infer", json=body)

    assert response.status_code == 400, response.text
    assert "input 'x'" in response.json()["error"]
    assert words in response.json()["error"]
    assert client.post("/v2/models/mlp/infer", json=mlp_row()).status_code == 200


def test_impossible_binary_shapes_are_a_400_too(client: httpx.Client) -> None:
    header = {"inputs": [{"name": "x", "shape": [2**62, 0], "datatype": "FP32",
                          "parameters": {"binary_data_size": 0}}]}
    content, headers = binary_body(header)

    response = client.post("/v2/models/mlp/infer", content=content, headers=headers)

    assert response.status_code == 400, response.text
    assert "too large" in response.json()["error"]


# --- string models -----------------------------------------------------------------------


def bytes_element(raw: bytes) -> bytes:
    return len(raw).to_bytes(4, "little") + raw


def test_bytes_that_are_not_utf8_fail_only_their_own_request(client: httpx.Client) -> None:
    # A string model needs text; invalid UTF-8 is that request's 400. Sent amid good requests
    # to a batching model, so a bad element that reached the batch would fail its neighbours.
    bad_header = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                              "parameters": {"binary_data_size": 6}}]}
    bad_content, bad_headers = binary_body(bad_header, bytes_element(b"\xff\xfe"))

    def good(i: int) -> tuple[int, Any]:
        words = [f"hello {i}", "snooze ✓"]
        body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": words}]}
        response = client.post("/v2/models/text/infer", json=body)
        return response.status_code, (response.json(), words)

    def bad(i: int) -> tuple[int, Any]:
        response = client.post("/v2/models/text/infer", content=bad_content, headers=bad_headers)
        return response.status_code, response.json()

    with ThreadPoolExecutor(9) as pool:
        goods = [pool.submit(good, i) for i in range(60)]
        bads = [pool.submit(bad, i) for i in range(30)]
        good_results = [f.result() for f in goods]
        bad_results = [f.result() for f in bads]

    for status, (body, words) in good_results:
        assert status == 200, body
        assert body["outputs"][0]["data"] == words
    for status, body in bad_results:
        assert status == 400, body
        assert "input 'text'" in body["error"]
        assert "UTF-8" in body["error"]


# --- BF16 --------------------------------------------------------------------------------

# Values BF16 holds exactly, so the expected bits are the upper half of their FP32 bits.
EXACT = np.array([[1.5, -2.0], [3.0, 0.25], [0.0, -0.5]], dtype="<f4")
EXACT_BITS = (EXACT.view("<u4") >> 16).astype("<u2")


def test_bf16_travels_as_binary_over_http_both_ways(client: httpx.Client) -> None:
    header = {
        "inputs": [
            {"name": "x", "shape": [3, 2], "datatype": "BF16",
             "parameters": {"binary_data_size": EXACT_BITS.nbytes}},
            {"name": "f", "shape": [3, 2], "datatype": "FP32", "data": EXACT.ravel().tolist()},
        ],
        "outputs": [{"name": "wide"}, {"name": "narrow", "parameters": {"binary_data": True}}],
    }
    content, headers = binary_body(header, EXACT_BITS.tobytes())

    response = client.post("/v2/models/bf16/infer", content=content, headers=headers)

    assert response.status_code == 200, response.text
    length = int(response.headers[HEADER.lower()])
    doc = json.loads(response.content[:length])
    outputs = {o["name"]: o for o in doc["outputs"]}
    assert outputs["wide"]["data"] == EXACT.ravel().tolist()
    assert outputs["narrow"]["datatype"] == "BF16"
    assert outputs["narrow"]["parameters"] == {"binary_data_size": EXACT_BITS.nbytes}
    narrow = np.frombuffer(response.content[length:], "<u2").reshape(3, 2)
    np.testing.assert_array_equal(narrow, EXACT_BITS)


def test_a_bf16_output_asked_as_json_comes_back_as_its_float_values(
    client: httpx.Client,
) -> None:
    header = {"inputs": [
        {"name": "x", "shape": [1, 2], "datatype": "BF16", "parameters": {"binary_data_size": 4}},
        {"name": "f", "shape": [3, 2], "datatype": "FP32", "data": EXACT.ravel().tolist()},
    ]}
    content, headers = binary_body(header, EXACT_BITS[:1].tobytes())

    response = client.post("/v2/models/bf16/infer", content=content, headers=headers)

    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["narrow"]["data"] == EXACT.ravel().tolist()
    assert outputs["wide"]["data"] == EXACT[:1].ravel().tolist()


def test_bf16_travels_raw_over_grpc(daemon: Daemon) -> None:
    request = pb.ModelInferRequest(model_name="bf16")
    request.inputs.add(name="x", datatype="BF16", shape=[3, 2])
    request.inputs.add(name="f", datatype="FP32", shape=[3, 2])
    request.raw_input_contents.extend([EXACT_BITS.tobytes(), EXACT.tobytes()])

    with grpc.insecure_channel(daemon.grpc_address) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)

    got = {o.name: (o, raw) for o, raw in zip(response.outputs, response.raw_output_contents,
                                              strict=True)}
    wide, wide_raw = got["wide"]
    narrow, narrow_raw = got["narrow"]
    assert (narrow.datatype, list(narrow.shape)) == ("BF16", [3, 2])
    np.testing.assert_array_equal(np.frombuffer(wide_raw, "<f4").reshape(3, 2), EXACT)
    np.testing.assert_array_equal(np.frombuffer(narrow_raw, "<u2").reshape(3, 2), EXACT_BITS)
    assert wide.datatype == "FP32"


# --- compressed bodies -------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_request_compression_is_inflated_before_decoding(
    daemon: Daemon, algorithm: str, binary: bool
) -> None:
    f = np.arange(6, dtype=np.float32).reshape(3, 2)
    x = httpclient.InferInput("x", [3, 2], "BF16")
    x.set_data_from_numpy(EXACT.astype(ml_dtypes.bfloat16), binary_data=True)
    tensor = httpclient.InferInput("f", [3, 2], "FP32")
    tensor.set_data_from_numpy(f, binary_data=binary)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.http_port}")
    try:
        result = client.infer("bf16", [x, tensor], request_compression_algorithm=algorithm)
    finally:
        client.close()

    np.testing.assert_array_equal(result.as_numpy("wide"), EXACT)
    np.testing.assert_array_equal(result.as_numpy("narrow").astype(np.float32), f)


def test_a_compressed_body_that_inflates_past_the_limit_is_413(client: httpx.Client) -> None:
    # 2 MiB of JSON whitespace squeezes into a few KiB; the limit here is 1 MiB.
    bomb = gzip.compress(b"{" + b" " * (2 * 1024 * 1024) + b"}")
    assert len(bomb) < 64 * 1024

    response = client.post("/v2/models/mlp/infer", content=bomb,
                           headers={"Content-Encoding": "gzip"})

    assert response.status_code == 413, response.text
    assert "inflated" in response.json()["error"]


@pytest.mark.parametrize(
    ("encoding", "content", "words"),
    [
        pytest.param("br", b"whatever", "unsupported Content-Encoding 'br'", id="unknown"),
        pytest.param("gzip", b"not gzip at all", "not valid gzip", id="not-gzip"),
        pytest.param("deflate", zlib.compress(json.dumps(mlp_row()).encode())[:-6],
                     "truncated", id="truncated"),
    ],
)
def test_bad_compressed_bodies_are_a_400(
    client: httpx.Client, encoding: str, content: bytes, words: str
) -> None:
    response = client.post("/v2/models/mlp/infer", content=content,
                           headers={"Content-Encoding": encoding})

    assert response.status_code == 400, response.text
    assert words in response.json()["error"]


# --- refused extensions, out-of-range values ---------------------------------------------


def test_shared_memory_parameters_are_501_not_a_confusing_400(client: httpx.Client) -> None:
    body = mlp_row()
    region = {"shared_memory_region": "r0", "shared_memory_byte_size": 256}
    body["inputs"][0] = {"name": "x", "shape": [1, 64], "datatype": "FP32", "parameters": region}

    response = client.post("/v2/models/mlp/infer", json=body)

    assert response.status_code == 501, response.text
    assert "shared memory" in response.json()["error"]


def test_of_two_content_encoding_headers_the_first_counts(client: httpx.Client) -> None:
    # As with Content-Length and Inference-Header-Content-Length: the first header wins.
    plain = json.dumps(mlp_row()).encode()
    first_identity = client.post("/v2/models/mlp/infer", content=plain, headers=[
        ("Content-Encoding", "identity"), ("Content-Encoding", "gzip")])
    first_gzip = client.post("/v2/models/mlp/infer", content=gzip.compress(plain), headers=[
        ("Content-Encoding", "gzip"), ("Content-Encoding", "identity")])

    assert first_identity.status_code == 200, first_identity.text
    assert first_gzip.status_code == 200, first_gzip.text


@pytest.mark.parametrize("value", [3.5e38, -1e39])
def test_a_float_beyond_fp32_is_a_400_not_an_infinity(client: httpx.Client, value: float) -> None:
    body = mlp_row()
    body["inputs"][0]["data"] = [value] + [0.0] * 63

    response = client.post("/v2/models/mlp/infer", json=body)

    assert response.status_code == 400, response.text
    assert response.json()["error"] == "input 'x': a value is out of range for FP32"


def flag_request(raw: bytes) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="flags")
    request.inputs.add(name="flag", datatype="BOOL", shape=[1, 2])
    request.raw_input_contents.append(raw)
    return request


def test_raw_bool_bytes_other_than_0_and_1_are_a_400(daemon: Daemon) -> None:
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failure:
            stub.ModelInfer(flag_request(b"\x02\xff"), timeout=60)
        good = stub.ModelInfer(flag_request(b"\x01\x00"), timeout=60)

    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.value.details() == "input 'flag': BOOL data must be bytes of 0 or 1"
    assert good.raw_output_contents[0] == b"\x00\x01"  # Not


def test_a_very_long_model_name_is_not_found_with_a_message_that_fits(daemon: Daemon) -> None:
    name = "n" * 20000
    request = pb.ModelInferRequest(model_name=name)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.zeros(64, "<f4").tobytes())

    with grpc.insecure_channel(daemon.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failure:
            stub.ModelInfer(request, timeout=60)
        ready = stub.ServerReady(pb.ServerReadyRequest(), timeout=60)

    assert failure.value.code() == grpc.StatusCode.NOT_FOUND
    assert failure.value.details().startswith("unknown model 'nnn")
    assert len(failure.value.details()) <= 2000
    assert ready.ready
