"""Fuzzing the gRPC transport of a real daemon (issue 15): ModelInferRequests built field by
field (valid ones, valid ones with one or two things broken, and wholly arbitrary ones), and
arbitrary bytes sent as the serialized request of every method.

Every answer is checked against an oracle written from the contract (docs/grpc-api.md), not
from the server's code: a request the contract says must be served gets onnxruntime's own
answer; any other gets a client error (INVALID_ARGUMENT, NOT_FOUND, UNIMPLEMENTED) with a
message, or the documented UNAVAILABLE of a model that can't load, never UNKNOWN or INTERNAL.
After each campaign the daemon is still up, answers a good request, and logged no traceback.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from daemon import Daemon
from fuzz_strategies import (
    BROKEN,
    BYTES_ELEMENTS,
    CONTENTS_FIELDS,
    DATATYPES,
    INT64,
    KINDS,
    MODELS,
    PARAMETER_NAMES,
    UINT64,
    assert_alive,
    assert_same,
    expected_output,
    from_raw,
    fuzz_settings,
    is_utf8,
    log_problems,
    model_name,
    report,
    tensors,
    to_raw,
    write_models,
)
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from hypothesis import given
from hypothesis import strategies as st

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

Code = grpc.StatusCode
Request = pb.ModelInferRequest
CLIENT_ERRORS = {Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.UNIMPLEMENTED}
INFERENCE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
SMALL_RANGES = {"INT8": (-(2**7), 2**7 - 1), "INT16": (-(2**15), 2**15 - 1),
                "UINT8": (0, 2**8 - 1), "UINT16": (0, 2**16 - 1)}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("fuzz_grpc")
    return folder, write_models(folder)


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: tuple[Path, str]) -> Daemon:
    folder, config = models
    return module_serve(config, directory=folder)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def channel(daemon: Daemon) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.grpc_address) as open_channel:
        yield open_channel


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(channel)


# --- the oracle ---------------------------------------------------------------------------


class Refused(Exception):
    """The contract says the daemon must refuse this request with a client error."""


def _contents_array(datatype: str, shape: tuple[int, ...], contents: Any) -> np.ndarray:
    field = KINDS[datatype].field
    if field is None:
        raise Refused(f"{datatype} travels only as raw bytes")
    if any(len(getattr(contents, other)) for other in CONTENTS_FIELDS if other != field):
        raise Refused("data in another contents field")
    values = list(getattr(contents, field))
    if len(values) != math.prod(shape):
        raise Refused("element count")
    if datatype in SMALL_RANGES:
        low, high = SMALL_RANGES[datatype]
        if any(not low <= v <= high for v in values):
            raise Refused("out of range")
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array.reshape(shape)
    return np.array(values, dtype=KINDS[datatype].wire).reshape(shape)


def _raw_array(datatype: str, shape: tuple[int, ...], raw: bytes) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        offset, items = 0, 0
        while offset < len(raw):
            if offset + 4 > len(raw):
                raise Refused("BYTES length cut")
            length = int.from_bytes(raw[offset:offset + 4], "little")
            if offset + 4 + length > len(raw):
                raise Refused("BYTES element past the end")
            offset += 4 + length
            items += 1
        if items != count:
            raise Refused("BYTES element count")
    elif len(raw) != count * np.dtype(KINDS[datatype].wire).itemsize:
        raise Refused("raw size")
    elif datatype == "BOOL" and any(b > 1 for b in raw):
        raise Refused("BOOL byte over 1")
    return from_raw(datatype, list(shape), raw)


def _timeout(request: Request) -> float | None:
    if "timeout" not in request.parameters:
        return None
    parameter = request.parameters["timeout"]
    choice = parameter.WhichOneof("parameter_choice")
    if choice is None:
        return None
    if choice not in ("int64_param", "uint64_param") or getattr(parameter, choice) < 0:
        raise Refused("timeout")
    return int(getattr(parameter, choice)) / 1e6 or None


def _class_count(output: Any, datatype: str) -> int | None:
    """The classification extension's k, when the output asks for it: an int64 or uint64 of at
    least 1, on a numeric output."""
    if "classification" not in output.parameters:
        return None
    parameter = output.parameters["classification"]
    choice = parameter.WhichOneof("parameter_choice")
    if choice not in ("int64_param", "uint64_param") or getattr(parameter, choice) < 1:
        raise Refused("classification count")
    if datatype in ("BOOL", "BYTES"):
        raise Refused("classification of an output that is not numeric")
    return int(getattr(parameter, choice))


def expected_classes(datatype: str, y: np.ndarray, k: int) -> np.ndarray:
    """The contract's classes of `y` [n, 2]: "score:index" (these models have no labels), the
    best first, equal scores by index, NaN last; %f for floats, integers as they are."""
    if datatype == "BF16":
        y = (y.astype(np.uint32) << 16).view(np.float32)
    floats = y.dtype.kind == "f"
    keep = min(k, y.shape[1])
    rows = []
    for row in y.tolist():
        order = sorted(range(len(row)), key=lambda i: (
            floats and math.isnan(row[i]), 0 if floats and math.isnan(row[i]) else -row[i], i))
        rows.append([f"{row[i]:f}:{i}" if floats else f"{row[i]}:{i}" for i in order[:keep]])
    classes = np.empty((len(rows), keep), dtype=object)
    for r, texts in enumerate(rows):
        classes[r, :] = [text.encode() for text in texts]
    return classes


def oracle(request: Request) -> tuple[str, np.ndarray, float | None, int | None]:
    """(datatype, x, timeout in seconds, classification's k) of a request the daemon must
    serve; Refused when it must refuse it. Written from the contract, for the one-input models
    of fuzz_strategies."""
    if request.model_name not in MODELS or request.model_version not in ("", "1"):
        raise Refused("model")
    if len(request.inputs) != 1:
        raise Refused("inputs")
    tensor = request.inputs[0]
    datatype = MODELS[request.model_name]
    shape = tuple(tensor.shape)
    if tensor.name != "x" or tensor.datatype != datatype:
        raise Refused("input name or datatype")
    if len(shape) != 2 or shape[1] != 2 or shape[0] < 0 or shape[0] > 2**40:
        raise Refused("shape")
    if "shared_memory_region" in tensor.parameters:
        raise Refused("shared memory")
    if request.raw_input_contents:
        has_contents = any(len(getattr(tensor.contents, f)) for f in CONTENTS_FIELDS)
        if len(request.raw_input_contents) != 1 or has_contents:
            raise Refused("raw contents")
        x = _raw_array(datatype, shape, request.raw_input_contents[0])
    else:
        x = _contents_array(datatype, shape, tensor.contents)
    if datatype == "BYTES" and not is_utf8(x):
        raise Refused("not UTF-8")
    names = [output.name for output in request.outputs]
    if any(name != "y" for name in names) or len(names) > 1:
        raise Refused("outputs")
    for output in request.outputs:
        if "shared_memory_region" in output.parameters:
            raise Refused("output extension")
    k = _class_count(request.outputs[0], datatype) if request.outputs else None
    return datatype, x, _timeout(request), k


def check_answer(models: Path, request: Request, answer: pb.ModelInferResponse | grpc.RpcError
                 ) -> str:
    """The daemon's answer is the one the oracle expects (onnxruntime's `y`, or a refusal
    that is a client's error with a message); what it was, for the campaign's statistics."""
    try:
        datatype, x, timeout, k = oracle(request)
    except Refused as refused:
        reason = str(refused)
    else:
        reason = ""
    if reason:
        assert isinstance(answer, grpc.RpcError), f"served a request to refuse ({reason})"
        assert_client_error(answer.code(), answer.details() or "")
        return f"refused: {reason}"
    if isinstance(answer, grpc.RpcError):
        queue_timeout = (timeout is not None and answer.code() == Code.UNAVAILABLE
                         and (answer.details() or "").startswith("queue timeout"))
        assert queue_timeout, f"refused a good request: {answer.code()} {answer.details()}"
        return "queue timeout"
    assert (answer.model_name, answer.model_version, answer.id) == \
        (request.model_name, "1", request.id)
    [output] = answer.outputs
    [raw] = answer.raw_output_contents
    if k is not None:
        assert (output.name, output.datatype) == ("y", "BYTES")
        got = from_raw("BYTES", list(output.shape), raw)
        assert_same("BYTES", got, expected_classes(datatype, expected_output(models, datatype,
                                                                             x), k))
        return "classified"
    assert (output.name, output.datatype) == ("y", datatype)
    got = from_raw(datatype, list(output.shape), raw)
    assert_same(datatype, got, expected_output(models, datatype, x))
    return "served"


def assert_client_error(code: Code, details: str) -> None:
    """A client's error with a message, or the documented UNAVAILABLE of the broken model."""
    if code == Code.UNAVAILABLE:
        assert "model 'broken' failed to load" in details
    else:
        assert code in CLIENT_ERRORS, (code, details)
    assert details
    assert not details.startswith("internal error"), details


def infer(stub: pb_grpc.GRPCInferenceServiceStub, request: Request
          ) -> pb.ModelInferResponse | grpc.RpcError:
    try:
        return stub.ModelInfer(request, timeout=60)  # type: ignore[no-any-return]
    except grpc.RpcError as error:
        return error


def assert_unharmed(daemon: Daemon, stub: pb_grpc.GRPCInferenceServiceStub, models: Path,
                    mark: int) -> None:
    """Up, serving a good request, and nothing in the log but documented failures."""
    assert_alive(daemon)
    x = np.array([[0.5, -2.0], [3.0, 1e-3]], np.float32)
    request = Request(model_name=model_name("FP32"))
    request.inputs.add(name="x", datatype="FP32", shape=[2, 2])
    request.raw_input_contents.append(to_raw("FP32", x))
    response = stub.ModelInfer(request, timeout=60)
    check_answer(models, request, response)
    assert log_problems(daemon, mark) == []


# --- strategies ---------------------------------------------------------------------------


@st.composite
def infer_parameters(draw: st.DrawFn) -> pb.InferParameter:
    """Any InferParameter: each oneof choice, or none set."""
    choice = draw(st.sampled_from(["bool", "int64", "string", "double", "uint64", "none"]))
    values: dict[str, st.SearchStrategy[Any]] = {
        "bool": st.booleans(), "int64": INT64, "string": st.text(max_size=10),
        "double": st.floats(), "uint64": UINT64,
    }
    if choice == "none":
        return pb.InferParameter()
    return pb.InferParameter(**{f"{choice}_param": draw(values[choice])})


def parameter_maps(names: st.SearchStrategy[str] = PARAMETER_NAMES
                   ) -> st.SearchStrategy[dict[str, pb.InferParameter]]:
    return st.dictionaries(names, infer_parameters(), max_size=3)


HARMLESS_NAMES = PARAMETER_NAMES.filter(
    lambda n: n not in ("timeout", "shared_memory_region", "classification"))


@st.composite
def valid_requests(draw: st.DrawFn, datatypes: tuple[str, ...] = tuple(DATATYPES)) -> Request:
    """A request the contract says is served (or refused only for BYTES that aren't UTF-8)."""
    datatype = draw(st.sampled_from(datatypes))
    x = draw(tensors(datatype))
    request = Request(model_name=model_name(datatype), model_version=draw(st.sampled_from(
        ["", "1"])), id=draw(st.text(max_size=10)))
    for key, value in draw(parameter_maps(HARMLESS_NAMES)).items():
        request.parameters[key].CopyFrom(value)
    if draw(st.booleans()):
        long_enough = draw(st.sampled_from([0, 60_000_000, 2**63 - 1]))
        request.parameters["timeout"].int64_param = long_enough
    tensor = request.inputs.add(name="x", datatype=datatype, shape=list(x.shape))
    for key, value in draw(parameter_maps(HARMLESS_NAMES)).items():
        tensor.parameters[key].CopyFrom(value)
    field = KINDS[datatype].field
    if field is None or draw(st.booleans()):
        request.raw_input_contents.append(to_raw(datatype, x))
    else:
        getattr(tensor.contents, field).extend(x.ravel().tolist())
    if draw(st.booleans()):
        output = request.outputs.add(name="y")
        for key, value in draw(parameter_maps(HARMLESS_NAMES)).items():
            output.parameters[key].CopyFrom(value)
        if datatype not in ("BOOL", "BYTES") and draw(st.booleans()):
            output.parameters["classification"].int64_param = draw(st.integers(1, 3))
    return request


SHAPES = st.one_of(
    st.lists(st.one_of(st.integers(0, 4), INT64), max_size=4),
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3),
    st.lists(st.integers(0, 1), min_size=30, max_size=40),  # ranks around the limit of 32
    st.tuples(st.integers(2**20, 2**62), st.integers(2**20, 2**62)).map(list),
)


