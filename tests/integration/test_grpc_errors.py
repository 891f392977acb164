"""Raw grpcio stubs from our own .proto: every malformed ModelInfer gets its code and a message
naming the tensor, the server keeps serving (issue 4, Done means 4), and typed `contents` of
every kind answer like onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from daemon import Daemon
from onnx import TensorProto, helper, numpy_helper
from onnx_models import (
    SERVED,
    reference_session,
    write_corrupt_model,
    write_mlp,
    write_multi_dtype_model,
)
from tritonclient.utils import deserialize_bytes_tensor

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

CONFIG = """
[[models]]
name = "mlp"
path = "mlp.onnx"

[[models]]
name = "multi"
path = "multi.onnx"

[[models]]
name = "typed"
path = "typed.onnx"

[[models]]
name = "broken"
path = "broken.onnx"
"""

Code = grpc.StatusCode
Request = pb.ModelInferRequest
Tensor = pb.ModelInferRequest.InferInputTensor

# --- a model with one input per typed-contents field -------------------------------------

# name -> (OIP datatype, ONNX element type, numpy dtype, contents field)
TYPED = {
    "f32": ("FP32", TensorProto.FLOAT, np.float32, "fp32_contents"),
    "f64": ("FP64", TensorProto.DOUBLE, np.float64, "fp64_contents"),
    "i8": ("INT8", TensorProto.INT8, np.int8, "int_contents"),
    "i32": ("INT32", TensorProto.INT32, np.int32, "int_contents"),
    "i64": ("INT64", TensorProto.INT64, np.int64, "int64_contents"),
    "u8": ("UINT8", TensorProto.UINT8, np.uint8, "uint_contents"),
    "u32": ("UINT32", TensorProto.UINT32, np.uint32, "uint_contents"),
    "u64": ("UINT64", TensorProto.UINT64, np.uint64, "uint64_contents"),
    "flag": ("BOOL", TensorProto.BOOL, np.bool_, "bool_contents"),
    "text": ("BYTES", TensorProto.STRING, np.object_, "bytes_contents"),
}


def write_typed_model(path: Path) -> Path:
    """Each input `n` of TYPED -> output `n_out`: floats doubled, INT64 plus one, BOOL
    negated, everything else passed through (Identity)."""
    nodes = []
    for name in TYPED:
        if name == "f32":
            nodes.append(helper.make_node("Mul", [name, "two_f32"], [f"{name}_out"]))
        elif name == "f64":
            nodes.append(helper.make_node("Mul", [name, "two_f64"], [f"{name}_out"]))
        elif name == "i64":
            nodes.append(helper.make_node("Add", [name, "one_i64"], [f"{name}_out"]))
        elif name == "flag":
            nodes.append(helper.make_node("Not", [name], [f"{name}_out"]))
        else:
            nodes.append(helper.make_node("Identity", [name], [f"{name}_out"]))
    graph = helper.make_graph(
        nodes,
        "typed",
        [helper.make_tensor_value_info(n, t[1], [f"n_{n}", 2]) for n, t in TYPED.items()],
        [helper.make_tensor_value_info(f"{n}_out", t[1], [f"n_{n}", 2]) for n, t in TYPED.items()],
        [
            numpy_helper.from_array(np.array(2.0, np.float32), "two_f32"),
            numpy_helper.from_array(np.array(2.0, np.float64), "two_f64"),
            numpy_helper.from_array(np.array(1, np.int64), "one_i64"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def typed_feed() -> dict[str, np.ndarray]:
    return {
        "f32": np.array([[0.5, -1.25], [3.0, 1e-3]], np.float32),
        "f64": np.array([[1e300, -2.5e-300]], np.float64),
        "i8": np.array([[-128, 127], [0, -1]], np.int8),
        "i32": np.array([[-(2**31), 2**31 - 1]], np.int32),
        "i64": np.array([[-(2**40), 2**62]], np.int64),
        "u8": np.array([[0, 255]], np.uint8),
        "u32": np.array([[0, 2**32 - 1], [7, 8]], np.uint32),
        "u64": np.array([[0, 2**64 - 1]], np.uint64),
        "flag": np.array([[True, False], [False, False]]),
        "text": np.array([["héllo".encode(), b""], ["日本語".encode(), b"ascii"]], object),
    }


def typed_request(feed: dict[str, np.ndarray]) -> Request:
    request = Request(model_name="typed")
    for name, array in feed.items():
        datatype, _, _, field = TYPED[name]
        tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        getattr(tensor.contents, field).extend(array.ravel().tolist())
    return request


# --- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("grpc_errors")
    write_mlp(folder / "mlp.onnx")
    write_multi_dtype_model(folder / "multi.onnx")
    write_typed_model(folder / "typed.onnx")
    write_corrupt_model(folder / "broken.onnx")
    return folder


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: Path) -> Daemon:
    return module_serve(CONFIG, directory=models)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def stub(daemon: Daemon) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def mlp_raw(x: np.ndarray, **fields: Any) -> Request:
    request = Request(model_name="mlp", **fields)
    request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request


def multi_raw() -> Request:
    """A good raw request for every input of the multi-dtype model."""
    request = Request(model_name="multi")
    tensors: list[tuple[str, str, list[int], bytes]] = [
        ("f32", "FP32", [1, 4], np.arange(4, dtype="<f4").tobytes()),
        ("i64", "INT64", [1, 3], np.arange(3, dtype="<i8").tobytes()),
        ("flag", "BOOL", [1, 2], np.array([True, False]).tobytes()),
        ("half", "FP16", [1, 2], np.array([0.5, 1.5], "<f2").tobytes()),
        ("text", "BYTES", [2], b"\x02\x00\x00\x00hi\x00\x00\x00\x00"),
    ]
    for name, datatype, shape, raw in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    return request


def outputs_of(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """Decode raw_output_contents independently of the server's codec."""
    dtypes = {"FP32": "<f4", "FP64": "<f8", "FP16": "<f2", "INT8": "i1", "INT32": "<i4",
              "INT64": "<i8", "UINT8": "u1", "UINT32": "<u4", "UINT64": "<u8", "BOOL": "?"}
    assert len(response.raw_output_contents) == len(response.outputs)
    decoded = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        shape = list(tensor.shape)
        if tensor.datatype == "BYTES":
            decoded[tensor.name] = deserialize_bytes_tensor(raw).reshape(shape)
        else:
            decoded[tensor.name] = np.frombuffer(raw, dtypes[tensor.datatype]).reshape(shape)
    return decoded


