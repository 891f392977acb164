"""gRPC messages into the engine's requests: what api/grpc/codec.py decodes."""

from __future__ import annotations

import pytest

from snoozeml.api.grpc.codec import decode_grpc_request
from snoozeml.errors import InvalidInput
from snoozeml.proto import inference_pb2 as pb


def request_with_output(**parameter: object) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    output = request.outputs.add(name="y")
    if parameter:
        output.parameters["classification"].CopyFrom(pb.InferParameter(**parameter))
    return request


@pytest.mark.parametrize("parameter", [{"int64_param": 3}, {"uint64_param": 3}])
def test_a_classification_parameter_becomes_the_requested_outputs_k(
    parameter: dict[str, int],
) -> None:
    decoded = decode_grpc_request(request_with_output(**parameter))

    assert decoded.outputs is not None
    assert [(o.name, o.classification) for o in decoded.outputs] == [("y", 3)]
    plain = decode_grpc_request(request_with_output()).outputs
    assert plain is not None
    assert plain[0].classification is None


@pytest.mark.parametrize(("parameter", "shown"), [
    ({"int64_param": 0}, "0"), ({"int64_param": -1}, "-1"), ({"bool_param": True}, "True"),
    ({"double_param": 2.0}, "2.0"), ({"string_param": "2"}, "'2'"), ({}, "None"),
])
def test_a_classification_parameter_that_is_no_count_is_invalid_argument(
    parameter: dict[str, object], shown: str,
) -> None:
    request = request_with_output()
    request.outputs[0].parameters["classification"].CopyFrom(pb.InferParameter(**parameter))

    with pytest.raises(InvalidInput) as refused:
        decode_grpc_request(request)

    assert str(refused.value) == ("output 'y': parameter 'classification' must be an integer "
                                  f"of at least 1 (how many classes to return), got {shown}")