def _contents_values(field: str) -> st.SearchStrategy[list[Any]]:
    elements: dict[str, st.SearchStrategy[Any]] = {
        "bool_contents": st.booleans(),
        "int_contents": st.integers(-(2**31), 2**31 - 1),
        "int64_contents": INT64,
        "uint_contents": st.integers(0, 2**32 - 1),
        "uint64_contents": UINT64,
        "fp32_contents": st.floats(width=32),
        "fp64_contents": st.floats(),
        "bytes_contents": BYTES_ELEMENTS,
    }
    return st.lists(elements[field], max_size=10)


# Names thousands of characters long, which error messages repeat (cheap to draw: repeated).
LONG_TEXT = st.tuples(
    st.text(min_size=1, max_size=3)
    | st.text(st.characters(min_codepoint=0x80, codec="utf-8"), min_size=1, max_size=3),
    st.sampled_from([300, 1000, 3000, 5000]),
).map(lambda text_times: text_times[0] * text_times[1])


# Each mutation breaks (or, now and then, happens to keep) one thing of a valid request.
def _raw_entries(draw: st.DrawFn, request: Request) -> None:
    raw = request.raw_input_contents
    action = draw(st.sampled_from(["add", "drop", "replace", "cut", "extend"]))
    if action == "add" or not raw:
        raw.append(draw(st.binary(max_size=40)))
    elif action == "drop":
        del raw[draw(st.integers(0, len(raw) - 1))]
    elif action == "replace":
        raw[0] = draw(st.binary(max_size=40))
    elif action == "cut":
        raw[0] = raw[0][:draw(st.integers(0, max(len(raw[0]) - 1, 0)))]
    else:
        raw[0] = raw[0] + draw(st.binary(min_size=1, max_size=9))


