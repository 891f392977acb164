"""The JSON tensor codec: OIP request bodies to numpy, and numpy back to JSON response bodies."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from snoozeml.api.codec import decode_json_request, encode_http_response
from snoozeml.engine.requests.request import InferOutput, InferResponse
from snoozeml.errors import InvalidInput


def body(*inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"inputs": list(inputs), **extra}


def tensor(name: str = "x", shape: Any = (2, 2), datatype: Any = "FP32",
           data: Any = ((1, 2), (3, 4))) -> dict[str, Any]:
    # Tuples become lists, as they would arrive from JSON.
    def lists(value: Any) -> Any:
        return [lists(v) for v in value] if isinstance(value, tuple | list) else value

    return {"name": name, "shape": lists(shape), "datatype": datatype, "data": lists(data)}


def refused(doc: object) -> str:
    with pytest.raises(InvalidInput) as info:
        decode_json_request(doc)
    return str(info.value)


# --- decoding good requests ------------------------------------------------------------------


def test_nested_and_flat_data_decode_to_the_same_array() -> None:
    nested = decode_json_request(body(tensor(data=[[1, 2], [3, 4]])))
    flat = decode_json_request(body(tensor(data=[1, 2, 3, 4])))
    expected = np.array([[1, 2], [3, 4]], dtype=np.float32)
    for request in (nested, flat):
        (tensor_in,) = request.inputs
        assert tensor_in.name == "x"
        assert tensor_in.datatype == "FP32"
        assert tensor_in.shape == (2, 2)
        assert tensor_in.data.dtype == np.float32
        np.testing.assert_array_equal(tensor_in.data, expected)


@pytest.mark.parametrize(
    ("datatype", "data", "dtype"),
    [
        ("BOOL", [True, False], np.bool_),
        ("UINT8", [0, 255], np.uint8),
        ("UINT16", [0, 65535], np.uint16),
        ("UINT32", [0, 2**32 - 1], np.uint32),
        ("UINT64", [0, 2**64 - 1], np.uint64),
        ("UINT64", [[2**63], [2**64 - 1]], np.uint64),
        ("INT8", [-128, 127], np.int8),
        ("INT16", [-(2**15), 2**15 - 1], np.int16),
        ("INT32", [-(2**31), 2**31 - 1], np.int32),
        ("INT64", [-(2**63), 2**63 - 1], np.int64),
        ("FP16", [0.5, -2.0], np.float16),
        ("FP32", [0.5, 3], np.float32),  # integers are fine for a float type
        ("FP64", [0.1, -1e300], np.float64),
    ],
)
def test_each_numeric_datatype_decodes_to_its_numpy_dtype_at_its_limits(
    datatype: str, data: list[Any], dtype: type
) -> None:
    (tensor_in,) = decode_json_request(body(tensor(shape=[2], datatype=datatype, data=data))).inputs
    assert tensor_in.data.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(tensor_in.data, np.array(data, dtype=dtype).reshape(-1))


def test_bytes_decode_to_an_object_array_of_utf8_bytes() -> None:
    request = decode_json_request(body(tensor(shape=[2, 1], datatype="BYTES",
                                              data=[["héllo"], [""]])))
    (tensor_in,) = request.inputs
    assert tensor_in.data.dtype == np.dtype(object)
    assert tensor_in.data.shape == (2, 1)
    assert tensor_in.data.reshape(-1).tolist() == ["héllo".encode(), b""]


def test_base64_bytes_decode_to_the_bytes_they_encode() -> None:
    """MLServer's convention: the input's content_type parameter says the strings are base64."""
    raw = {"name": "image", "shape": [2], "datatype": "BYTES", "data": ["AAEC/w==", ""],
           "parameters": {"content_type": "base64"}}
    (tensor,) = decode_json_request({"inputs": [raw]}).inputs
    assert list(tensor.data) == [b"\x00\x01\x02\xff", b""]
    plain = decode_json_request({"inputs": [{**raw, "parameters": {}}]}).inputs[0]
    assert list(plain.data) == [b"AAEC/w==", b""]


@pytest.mark.parametrize("bad", ["AAEC/w=", "AAEC*w==", "AA EC/w=="])
def test_invalid_base64_is_refused_naming_the_element(bad: str) -> None:
    raw = {"name": "image", "shape": [2], "datatype": "BYTES", "data": ["AAEC", bad],
           "parameters": {"content_type": "base64"}}
    with pytest.raises(InvalidInput, match="input 'image': element 1 is not valid base64"):
        decode_json_request({"inputs": [raw]})


def test_scalar_data_fills_a_one_element_tensor() -> None:
    (tensor_in,) = decode_json_request(body(tensor(shape=[1], data=7))).inputs
    np.testing.assert_array_equal(tensor_in.data, np.array([7], dtype=np.float32))


def test_empty_batch_is_allowed_when_the_shape_says_zero_rows() -> None:
    (tensor_in,) = decode_json_request(body(tensor(shape=[0, 4], data=[]))).inputs
    assert tensor_in.data.shape == (0, 4)


def test_id_parameters_and_requested_outputs_are_kept() -> None:
    request = decode_json_request(body(
        tensor() | {"parameters": {"note": "x"}},
        id="req-42",
        parameters={"priority": 1},
        outputs=[{"name": "y"}, {"name": "z", "parameters": {"binary_data": False}}],
    ))
    assert request.id == "req-42"
    assert request.parameters == {"priority": 1}
    assert request.inputs[0].parameters == {"note": "x"}
    assert request.outputs is not None
    assert [o.name for o in request.outputs] == ["y", "z"]
    assert request.outputs[1].parameters == {"binary_data": False}


def test_absent_or_empty_outputs_mean_every_output() -> None:
    assert decode_json_request(body(tensor())).outputs is None
    assert decode_json_request(body(tensor(), outputs=[])).outputs is None


# --- decoding bad requests: every one names what is wrong ------------------------------------


@pytest.mark.parametrize(
    "doc",
    [{}, {"inputs": []}, {"inputs": {"x": 1}}, {"inputs": None}],
    ids=["absent", "empty", "object", "null"],
)
def test_missing_inputs_are_refused(doc: dict[str, Any]) -> None:
    assert "'inputs'" in refused(doc)


@pytest.mark.parametrize("doc", [[], "x", 3, None])
def test_a_body_that_is_not_an_object_is_refused(doc: object) -> None:
    assert "JSON object" in refused(doc)


@pytest.mark.parametrize(
    "raw", [{"shape": [1], "datatype": "FP32", "data": [1]}, "x", {"name": 3}]
)
def test_an_input_without_a_string_name_is_refused_by_position(raw: object) -> None:
    assert "inputs[0]" in refused({"inputs": [raw]})


@pytest.mark.parametrize(
    "shape", [None, "2,2", [2, -1], [2.0, 2], [True, 4], [[2], [2]]],
    ids=["absent", "string", "negative", "float", "bool", "nested"],
)
def test_a_bad_shape_is_refused_naming_the_input(shape: Any) -> None:
    message = refused(body({"name": "pixels", "shape": shape, "datatype": "FP32", "data": [1]}))
    assert "input 'pixels'" in message
    assert "'shape'" in message


@pytest.mark.parametrize("datatype", ["FLOAT32", "fp32", None, 5])
def test_an_unknown_datatype_is_refused_naming_the_input_and_the_choices(datatype: Any) -> None:
    message = refused(body(tensor(name="pixels", datatype=datatype)))
    assert "input 'pixels'" in message
    assert "unknown datatype" in message
    assert "FP32" in message


def test_an_input_without_data_is_refused() -> None:
    raw = tensor(name="pixels")
    del raw["data"]
    assert refused(body(raw)) == "input 'pixels' has no 'data'"


@pytest.mark.parametrize(
    ("shape", "data", "needs", "has"),
    [([2, 2], [1, 2, 3], 4, 3), ([3], [[1, 2], [3, 4]], 3, 4), ([2, 0], [1], 0, 1)],
)
def test_an_element_count_not_equal_to_the_shape_product_is_refused(
    shape: list[int], data: list[Any], needs: int, has: int
) -> None:
    message = refused(body(tensor(name="pixels", shape=shape, data=data)))
    assert message == f"input 'pixels': shape {shape} needs {needs} elements, data has {has}"


def test_an_element_count_mismatch_is_refused_for_bytes_too() -> None:
    message = refused(body(tensor(name="text", shape=[3], datatype="BYTES", data=["a", "b"])))
    assert "input 'text'" in message
    assert "needs 3 elements, data has 2" in message


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("FP32", ["one", "two"], "data for FP32 must be numbers"),
        ("FP32", [1.0, None], "data for FP32 must be numbers"),
        ("FP32", [True, False], "data for FP32 must be numbers"),
        ("FP64", [{"v": 1}, 2], "data for FP64 must be numbers"),
        ("INT64", [1.5, 2.0], "data for INT64 must be integers"),
        ("INT64", ["1", "2"], "data for INT64 must be integers"),
        ("INT32", [True, False], "data for INT32 must be integers"),
        ("UINT8", [255, 256], "a value is out of range for UINT8"),
        ("UINT8", [-1, 0], "a value is out of range for UINT8"),
        ("INT8", [127, 128], "a value is out of range for INT8"),
        ("INT64", [1, 2**70], "a value is out of range for INT64"),
        ("UINT64", [1, 2**64], "a value is out of range for UINT64"),
        ("UINT64", [2**64 - 1, None], "data for UINT64 must be integers"),
        ("BOOL", [1, 0], "data for BOOL must be true/false"),
        ("BYTES", [1, 2], "data for BYTES must be strings"),
        ("BYTES", ["a", None], "data for BYTES must be strings"),
    ],
)
def test_data_of_the_wrong_kind_is_refused_naming_the_input(
    datatype: str, data: list[Any], expected: str
) -> None:
    message = refused(body(tensor(name="col", shape=[2], datatype=datatype, data=data)))
    assert message == f"input 'col': {expected}"


def test_ragged_data_is_refused_naming_the_input() -> None:
    message = refused(body(tensor(name="pixels", shape=[2, 2], data=[[1, 2], [3]])))
    assert message.startswith("input 'pixels': data must be a (nested) list of FP32 values")


def test_bf16_has_no_json_form() -> None:
    message = refused(body(tensor(name="w", shape=[1], datatype="BF16", data=[1.0])))
    assert "input 'w'" in message
    assert "binary" in message


def test_the_second_bad_input_is_named_not_the_first_good_one() -> None:
    message = refused(body(tensor(name="good"), tensor(name="bad", data=[1, 2])))
    assert message.startswith("input 'bad'")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"id": 42}, "'id' must be a string"),
        ({"outputs": "y"}, "'outputs' must be a list"),
        ({"outputs": [{"nome": "y"}]}, "outputs[0] must be an object with a string 'name'"),
        ({"parameters": [1]}, "request: 'parameters' must be an object"),
    ],
)
def test_malformed_request_fields_are_refused(extra: dict[str, Any], expected: str) -> None:
    assert expected in refused(body(tensor(), **extra))


def test_malformed_input_parameters_are_refused_naming_the_input() -> None:
    message = refused(body(tensor(name="pixels") | {"parameters": "fast"}))
    assert message == "input 'pixels': 'parameters' must be an object"


# --- encoding responses ------------------------------------------------------------------------


def wire(response: InferResponse) -> Any:
    """The JSON response body as a client receives it."""
    body, header_length = encode_http_response(response)
    assert header_length is None  # all JSON: no binary part follows
    return orjson.loads(body)


def test_response_carries_model_id_and_flat_row_major_data() -> None:
    y = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    response = InferResponse("mlp", "1", [InferOutput("y", "FP32", (2, 3), y)], id="req-7")
    assert wire(response) == {
        "model_name": "mlp",
        "model_version": "1",
        "id": "req-7",
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2, 3],
                     "data": [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]}],
    }


def test_response_without_id_or_parameters_omits_them() -> None:
    response = InferResponse("m", "1", [InferOutput("y", "INT64", (1,), np.array([3]))])
    doc = wire(response)
    assert "id" not in doc
    assert "parameters" not in doc


def test_response_parameters_are_passed_through() -> None:
    response = InferResponse("m", "1", [], parameters={"sequence_end": True})
    assert wire(response)["parameters"] == {"sequence_end": True}


@pytest.mark.parametrize(
    ("datatype", "array", "data"),
    [
        ("BOOL", np.array([[True], [False]]), [True, False]),
        ("INT64", np.array([[-(2**63)], [2**63 - 1]], dtype=np.int64), [-(2**63), 2**63 - 1]),
        ("UINT8", np.array([[0], [255]], dtype=np.uint8), [0, 255]),
        ("FP16", np.array([[0.5], [-2.0]], dtype=np.float16), [0.5, -2.0]),
        ("FP64", np.array([[0.1], [1e300]]), [0.1, 1e300]),
        ("BYTES", np.array([[b"h\xc3\xa9"], [b""]], dtype=object), ["hé", ""]),
    ],
)
def test_each_datatype_encodes_to_json_values(
    datatype: str, array: np.ndarray, data: list[Any]
) -> None:
    response = InferResponse("m", "1", [InferOutput("out", datatype, array.shape, array)])
    (out,) = wire(response)["outputs"]
    assert out == {"name": "out", "datatype": datatype, "shape": [2, 1], "data": data}


def test_non_contiguous_outputs_encode_in_row_major_order() -> None:
    transposed = np.arange(6, dtype=np.int32).reshape(2, 3).T  # shape (3, 2), Fortran order
    response = InferResponse("m", "1", [InferOutput("t", "INT32", (3, 2), transposed)])
    assert wire(response)["outputs"][0]["data"] == [0, 3, 1, 4, 2, 5]


# --- the classification extension's parameter ------------------------------------------------


def test_a_classification_parameter_becomes_the_requested_outputs_k() -> None:
    request = decode_json_request(body(tensor(), outputs=[
        {"name": "y", "parameters": {"classification": 3, "binary_data": True}},
        {"name": "z"}]))

    assert request.outputs is not None
    assert [(o.name, o.classification) for o in request.outputs] == [("y", 3), ("z", None)]


@pytest.mark.parametrize("k", [0, -2, 1.5, 2.0, True, "2", None])
def test_a_classification_parameter_that_is_no_count_is_refused(k: object) -> None:
    doc = body(tensor(), outputs=[{"name": "y", "parameters": {"classification": k}}])

    assert refused(doc) == ("output 'y': parameter 'classification' must be an integer of at "
                            f"least 1 (how many classes to return), got {k!r}")
