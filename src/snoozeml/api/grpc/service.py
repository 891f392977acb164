"""gRPC transport: inference.GRPCInferenceService (OIP v2 + Triton's repository and
statistics RPCs), grpc.health.v1.Health and server reflection, on grpc.aio in the daemon's
event loop.

Like the REST transport it only decodes (api/grpc/codec.py), calls InferenceService and
encodes. Every RPC is tagged with its operation (snoozeml/operations.py) and runs inside the
shared request boundary (api/boundary.py), which decides the status code, the message and the
`retry-after` trailers of a failure.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from snoozeml.api.boundary import Call, RequestBoundary
from snoozeml.api.grpc.codec import (
    Malformed,
    decode_grpc_request,
    encode_grpc_response,
    metadata_proto,
)
from snoozeml.api.repository_params import grpc_parameters, load_parameters
from snoozeml.api.triton_statistics import statistics_proto
from snoozeml.engine.service import InferenceService
from snoozeml.errors import ModelNotFound
from snoozeml.operations import Operation
from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

T = TypeVar("T")
Request = TypeVar("Request")
Response = TypeVar("Response")
Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Request, Context], Awaitable[Response]]

# Messages travel in the trailers, which grpcio clients cap (8 KiB by default); a message that
# repeats a client's 20,000-character model name would turn into RESOURCE_EXHAUSTED. They
# travel percent-encoded: a byte outside printable ASCII takes three, so 2,000 emoji would be
# 24,000 bytes, past even the 16 KiB a client refuses outright.
MAX_MESSAGE = 2000  # characters
MAX_MESSAGE_BYTES = 6000  # percent-encoded


def _encoded_size(text: str) -> int:
    return sum(1 if 0x20 <= byte <= 0x7E and byte != 0x25 else 3
               for byte in text.encode("utf-8", "replace"))


def _fits_trailers(message: str) -> str:
    if len(message) <= MAX_MESSAGE and _encoded_size(message) <= MAX_MESSAGE_BYTES:
        return message
    room = MAX_MESSAGE_BYTES - _encoded_size("…")
    kept = 0
    for char in message[: MAX_MESSAGE - 1]:
        room -= _encoded_size(char)
        if room < 0:
            break
        kept += 1
    return message[:kept] + "…"


def _credentials(context: Context) -> tuple[str | None, str | None]:
    """The call's `authorization` and `x-api-key` metadata (the first of each)."""
    authorization = api_key = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and authorization is None:
            authorization = value if isinstance(value, str) else None
        elif key == "x-api-key" and api_key is None:
            api_key = value if isinstance(value, str) else None
    return authorization, api_key


@asynccontextmanager
async def _ending(call: Call, context: Context, credentials: bool = True) -> AsyncIterator[None]:
    """Check the caller may make `call` (unless `credentials` is off), then end it as the
    RPC's work ends: cancelled (the client left), failed (the RPC is aborted with the
    boundary's answer), or succeeded."""
    try:
        if credentials and call.checks_credentials:
            call.authorize(*_credentials(context))
        yield
    except (asyncio.CancelledError, GeneratorExit):
        call.cancelled()
        raise
    except Exception as exc:  # boundary: one call fails, the daemon keeps serving
        answer = call.failed(exc)
        await context.abort(answer.grpc_code, _fits_trailers(answer.message),
                            trailing_metadata=answer.grpc_trailers())
    else:
        call.succeeded()


def opens_its_own_call(operation: Operation) -> Callable[[T], T]:
    """Tag a streaming handler that begins and ends its Call itself with its operation."""

    def tag(handler: T) -> T:
        handler.operation = operation  # type: ignore[attr-defined]
        return handler

    return tag


def _mesh_id(context: Context) -> str | None:
    """The model id ModelMesh routes the call by (`mm-model-id`, or UTF-8 in
    `mm-model-id-bin`), if the call has one."""
    for key, value in context.invocation_metadata() or ():
        if key == "mm-model-id" and isinstance(value, str):
            return value
        if key == "mm-model-id-bin" and isinstance(value, bytes):
            return value.decode("utf-8", "replace")
    return None