def _contents(draw: st.DrawFn, request: Request) -> None:
    field = draw(st.sampled_from(CONTENTS_FIELDS))
    getattr(request.inputs[0].contents, field).extend(draw(_contents_values(field)))


def _datatype(draw: st.DrawFn, request: Request) -> None:
    request.inputs[0].datatype = draw(st.one_of(
        st.sampled_from(DATATYPES), st.text(max_size=6),
        st.just(request.inputs[0].datatype.lower())))


def _shape(draw: st.DrawFn, request: Request) -> None:
    del request.inputs[0].shape[:]
    request.inputs[0].shape.extend(draw(SHAPES))


def _input_name(draw: st.DrawFn, request: Request) -> None:
    if draw(st.booleans()):
        request.inputs[0].name = draw(st.text(max_size=8) | LONG_TEXT)
    else:  # the same tensor twice
        request.inputs.append(request.inputs[0])
        if request.raw_input_contents:
            request.raw_input_contents.append(request.raw_input_contents[0])


def _no_inputs(draw: st.DrawFn, request: Request) -> None:
    del request.inputs[:]


def _model(draw: st.DrawFn, request: Request) -> None:
    if draw(st.booleans()):
        request.model_name = draw(st.one_of(st.sampled_from([*MODELS, BROKEN]),
                                            st.text(max_size=30), LONG_TEXT))
    else:
        request.model_version = draw(st.one_of(st.just("2"), st.text(max_size=30), LONG_TEXT))


