"""gRPC transport: inference.GRPCInferenceService (OIP v2 + Triton's repository RPCs),
grpc.health.v1.Health and server reflection, on grpc.aio in the daemon's event loop.

Like the REST transport it only decodes, calls InferenceService and encodes. Inputs arrive as
typed `contents` or as `raw_input_contents`; outputs always go back as `raw_output_contents`,
which tritonclient expects.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from snoozeml.api.binary import array_to_raw, raw_to_array
from snoozeml.api.codec import parse_datatype, parse_shape, refuse_shared_memory
from snoozeml.api.errors import grpc_status
from snoozeml.datatypes import OIP_TO_NUMPY, TensorSpec
from snoozeml.engine.lifecycle import State
from snoozeml.engine.manager import InferenceService
from snoozeml.engine.model import describe_exception
from snoozeml.engine.request import InferInput, InferRequest, Parameters, RequestedOutput
from snoozeml.errors import InvalidInput, ModelNotFound, RequestTooLarge, SnoozeError
from snoozeml.logs import log_event
from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

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

Request = TypeVar("Request")
Response = TypeVar("Response")
Context = grpc.aio.ServicerContext[Any, Any]


# --- decoding -----------------------------------------------------------------------------


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
    outputs = []
    for out in request.outputs:
        out_parameters = parameters_from_proto(out.parameters)
        refuse_shared_memory(out_parameters, f"output {out.name!r}")
        outputs.append(RequestedOutput(out.name, out_parameters))
    return InferRequest(
        inputs=inputs,
        outputs=outputs or None,
        id=request.id or None,
        parameters=parameters_from_proto(request.parameters),
    )


def _metadata_proto(spec: TensorSpec) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=spec.name, datatype=spec.datatype, shape=list(spec.shape)
    )


# --- the services -------------------------------------------------------------------------


# Messages travel in the trailers, which grpcio clients cap (8 KiB by default); a message that
# repeats a client's 20,000-character model name would turn into RESOURCE_EXHAUSTED.
MAX_MESSAGE = 2000


def _fits_trailers(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


def boundary(
    method: Callable[[Any, Request, Context], Awaitable[Response]],
) -> Callable[[Any, Request, Context], Awaitable[Response]]:
    """Domain errors become their gRPC code; anything else a logged INTERNAL. The server keeps
    serving either way."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Request, context: Context) -> Response:
        try:
            return await method(self, request, context)
        except SnoozeError as exc:
            code = grpc_status(exc)
            if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE):
                log_event("request_failed", logging.WARNING, rpc=method.__name__,
                          code=code.name, error=exc.message)
            await context.abort(code, _fits_trailers(exc.message))
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log_event("request_failed", logging.ERROR, rpc=method.__name__, code="INTERNAL",
                      error=describe_exception(exc))
            await context.abort(grpc.StatusCode.INTERNAL,
                                _fits_trailers(f"internal error: {describe_exception(exc)}"))
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    return wrapper


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, service: InferenceService, max_message_size: int) -> None:
        self.service = service
        self.max_message_size = max_message_size

    @boundary
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @boundary
    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.server_ready())

    @boundary
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        ready = self.service.model_ready(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    @boundary
    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        meta = self.service.server_metadata()
        return pb.ServerMetadataResponse(
            name=meta["name"], version=meta["version"], extensions=meta["extensions"]
        )

    @boundary
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        meta = await self.service.model_metadata(request.name, request.version or None)
        return pb.ModelMetadataResponse(
            name=meta.name,
            versions=[self.service.model_version],
            platform=meta.platform,
            inputs=[_metadata_proto(s) for s in meta.inputs],
            outputs=[_metadata_proto(s) for s in meta.outputs],
        )

    @boundary
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        decoded = decode_grpc_request(request)
        response = await self.service.infer(
            request.model_name, request.model_version or None, decoded
        )
        reply = pb.ModelInferResponse(
            model_name=response.model_name,
            model_version=response.model_version,
            id=response.id or "",
        )
        for output in response.outputs:
            reply.outputs.add(name=output.name, datatype=output.datatype,
                              shape=list(output.shape))
            reply.raw_output_contents.append(array_to_raw(output.datatype, output.data))
        size = reply.ByteSize()
        if size > self.max_message_size:
            # grpcio would fail the call itself, but with a traceback in our log.
            raise RequestTooLarge(
                f"the response of {size} bytes exceeds grpc_max_message_size "
                f"({self.max_message_size}); request fewer rows or outputs"
            )
        return reply

    @boundary
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        reply = pb.RepositoryIndexResponse()
        for entry in self.service.index(request.ready):
            reply.models.add(name=entry.name, version=entry.version, state=entry.state,
                             reason=entry.reason)
        return reply

    @boundary
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        await self.service.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    @boundary
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        await self.service.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()


_Status = health_pb2.HealthCheckResponse.ServingStatus


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Service "" is the server (NOT_SERVING while draining); a model name is SERVING unless
    that model is FAILED. Check on any other name is NOT_FOUND, Watch streams SERVICE_UNKNOWN
    for it. Watch streams end once the server drains, after their last status."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    def status(self, name: str) -> int:
        if name == "":
            return int(_Status.SERVING if self.service.server_ready() else _Status.NOT_SERVING)
        try:
            state = self.service.manager.get(name).state
        except ModelNotFound:
            return int(_Status.SERVICE_UNKNOWN)
        return int(_Status.NOT_SERVING if state is State.FAILED else _Status.SERVING)

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status == _Status.SERVICE_UNKNOWN:  # as grpc.health.v1 says (Watch streams it)
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                _fits_trailers(f"unknown service {request.service!r}"))
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        last: int | None = None
        while True:
            changed = self.service.changes()  # taken before reading, so no change is missed
            status = self.status(request.service)
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
                # Read again: the state may have changed (a drain may have begun) during the
                # write, and the stream must not end before its last status is sent.
                continue
            if self.service.draining:
                # End the stream: an open Watch would hold the gRPC server's stop for the
                # whole drain_timeout.
                return
            await changed.wait()


def _reflection_pool() -> Any:
    """Our descriptors live in a private pool (see `make proto`); reflection answers from it,
    so the health and reflection services' own files are added there too."""
    pool = pb.DESCRIPTOR.pool
    for file in (health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        try:
            pool.FindFileByName(file.name)
        except KeyError:
            pool.AddSerializedFile(file.serialized_pb)
    return pool


def create_grpc_server(
    service: InferenceService, max_message_size: int
) -> grpc.aio.Server:
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_message_size),
        ("grpc.max_send_message_length", max_message_size),
        ("grpc.so_reuseport", 0),
    ])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        InferenceServicer(service, max_message_size), server
    )
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(service), server)
    names = (
        pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server, pool=_reflection_pool())
    return server
