"""One tensor codec: Open Inference Protocol tensors (JSON and binary) <-> numpy arrays.

Decoding checks what can be checked without the model (known datatype, shape well formed,
element count, data of the right kind); engine/requests/validate.py checks the rest against the
model.
Every problem is an InvalidInput naming the tensor.
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from snoozeml.api.binary import array_to_raw, raw_to_array
from snoozeml.datatypes import OIP_TO_NUMPY
from snoozeml.engine.requests.classification import PARAMETER, class_count
from snoozeml.engine.requests.request import (
    InferInput,
    InferRequest,
    InferResponse,
    Parameters,
    RequestedOutput,
)
from snoozeml.errors import InvalidInput, Unsupported

_INT_KINDS = "iu"
_FLOAT_KINDS = "iuf"


# --- request ------------------------------------------------------------------------------


def _parameters(value: object, where: str) -> Parameters:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{where}: 'parameters' must be an object")
    return value


MAX_RANK = 32
MAX_ELEMENTS = 2**40


def parse_shape(value: object, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise InvalidInput(
            f"input {name!r}: 'shape' must be a list of non-negative integers, got {value!r}"
        )
    if len(value) > MAX_RANK:
        raise InvalidInput(f"input {name!r}: shape has {len(value)} dimensions; at most {MAX_RANK}")
    # A dimension of 0 makes any shape hold no data, so the size limits on the body do not bound
    # the others: [2**62, 0] would still be an array numpy cannot describe.
    if math.prod(d or 1 for d in value) > MAX_ELEMENTS:
        raise InvalidInput(f"input {name!r}: shape {value} is too large")
    return tuple(value)


def refuse_shared_memory(parameters: Parameters, where: str) -> None:
    """The shared-memory extension is not offered: say so rather than miss the data."""
    if "shared_memory_region" in parameters:
        raise Unsupported(
            f"{where}: the shared memory extension is not supported; send the data in the request"
        )


def requested_output(name: str, parameters: Parameters) -> RequestedOutput:
    """A requested output as the engine takes it (both transports): the classification
    extension's k decoded, the shared-memory extension refused."""
    refuse_shared_memory(parameters, f"output {name!r}")
    k = class_count(parameters[PARAMETER], name) if PARAMETER in parameters else None
    return RequestedOutput(name, parameters, k)


def parse_datatype(value: object, name: str) -> str:
    if not isinstance(value, str) or value not in OIP_TO_NUMPY:
        raise InvalidInput(
            f"input {name!r}: unknown datatype {value!r}; expected one of {sorted(OIP_TO_NUMPY)}"
        )
    return value


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _wide_ints(name: str, datatype: str, dtype: np.dtype[np.generic], data: Any) -> np.ndarray:
    flat = _flatten(data)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        raise InvalidInput(f"input {name!r}: data for {datatype} must be integers")
    info = np.iinfo(dtype)  # type: ignore[type-var]
    if any(v < info.min or v > info.max for v in flat):
        raise InvalidInput(f"input {name!r}: a value is out of range for {datatype}")
    return np.array(flat, dtype=dtype)