def _outputs(draw: st.DrawFn, request: Request) -> None:
    for _ in range(draw(st.integers(1, 3))):
        output = request.outputs.add(name=draw(st.sampled_from(["y", "x", "", "z"])))
        for key, value in draw(parameter_maps()).items():
            output.parameters[key].CopyFrom(value)


def _parameters(draw: st.DrawFn, request: Request) -> None:
    target = request.parameters if draw(st.booleans()) else request.inputs[0].parameters
    for key, value in draw(parameter_maps()).items():
        target[key].CopyFrom(value)


def _values(draw: st.DrawFn, request: Request) -> None:
    """Values out of range for the datatype: a BOOL byte over 1, an INT8 of 300."""
    tensor = request.inputs[0]
    if request.raw_input_contents and request.raw_input_contents[0]:
        raw = bytearray(request.raw_input_contents[0])
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(2, 255))
        request.raw_input_contents[0] = bytes(raw)
    elif len(tensor.contents.int_contents):
        tensor.contents.int_contents[0] = draw(st.integers(-(2**31), 2**31 - 1))
    elif len(tensor.contents.uint_contents):
        tensor.contents.uint_contents[0] = draw(st.integers(0, 2**32 - 1))


MUTATIONS: list[Callable[[st.DrawFn, Request], None]] = [
    _raw_entries, _contents, _datatype, _shape, _input_name, _no_inputs, _model, _outputs,
    _parameters, _values,
]