def rpc(
    operation: Operation, model: Callable[[Any], str | None] | None = None,
    mesh_field: str | None = None, credentials: bool = True,
) -> Callable[[Handler[Request, Response]], Handler[Request, Response]]:
    """Run a unary RPC of `operation` inside the request boundary; `model` reads the model's
    name from the request. A call routed by ModelMesh names its model in metadata: the id is
    written into the request's `mesh_field`, as ModelMesh's id injection would. `credentials`
    off: the RPC is not checked against [auth] (ModelMesh's SPI, which sends none)."""

    def decorate(method: Handler[Request, Response]) -> Handler[Request, Response]:
        @functools.wraps(method)
        async def bounded(self: Any, request: Request, context: Context) -> Response:
            malformed = isinstance(request, Malformed)  # no model to name: it did not parse
            if mesh_field is not None and not malformed:
                mesh_id = _mesh_id(context)
                if mesh_id is not None:
                    setattr(request, mesh_field, mesh_id)
            call = self.boundary.begin(operation, "grpc",
                                       (model(request) or None) if model and not malformed
                                       else None)
            async with _ending(call, context, credentials):
                if isinstance(request, Malformed):
                    raise request.error
                reply = await method(self, request, context)
            return reply

        bounded.operation = operation  # type: ignore[attr-defined]
        return bounded

    return decorate


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self, service: InferenceService, boundary: RequestBoundary, max_message_size: int
    ) -> None:
        self.service = service
        self.boundary = boundary
        self.max_message_size = max_message_size

    @rpc(Operation.SERVER_LIVE)
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @rpc(Operation.SERVER_READY)
    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.server_ready())

    @rpc(Operation.MODEL_READY, model=lambda request: request.name, mesh_field="name")
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        ready = self.service.model_ready(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    @rpc(Operation.SERVER_METADATA)
    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        meta = self.service.server_metadata()
        return pb.ServerMetadataResponse(
            name=meta.name, version=meta.version, extensions=list(meta.extensions)
        )

    @rpc(Operation.MODEL_METADATA, model=lambda request: request.name, mesh_field="name")
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        meta = await self.service.model_metadata(request.name, request.version or None)
        return pb.ModelMetadataResponse(
            name=meta.name,
            versions=list(meta.versions),
            platform=meta.platform,
            inputs=[metadata_proto(s) for s in meta.inputs],
            outputs=[metadata_proto(s) for s in meta.outputs],
        )

    @rpc(Operation.INFER, model=lambda request: request.model_name, mesh_field="model_name")
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        decoded = decode_grpc_request(request)
        response = await self.service.infer(
            request.model_name, request.model_version or None, decoded
        )
        return encode_grpc_response(response, self.max_message_size)

    @rpc(Operation.REPOSITORY_INDEX)
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        reply = pb.RepositoryIndexResponse()
        for entry in self.service.index(request.ready):
            reply.models.add(name=entry.name, version=entry.version, state=entry.state,
                             reason=entry.reason)
        return reply

    @rpc(Operation.REPOSITORY_LOAD, model=lambda request: request.model_name)
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        params = load_parameters(grpc_parameters(request.parameters))
        await self.service.load(request.model_name, path=params.path, kind=params.model_type)
        return pb.RepositoryModelLoadResponse()

    @rpc(Operation.REPOSITORY_UNLOAD, model=lambda request: request.model_name)
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        await self.service.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    @rpc(Operation.MODEL_STATS, model=lambda request: request.name, mesh_field="name")
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        # No name: every model.
        return statistics_proto(self.service.statistics(request.name, request.version or None))


_Status = health_pb2.HealthCheckResponse.ServingStatus


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Service "" is the server (NOT_SERVING while draining); a model name is SERVING unless
    that model is FAILED. Check on any other name is NOT_FOUND, Watch streams SERVICE_UNKNOWN
    for it. Watch streams end once the server drains, after their last status."""

    def __init__(self, service: InferenceService, boundary: RequestBoundary) -> None:
        self.service = service
        self.boundary = boundary

    def status(self, name: str) -> int:
        if name == "":
            return int(_Status.SERVING if self.service.server_ready() else _Status.NOT_SERVING)
        try:
            ready = self.service.model_ready(name)
        except ModelNotFound:
            return int(_Status.SERVICE_UNKNOWN)
        return int(_Status.SERVING if ready else _Status.NOT_SERVING)

    @rpc(Operation.HEALTH, model=lambda request: request.service or None)
    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status == _Status.SERVICE_UNKNOWN:  # as grpc.health.v1 says (Watch streams it)
            raise ModelNotFound(f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    @opens_its_own_call(Operation.HEALTH)
    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        malformed = isinstance(request, Malformed)
        call = self.boundary.begin(Operation.HEALTH, "grpc",
                                   None if malformed else request.service or None)
        async with _ending(call, context):
            if isinstance(request, Malformed):
                raise request.error
            await self._watch(request.service, context)

    async def _watch(self, name: str, context: Any) -> None:
        last: int | None = None
        while True:
            changed = self.service.changed()  # taken before reading, so no change is missed
            status = self.status(name)
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


class ReflectionServicer(reflection.aio.ReflectionServicer):  # type: ignore[misc]
    """grpcio's reflection, inside the request boundary like every other RPC."""

    def __init__(self, names: tuple[str, ...], pool: Any, boundary: RequestBoundary) -> None:
        super().__init__(names, pool=pool)
        self.boundary = boundary

    @opens_its_own_call(Operation.REFLECTION)
    async def ServerReflectionInfo(
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        call = self.boundary.begin(Operation.REFLECTION, "grpc")
        async with _ending(call, context):
            requests = _parsed(request_iterator)
            async for response in super().ServerReflectionInfo(requests, context):
                yield response


async def _parsed(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A stream's requests, failing at the first one that did not parse."""
    async for request in requests:
        if isinstance(request, Malformed):
            raise request.error
        yield request