def good_request(stub: pb_grpc.GRPCInferenceServiceStub, models: Path) -> None:
    x = np.full((2, 64), 0.25, np.float32)
    response = stub.ModelInfer(mlp_raw(x), timeout=60)
    expected = reference_session(models / "mlp.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(outputs_of(response)["y"], expected, **SERVED)


def rejection(stub: pb_grpc.GRPCInferenceServiceStub, request: Request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=60)
    return caught.value


# --- malformed requests ------------------------------------------------------------------


def wrong_raw_size() -> Request:
    request = mlp_raw(np.zeros((1, 64), np.float32))
    request.raw_input_contents[0] = request.raw_input_contents[0][:-1]
    return request


def contents_and_raw() -> Request:
    request = mlp_raw(np.zeros((1, 64), np.float32))
    request.inputs[0].contents.fp32_contents.extend([0.0] * 64)
    return request


def too_many_raw_entries() -> Request:
    request = mlp_raw(np.zeros((1, 64), np.float32))
    request.raw_input_contents.append(b"\x00" * 4)
    return request


def too_few_raw_entries() -> Request:
    request = multi_raw()
    del request.raw_input_contents[-1]
    return request


def unknown_datatype() -> Request:
    request = mlp_raw(np.zeros((1, 64), np.float32))
    request.inputs[0].datatype = "FP33"
    return request


def typed(datatype: str, shape: list[int], **contents: list[Any]) -> Request:
    request = Request(model_name="mlp")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    return request


def fp16_in_typed_contents() -> Request:
    request = typed_request(typed_feed())
    request.model_name = "multi"
    tensor = request.inputs.add(name="half", datatype="FP16", shape=[1, 2])
    tensor.contents.fp32_contents.extend([0.5, 1.5])
    return request


def negative_dimension() -> Request:
    request = mlp_raw(np.zeros((1, 64), np.float32))
    del request.inputs[0].shape[:]
    request.inputs[0].shape.extend([-1, 64])
    return request


def bytes_element_past_the_end() -> Request:
    request = multi_raw()
    request.raw_input_contents[4] = b"\x09\x00\x00\x00short"
    return request


def int8_out_of_range() -> Request:
    feed = typed_feed()
    request = typed_request(feed)
    i8 = next(t for t in request.inputs if t.name == "i8")
    i8.contents.int_contents[0] = 300
    return request


def unknown_input() -> Request:
    request = mlp_raw(np.zeros((1, 64), np.float32))
    request.inputs[0].name = "z"
    return request


def wrong_datatype_for_the_model() -> Request:
    return typed("FP64", [1, 64], fp64_contents=[0.0] * 64)


def missing_input() -> Request:
    request = multi_raw()
    del request.inputs[1]
    del request.raw_input_contents[1]
    return request


def unknown_output() -> Request:
    request = mlp_raw(np.zeros((1, 64), np.float32))
    request.outputs.add(name="logits")
    return request


def no_inputs() -> Request:
    return Request(model_name="mlp")


def unknown_model() -> Request:
    request = mlp_raw(np.zeros((1, 64), np.float32))
    request.model_name = "nope"
    return request


def unknown_version() -> Request:
    return mlp_raw(np.zeros((1, 64), np.float32), model_version="7")


CASES: list[tuple[Callable[[], Request], Code, str]] = [
    (wrong_raw_size, Code.INVALID_ARGUMENT,
     "input 'x': FP32 [1, 64] needs 256 bytes of binary data, got 255"),
    (contents_and_raw, Code.INVALID_ARGUMENT,
     "input 'x' sets contents while the request uses raw_input_contents; "
     "use one or the other"),
    (too_many_raw_entries, Code.INVALID_ARGUMENT,
     "raw_input_contents has 2 entries for 1 inputs; there must be one per input, in order"),
    (too_few_raw_entries, Code.INVALID_ARGUMENT,
     "raw_input_contents has 4 entries for 5 inputs; there must be one per input, in order"),
    (unknown_datatype, Code.INVALID_ARGUMENT, "input 'x': unknown datatype 'FP33'"),
    (lambda: typed("FP32", [1, 64], fp32_contents=[0.0] * 63), Code.INVALID_ARGUMENT,
     "input 'x': shape [1, 64] needs 64 elements, contents.fp32_contents has 63"),
    (lambda: typed("FP32", [2, 64], fp32_contents=[0.0] * 64), Code.INVALID_ARGUMENT,
     "input 'x': shape [2, 64] needs 128 elements, contents.fp32_contents has 64"),
    (lambda: typed("FP32", [1, 64], int64_contents=[0] * 64), Code.INVALID_ARGUMENT,
     "input 'x': FP32 data belongs in contents.fp32_contents, not contents.int64_contents"),
    (lambda: typed("FP32", [1, 64]), Code.INVALID_ARGUMENT,
     "input 'x': shape [1, 64] needs 64 elements, contents.fp32_contents has 0"),
    (fp16_in_typed_contents, Code.INVALID_ARGUMENT,
     "input 'half': FP16 travels only in raw_input_contents"),
    (lambda: typed("BF16", [1, 64]), Code.INVALID_ARGUMENT,
     "input 'x': BF16 travels only in raw_input_contents"),
    (negative_dimension, Code.INVALID_ARGUMENT,
     "input 'x': 'shape' must be a list of non-negative integers, got [-1, 64]"),
    (bytes_element_past_the_end, Code.INVALID_ARGUMENT,
     "input 'text': a BYTES element of 9 bytes runs past the end of the data"),
    (int8_out_of_range, Code.INVALID_ARGUMENT, "input 'i8': a value is out of range for INT8"),
    (unknown_input, Code.INVALID_ARGUMENT, "unknown input 'z' for model 'mlp'; expected ['x']"),
    (wrong_datatype_for_the_model, Code.INVALID_ARGUMENT,
     "input 'x': datatype FP64 does not match the model's FP32"),
    (missing_input, Code.INVALID_ARGUMENT, "missing input 'i64' for model 'multi'"),
    (unknown_output, Code.INVALID_ARGUMENT,
     "unknown output 'logits' for model 'mlp'; expected ['y']"),
    (no_inputs, Code.INVALID_ARGUMENT, "request needs at least one input"),
    (unknown_model, Code.NOT_FOUND, "unknown model 'nope'"),
    (unknown_version, Code.NOT_FOUND, "model 'mlp' has no version '7'"),
]


@pytest.mark.parametrize(("make", "code", "message"), CASES,
                         ids=[make.__name__ if make.__name__ != "<lambda>" else message
                              for make, _, message in CASES])
def test_a_malformed_request_gets_its_code_and_a_message_then_the_server_answers_a_good_one(
    stub: pb_grpc.GRPCInferenceServiceStub, models: Path,
    make: Callable[[], Request], code: Code, message: str,
) -> None:
    error = rejection(stub, make())

    assert error.code() == code
    assert message in error.details()

    good_request(stub, models)


def test_a_model_that_fails_to_load_is_unavailable_with_its_load_error(
    stub: pb_grpc.GRPCInferenceServiceStub, models: Path
) -> None:
    request = mlp_raw(np.zeros((1, 64), np.float32))
    request.model_name = "broken"

    error = rejection(stub, request)

    assert error.code() == Code.UNAVAILABLE
    assert "model 'broken' failed to load" in error.details()
    assert "INVALID_PROTOBUF" in error.details()
    good_request(stub, models)


def test_grpc_errors_carry_the_same_messages_as_http(
    stub: pb_grpc.GRPCInferenceServiceStub, daemon: Daemon
) -> None:
    def body(name: str, datatype: str) -> dict[str, Any]:
        return {"inputs": [{"name": name, "datatype": datatype, "shape": [1, 64],
                            "data": [0.0] * 64}]}

    nameless = typed("FP32", [1, 64], fp32_contents=[0.0] * 64)
    nameless.model_name = "nope"
    same_failures = [
        (nameless, "nope", body("x", "FP32")),
        (unknown_input(), "mlp", body("z", "FP32")),
        (wrong_datatype_for_the_model(), "mlp", body("x", "FP64")),
        (unknown_datatype(), "mlp", body("x", "FP33")),
    ]
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        for request, model, http_body in same_failures:
            response = client.post(f"/v2/models/{model}/infer", json=http_body)
            assert response.status_code in (400, 404), response.text
            assert rejection(stub, request).details() == response.json()["error"]


# --- typed contents, the happy path ------------------------------------------------------


def test_typed_contents_of_every_field_answer_like_onnxruntime(
    stub: pb_grpc.GRPCInferenceServiceStub, models: Path
) -> None:
    feed = typed_feed()

    response = stub.ModelInfer(typed_request(feed), timeout=60)

    got = outputs_of(response)
    # onnxruntime takes STRING tensors as str.
    reference = {**feed, "text": np.vectorize(bytes.decode, otypes=[object])(feed["text"])}
    names = [f"{name}_out" for name in TYPED]
    expected = dict(zip(names, reference_session(models / "typed.onnx").run(names, reference),
                        strict=True))
    for name in names:
        assert [o.datatype for o in response.outputs if o.name == name] == \
            [TYPED[name.removesuffix("_out")][0]]
        if name == "text_out":
            assert got[name].tolist() == [[v.encode() for v in row]
                                          for row in expected[name].tolist()]
        else:
            assert got[name].dtype == expected[name].dtype, name
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_typed_fp32_contents_of_the_mlp_answer_like_onnxruntime(
    stub: pb_grpc.GRPCInferenceServiceStub, models: Path
) -> None:
    x = np.random.default_rng(7).standard_normal((3, 64)).astype(np.float32)

    response = stub.ModelInfer(
        typed("FP32", [3, 64], fp32_contents=x.ravel().tolist()), timeout=60
    )

    expected = reference_session(models / "mlp.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(outputs_of(response)["y"], expected, **SERVED)
    assert list(response.outputs[0].shape) == [3, 64]
    assert not response.outputs[0].HasField("contents")


# --- message size ------------------------------------------------------------------------


def test_messages_over_grpc_max_message_size_are_resource_exhausted_both_ways(
    serve: Any, tmp_path: Path
) -> None:
    write_mlp(tmp_path / "mlp.onnx")
    write_mlp(tmp_path / "wide.onnx", dims=(16, 128))  # outputs 8 times its inputs' size
    daemon = serve("""
[[models]]
name = "mlp"
path = "mlp.onnx"

[[models]]
name = "wide"
path = "wide.onnx"
""", env={"SNOOZE_GRPC_MAX_MESSAGE_SIZE": "64KiB"})
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        small_stub = pb_grpc.GRPCInferenceServiceStub(channel)
        fits = np.zeros((200, 64), np.float32)  # 51,200 bytes each way

        def answer_fits() -> None:
            response = small_stub.ModelInfer(mlp_raw(fits), timeout=60)
            assert outputs_of(response)["y"].shape == (200, 64)

        answer_fits()

        too_big = rejection(small_stub, mlp_raw(np.zeros((300, 64), np.float32)))  # 76,800
        assert too_big.code() == Code.RESOURCE_EXHAUSTED
        answer_fits()

        # 12,800 bytes in, 102,400 bytes out: the request fits, its response does not.
        wide = Request(model_name="wide")
        wide.inputs.add(name="x", datatype="FP32", shape=[200, 16])
        wide.raw_input_contents.append(np.zeros((200, 16), "<f4").tobytes())
        too_big = rejection(small_stub, wide)
        assert too_big.code() == Code.RESOURCE_EXHAUSTED
        assert "grpc_max_message_size" in (too_big.details() or "")  # ours, not grpcio's
        answer_fits()