@st.composite
def mutated_requests(draw: st.DrawFn, datatypes: tuple[str, ...] = tuple(DATATYPES)
                     ) -> Request:
    request = draw(valid_requests(datatypes))
    for mutate in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=2)):
        if request.inputs or mutate in (_model, _outputs, _no_inputs):
            mutate(draw, request)
    return request


@st.composite
def arbitrary_requests(draw: st.DrawFn) -> Request:
    """Every field of ModelInferRequest, anything the proto allows."""
    request = Request(
        model_name=draw(st.sampled_from([*MODELS, BROKEN]) | st.text(max_size=20)
                        if draw(st.integers(0, 4)) == 0 else st.sampled_from([*MODELS])),
        model_version=draw(st.sampled_from(["", "1", "2"]) | st.text(max_size=5)
                           if draw(st.integers(0, 4)) == 0 else st.sampled_from(["", "1"])),
        id=draw(st.text(max_size=10)),
    )
    for key, value in draw(parameter_maps()).items():
        request.parameters[key].CopyFrom(value)
    own = MODELS.get(request.model_name, "FP32")
    for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2, 3]))):
        tensor = request.inputs.add(
            name=draw(st.one_of(st.just("x"), st.just("x"), st.text(max_size=5))),
            datatype=draw(st.one_of(st.just(own), st.sampled_from(DATATYPES),
                                    st.text(max_size=6))),
            shape=draw(SHAPES),
        )
        for key, value in draw(parameter_maps()).items():
            tensor.parameters[key].CopyFrom(value)
        for field in draw(st.lists(st.sampled_from(CONTENTS_FIELDS), max_size=2)):
            getattr(tensor.contents, field).extend(draw(_contents_values(field)))
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(name=draw(st.one_of(st.just("y"), st.text(max_size=5))))
        for key, value in draw(parameter_maps()).items():
            output.parameters[key].CopyFrom(value)
    request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=40), max_size=3)))
    return request


# --- ModelInfer, field by field ----------------------------------------------------------


def test_valid_generated_requests_answer_like_onnxruntime(
    daemon: Daemon, stub: pb_grpc.GRPCInferenceServiceStub, models: tuple[Path, str]
) -> None:
    folder, _ = models
    mark = daemon.mark()
    outcomes: Counter[str] = Counter()

    @fuzz_settings(250)
    @given(request=valid_requests())
    def campaign(request: Request) -> None:
        outcomes[check_answer(folder, request, infer(stub, request))] += 1

    campaign()
    report(outcomes)
    assert_unharmed(daemon, stub, folder, mark)


def test_broken_and_arbitrary_requests_get_a_client_error_or_the_right_answer(
    daemon: Daemon, stub: pb_grpc.GRPCInferenceServiceStub, models: tuple[Path, str]
) -> None:
    folder, _ = models
    mark = daemon.mark()
    outcomes: Counter[str] = Counter()

    @fuzz_settings(500)
    @given(request=st.one_of(mutated_requests(), arbitrary_requests()))
    def campaign(request: Request) -> None:
        outcomes[check_answer(folder, request, infer(stub, request))] += 1

    campaign()
    report(outcomes)
    assert_unharmed(daemon, stub, folder, mark)


@st.composite
def concurrent_requests(draw: st.DrawFn) -> list[Request]:
    """Requests for one model at once, so that they share batches; some of them broken."""
    datatype = (draw(st.sampled_from(DATATYPES)),)
    return draw(st.lists(valid_requests(datatype) | mutated_requests(datatype),
                         min_size=2, max_size=8))


def test_requests_sent_together_each_get_their_own_answer(
    daemon: Daemon, stub: pb_grpc.GRPCInferenceServiceStub, models: tuple[Path, str]
) -> None:
    folder, _ = models
    mark = daemon.mark()
    outcomes: Counter[str] = Counter()

    with ThreadPoolExecutor(8) as pool:

        @fuzz_settings(80)
        @given(requests=concurrent_requests())
        def campaign(requests: list[Request]) -> None:
            answers = list(pool.map(lambda request: infer(stub, request), requests))
            for request, answer in zip(requests, answers, strict=True):
                outcomes[check_answer(folder, request, answer)] += 1

        campaign()
    report(outcomes)
    assert_unharmed(daemon, stub, folder, mark)


# --- arbitrary bytes on every method -----------------------------------------------------

