"""gRPC transport of KServe ModelMesh's model-runtime SPI (`mmesh.ModelRuntime`, from
proto/model_runtime.proto) on `[server] modelmesh_port`: each RPC decodes, calls the engine's
MeshRuntime (engine/added/modelmesh.py) and encodes, inside the shared request boundary (its logs,
metrics and error codes). ModelMesh sends no credentials: the port's address is its guard.

Inference for the models it loads arrives on the OIP gRPC port, routed by `mm-model-id`
metadata (api/grpc/service.py); `runtimeStatus`'s method infos make ModelMesh also write the model
id
into the request's name field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from snoozeml.api.boundary import RequestBoundary
from snoozeml.api.grpc.server import ParsedInBoundary, limit_options
from snoozeml.api.grpc.service import Handler, rpc
from snoozeml.config.settings import ServerConfig
from snoozeml.engine.added.modelmesh import MeshRuntime
from snoozeml.engine.service import InferenceService
from snoozeml.errors import ShuttingDown
from snoozeml.operations import Operation
from snoozeml.proto import model_runtime_pb2 as mm
from snoozeml.proto import model_runtime_pb2_grpc as mm_grpc

# The OIP methods that name one model, and the field path of that name (field 1 in each):
# ModelMesh writes the model id there, and routes only these methods (a non-empty map is an
# allow-list).
ID_INJECTION = {
    "inference.GRPCInferenceService/ModelInfer": [1],
    "inference.GRPCInferenceService/ModelMetadata": [1],
    "inference.GRPCInferenceService/ModelReady": [1],
    "inference.GRPCInferenceService/ModelStatistics": [1],
}


def spi(operation: Operation) -> Callable[[Handler[Any, Any]], Handler[Any, Any]]:
    """An SPI call of `operation`, inside the request boundary like every RPC, without
    credentials (ModelMesh sends none)."""
    return rpc(operation, model=lambda request: getattr(request, "modelId", None),
               credentials=False)


class ModelRuntimeServicer(mm_grpc.ModelRuntimeServicer):
    def __init__(self, service: InferenceService, runtime: MeshRuntime,
                 boundary: RequestBoundary) -> None:
        self.service = service
        self.runtime = runtime
        self.boundary = boundary

    @spi(Operation.MODELMESH_LOAD)
    async def loadModel(self, request: mm.LoadModelRequest, context: Any) -> mm.LoadModelResponse:
        if self.service.draining:
            raise ShuttingDown("the server is shutting down: no model is loaded now")
        size = await self.runtime.load(request.modelId, request.modelPath, request.modelType,
                                       request.modelKey)
        return mm.LoadModelResponse(sizeInBytes=size)

    @spi(Operation.MODELMESH_UNLOAD)
    async def unloadModel(self, request: mm.UnloadModelRequest,
                          context: Any) -> mm.UnloadModelResponse:
        await self.runtime.unload(request.modelId)
        return mm.UnloadModelResponse()

    @spi(Operation.MODELMESH_PREDICT_SIZE)
    async def predictModelSize(self, request: mm.PredictModelSizeRequest,
                               context: Any) -> mm.PredictModelSizeResponse:
        size = await self.runtime.predict_size(request.modelId, request.modelPath,
                                               request.modelType, request.modelKey)
        return mm.PredictModelSizeResponse(sizeInBytes=size)

    @spi(Operation.MODELMESH_MODEL_SIZE)
    async def modelSize(self, request: mm.ModelSizeRequest, context: Any) -> mm.ModelSizeResponse:
        return mm.ModelSizeResponse(sizeInBytes=self.runtime.size(request.modelId))

    @spi(Operation.MODELMESH_STATUS)
    async def runtimeStatus(self, request: mm.RuntimeStatusRequest,
                            context: Any) -> mm.RuntimeStatusResponse:
        info = await self.runtime.status()
        reply = mm.RuntimeStatusResponse(
            status=mm.RuntimeStatusResponse.READY if info.ready
            else mm.RuntimeStatusResponse.STARTING,
            capacityInBytes=info.capacity_bytes,
            maxLoadingConcurrency=info.loading_concurrency,
            modelLoadingTimeoutMs=info.load_timeout_ms,
            defaultModelSizeInBytes=info.default_model_bytes,
            runtimeVersion=info.version,
        )
        for method, path in ID_INJECTION.items():
            reply.methodInfos[method].idInjectionPath.extend(path)
        return reply


def create_modelmesh_server(
    service: InferenceService, runtime: MeshRuntime, boundary: RequestBoundary,
    config: ServerConfig,
) -> grpc.aio.Server:
    """The SPI's own gRPC server (not listening yet), with the OIP port's limits."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *limit_options(config)])
    handlers = ParsedInBoundary()
    mm_grpc.add_ModelRuntimeServicer_to_server(  # type: ignore[no-untyped-call]
        ModelRuntimeServicer(service, runtime, boundary), handlers)
    server.add_generic_rpc_handlers((handlers,))
    return server
