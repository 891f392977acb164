"""gRPC messages <-> the engine's requests and responses: typed `contents` or
`raw_input_contents` in, `raw_output_contents` out (what tritonclient expects)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from snoozeml.api.binary import array_to_raw, raw_to_array
from snoozeml.api.codec import (
    parse_datatype,
    parse_shape,
    refuse_shared_memory,
    requested_output,
)
from snoozeml.datatypes import OIP_TO_NUMPY, TensorSpec
from snoozeml.engine.requests.request import (
    InferInput,
    InferRequest,
    InferResponse,
    Parameters,
)
from snoozeml.errors import InvalidInput, RequestTooLarge
from snoozeml.proto import inference_pb2 as pb

# Which typed-contents field carries each datatype (FP16 and BF16 travel only as raw bytes).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_ALL_FIELDS = tuple(sorted(set(CONTENTS_FIELD.values())))


class Malformed:
    """What a request that is no valid message parses to: handed to the servicer in its
    place, so that it is answered INVALID_ARGUMENT inside the request boundary. grpcio answers
    an exception of the deserializer UNKNOWN, and logs its traceback."""

    __slots__ = ("error",)

    def __init__(self, error: InvalidInput) -> None:
        self.error = error


def parse_or_malformed(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`parse` (a message class's FromString), returning Malformed for bytes that are not
    such a message."""
    message_class = getattr(parse, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    what = f"{descriptor.full_name} message" if descriptor is not None else "protobuf message"

    def parse_request(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return Malformed(InvalidInput(
                f"the request is not a valid {what} ({len(data)} bytes that do not parse)"))

    return parse_request


def parameters_from_proto(params: Mapping[str, Any]) -> Parameters:
    decoded: Parameters = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        decoded[key] = getattr(value, choice) if choice else None
    return decoded


def _has_contents(tensor: Any) -> bool:
    return tensor.HasField("contents") and any(
        len(getattr(tensor.contents, f)) for f in _ALL_FIELDS
    )


def contents_to_array(
    name: str, datatype: str, shape: tuple[int, ...], contents: Any
) -> np.ndarray:
    """The numpy array for one tensor's typed `contents`."""
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"input {name!r}: {datatype} travels only in raw_input_contents")
    for other in _ALL_FIELDS:
        if other != field and len(getattr(contents, other)):
            raise InvalidInput(
                f"input {name!r}: {datatype} data belongs in contents.{field}, "
                f"not contents.{other}"
            )
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} needs {count} elements, "
            f"contents.{field} has {len(values)}"
        )
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = OIP_TO_NUMPY[datatype]
    if field in ("int_contents", "uint_contents") and dtype.itemsize < 4 and count:
        wide = np.array(values, dtype=np.int64)
        info = np.iinfo(dtype)  # type: ignore[type-var]
        if wide.min() < info.min or wide.max() > info.max:
            raise InvalidInput(f"input {name!r}: a value is out of range for {datatype}")
        return wide.astype(dtype).reshape(shape)
    return np.array(values, dtype=dtype).reshape(shape)


def decode_grpc_request(request: pb.ModelInferRequest) -> InferRequest:
    if not request.inputs:
        raise InvalidInput("request needs at least one input")
    raw_contents = request.raw_input_contents
    if raw_contents and len(raw_contents) != len(request.inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(raw_contents)} entries for {len(request.inputs)} "
            "inputs; there must be one per input, in order"
        )
    inputs = []
    for position, tensor in enumerate(request.inputs):
        name = tensor.name
        datatype = parse_datatype(tensor.datatype, name)
        shape = parse_shape(list(tensor.shape), name)
        parameters = parameters_from_proto(tensor.parameters)
        refuse_shared_memory(parameters, f"input {name!r}")
        if raw_contents:
            if _has_contents(tensor):
                raise InvalidInput(
                    f"input {name!r} sets contents while the request uses raw_input_contents; "
                    "use one or the other"
                )
            array = raw_to_array(name, datatype, shape, raw_contents[position])
        else:
            array = contents_to_array(name, datatype, shape, tensor.contents)
        inputs.append(InferInput(name, datatype, shape, array, parameters))
    outputs = [requested_output(out.name, parameters_from_proto(out.parameters))
               for out in request.outputs]
    return InferRequest(
        inputs=inputs,
        outputs=outputs or None,
        id=request.id or None,
        parameters=parameters_from_proto(request.parameters),
    )


def metadata_proto(spec: TensorSpec) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=spec.name, datatype=spec.datatype, shape=list(spec.shape)
    )


def encode_grpc_response(
    response: InferResponse, max_message_size: int
) -> pb.ModelInferResponse:
    """The reply, every output in raw_output_contents; refused (RESOURCE_EXHAUSTED) over the
    message limit, which grpcio would enforce itself, but with a traceback in our log."""
    reply = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
    )
    for output in response.outputs:
        reply.outputs.add(name=output.name, datatype=output.datatype, shape=list(output.shape))
        reply.raw_output_contents.append(array_to_raw(output.datatype, output.data))
    size = reply.ByteSize()
    if size > max_message_size:
        raise RequestTooLarge(
            f"the response of {size} bytes exceeds grpc_max_message_size "
            f"({max_message_size}); request fewer rows or outputs"
        )
    return reply