UNARY_METHODS = [f"/{INFERENCE.full_name}/{method.name}" for method in INFERENCE.methods]
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
ALL_METHODS = [*UNARY_METHODS, HEALTH_CHECK, HEALTH_WATCH, REFLECTION]
# Request messages whose serialized form starts the mutated byte strings.
SEEDS = [
    Request(model_name="dt_fp32", inputs=[Request.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 2])], raw_input_contents=[b"\x00" * 8]),
    pb.ModelMetadataRequest(name="dt_bytes", version="1"),
    health_pb2.HealthCheckRequest(service="dt_int64"),
    reflection_pb2.ServerReflectionRequest(list_services=""),
]


def _identity(data: bytes) -> bytes:
    return data


def send_bytes(channel: grpc.Channel, method: str, payload: bytes) -> tuple[Code, str]:
    """Send `payload` as the serialized request of `method`; the code and details of the
    first answer (a streaming method's first message counts as OK)."""
    try:
        if method == HEALTH_WATCH:
            call = channel.unary_stream(method, request_serializer=_identity,
                                        response_deserializer=_identity)
            stream = call(payload, timeout=60)
            next(stream)
            stream.cancel()
        elif method == REFLECTION:
            call = channel.stream_stream(method, request_serializer=_identity,
                                         response_deserializer=_identity)
            stream = call(iter([payload]), timeout=60)
            next(stream)
            stream.cancel()
        else:
            call = channel.unary_unary(method, request_serializer=_identity,
                                       response_deserializer=_identity)
            call(payload, timeout=60)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return Code.OK, ""


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """Random bytes, or a real request's bytes cut, spliced or with bytes changed."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=120))
    data = bytearray(draw(st.sampled_from(SEEDS)).SerializeToString())
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["cut", "insert", "change"]))
        if action == "cut":
            del data[at:]
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=6))
        elif data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
    return bytes(data)


def test_arbitrary_bytes_on_every_method_get_a_clear_answer(
    daemon: Daemon, channel: grpc.Channel, stub: pb_grpc.GRPCInferenceServiceStub,
    models: tuple[Path, str],
) -> None:
    folder, _ = models
    mark = daemon.mark()
    outcomes: Counter[str] = Counter()

    @fuzz_settings(400)
    @given(method=st.sampled_from(ALL_METHODS), payload=payloads())
    def campaign(method: str, payload: bytes) -> None:
        code, details = send_bytes(channel, method, payload)
        outcomes[f"{method.rsplit('/', 1)[-1]}: {code.name}"] += 1
        if code != Code.OK:
            assert_client_error(code, details)

    campaign()
    report(outcomes)
    assert_unharmed(daemon, stub, folder, mark)


# --- what the campaigns found, kept as plain regression tests ----------------------------


@pytest.mark.parametrize("payload", [b"\x00", b"\xff\xff\xff"])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_bytes_that_are_no_protobuf_message_are_invalid_argument(
    daemon: Daemon, channel: grpc.Channel, stub: pb_grpc.GRPCInferenceServiceStub,
    models: tuple[Path, str], method: str, payload: bytes,
) -> None:
    """Found by the bytes campaign (b"\\x00" to ServerLive): grpcio answered a request that
    did not parse UNKNOWN, with its traceback in the log; the reflection stream, INTERNAL."""
    mark = daemon.mark()

    code, details = send_bytes(channel, method, payload)

    assert code == Code.INVALID_ARGUMENT
    assert details.startswith("the request is not a valid ")
    assert_unharmed(daemon, stub, models[0], mark)


@pytest.mark.parametrize("name", ["😀" * 3000, "Ď" * 3000, "\x00" * 5000])
def test_an_error_naming_a_long_model_name_fits_the_clients_trailer_limit(
    daemon: Daemon, stub: pb_grpc.GRPCInferenceServiceStub, models: tuple[Path, str],
    name: str,
) -> None:
    """Found by the ModelInfer campaign (a model name of 3,000 "Ď"): the message was cut at
    2,000 characters, but travels percent-encoded, 12 KB, past what the client takes; it saw
    RESOURCE_EXHAUSTED ("received metadata size exceeds ... limit") instead of NOT_FOUND."""
    request = Request(model_name=name)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(b"\x00" * 8)

    error = infer(stub, request)

    assert isinstance(error, grpc.RpcError)
    assert error.code() == Code.NOT_FOUND
    assert (error.details() or "").startswith("unknown model " + repr(name)[:20])
    assert (error.details() or "").endswith("…")