def json_to_array(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """The numpy array for one JSON tensor; `data` may be nested or flat (row-major)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        flat = _flatten(data)
        if not all(isinstance(v, str) for v in flat):
            raise InvalidInput(f"input {name!r}: data for BYTES must be strings")
        array = np.empty(len(flat), dtype=object)
        array[:] = [v.encode("utf-8") for v in flat]
    elif datatype == "BF16":
        raise InvalidInput(
            f"input {name!r}: BF16 has no JSON form; send it with the binary tensor extension"
        )
    else:
        dtype = OIP_TO_NUMPY[datatype]
        try:
            raw = np.asarray(data if isinstance(data, list) else [data])
        except (ValueError, TypeError, OverflowError):
            raise InvalidInput(
                f"input {name!r}: data must be a (nested) list of {datatype} values of equal "
                "length per dimension"
            ) from None
        if raw.dtype.kind in "fO" and dtype.kind in _INT_KINDS:
            # Python ints beyond int64 (UINT64's upper half) make numpy fall back to float64
            # or objects; check the elements themselves instead.
            raw = _wide_ints(name, datatype, dtype, data)
        kind = raw.dtype.kind
        if raw.size and datatype == "BOOL" and kind != "b":
            raise InvalidInput(f"input {name!r}: data for BOOL must be true/false")
        if raw.size and dtype.kind in _INT_KINDS and kind not in _INT_KINDS:
            raise InvalidInput(f"input {name!r}: data for {datatype} must be integers")
        if raw.size and dtype.kind == "f" and kind not in _FLOAT_KINDS:
            raise InvalidInput(f"input {name!r}: data for {datatype} must be numbers")
        if raw.size and dtype.kind in _INT_KINDS:
            info = np.iinfo(dtype)  # type: ignore[type-var]
            if raw.min() < info.min or raw.max() > info.max:
                raise InvalidInput(f"input {name!r}: a value is out of range for {datatype}")
        try:
            with np.errstate(over="raise"):  # 1e39 as FP32 would be inf, with a stray warning
                array = raw.astype(dtype, copy=False).reshape(-1)
        except FloatingPointError:
            raise InvalidInput(f"input {name!r}: a value is out of range for {datatype}") from None
    if array.size != count:
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} needs {count} elements, data has {array.size}"
        )
    return array.reshape(shape)


def base64_elements(name: str, array: np.ndarray) -> np.ndarray:
    """A JSON BYTES tensor whose strings are base64 (the input's `content_type` parameter says
    "base64", as MLServer's requests do), as the bytes they encode."""
    decoded = np.empty(array.size, dtype=object)
    for i, value in enumerate(array.reshape(-1)):
        try:
            decoded[i] = binascii.a2b_base64(value, strict_mode=True)
        except binascii.Error as exc:
            raise InvalidInput(f"input {name!r}: element {i} is not valid base64 ({exc})") from None
    return decoded.reshape(array.shape)


def parse_json(body: bytes | memoryview, *, allow_empty: bool = False) -> Any:
    """A request body as JSON; a 400 that says why when it is not."""
    if allow_empty and not bytes(body).strip():
        return {}
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None


def decode_json_request(doc: object, binary: memoryview | None = None) -> InferRequest:
    """An InferRequest from a parsed JSON body. Inputs carry inline `data`, or (binary tensor
    extension) a `binary_data_size` parameter claiming the next bytes of `binary`, in order."""
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("request needs a non-empty 'inputs' list")
    inputs: list[InferInput] = []
    offset = 0
    for position, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise InvalidInput(f"inputs[{position}] must be an object with a string 'name'")
        name: str = raw["name"]
        shape = parse_shape(raw.get("shape"), name)
        datatype = parse_datatype(raw.get("datatype"), name)
        parameters = _parameters(raw.get("parameters"), f"input {name!r}")
        refuse_shared_memory(parameters, f"input {name!r}")
        size = parameters.get("binary_data_size")
        if size is not None:
            array = _binary_input(name, datatype, shape, size, raw, binary, offset)
            offset += size
        elif "data" not in raw:
            raise InvalidInput(f"input {name!r} has no 'data'")
        else:
            array = json_to_array(name, datatype, shape, raw["data"])
            if datatype == "BYTES" and parameters.get("content_type") == "base64":
                array = base64_elements(name, array)
        inputs.append(InferInput(name, datatype, shape, array, parameters))
    if binary is not None and offset != len(binary):
        raise InvalidInput(
            f"{len(binary) - offset} bytes of binary data follow the JSON header but no input "
            "claims them (check each input's binary_data_size)"
        )
    return InferRequest(
        inputs=inputs,
        outputs=_requested_outputs(doc.get("outputs")),
        id=_request_id(doc.get("id")),
        parameters=_parameters(doc.get("parameters"), "request"),
    )


def _binary_input(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    size: object,
    raw: dict[str, Any],
    binary: memoryview | None,
    offset: int,
) -> np.ndarray:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput(f"input {name!r}: 'binary_data_size' must be a non-negative integer")
    if "data" in raw:
        raise InvalidInput(f"input {name!r} has both 'data' and 'binary_data_size'")
    if binary is None:
        raise InvalidInput(
            f"input {name!r} has 'binary_data_size' but the request has no binary data "
            "(send the Inference-Header-Content-Length header)"
        )
    left = len(binary) - offset
    if size > left:
        raise InvalidInput(
            f"input {name!r}: binary_data_size {size} runs past the end of the binary data "
            f"({left} bytes left)"
        )
    return raw_to_array(name, datatype, shape, binary[offset:offset + size])


def _request_id(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput("'id' must be a string")
    return value


def _requested_outputs(value: object) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
    outputs = []
    for position, raw in enumerate(value):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise InvalidInput(f"outputs[{position}] must be an object with a string 'name'")
        parameters = _parameters(raw.get("parameters"), "output")
        outputs.append(requested_output(raw["name"], parameters))
    return outputs or None


# --- response -----------------------------------------------------------------------------


def array_to_json_data(datatype: str, array: np.ndarray) -> Any:
    """Flat row-major JSON data for a tensor (orjson serialises numpy arrays natively)."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat
        ]
    if datatype == "BF16":
        return (flat.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(flat)


def binary_outputs(request: InferRequest) -> Callable[[str], bool]:
    """Which outputs the client wants as binary: an output's own `binary_data` parameter,
    else the request's `binary_data_output`."""
    default = request.parameters.get("binary_data_output") is True
    explicit: dict[str, bool] = {}
    for output in request.outputs or ():
        flag = output.parameters.get("binary_data")
        if flag is not None:
            explicit[output.name] = flag is True
    return lambda name: explicit.get(name, default)


def encode_http_response(
    response: InferResponse, is_binary: Callable[[str], bool] | None = None
) -> tuple[bytes, int | None]:
    """The HTTP body, and the JSON header's length when binary outputs follow it."""
    body: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id is not None:
        body["id"] = response.id
    if response.parameters:
        body["parameters"] = response.parameters
    blobs: list[bytes] = []
    outputs = []
    for output in response.outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if is_binary is not None and is_binary(output.name):
            raw = array_to_raw(output.datatype, output.data)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = array_to_json_data(output.datatype, output.data)
        outputs.append(entry)
    body["outputs"] = outputs
    header = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)
