"""Every public operation of the daemon, named once, with the HTTP routes and gRPC methods that
reach it.

This table is the one place where the transports' surfaces meet: `api/http/rest.py` and
`api/http/fastpath.py` serve exactly the HTTP routes listed here, `api/grpc/service.py` tags each
RPC with
its operation, and a test fails when a route or an RPC exists without an entry (or an entry
without its route). Whatever applies per operation (the access an operation needs, the
`operation` label of request metrics, the request log) hooks onto `Operation`, never onto a
path or a method name.

Pure data: no web or gRPC imports, so the engine may name operations in its events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Operation(StrEnum):
    SERVER_LIVE = "server_live"
    SERVER_READY = "server_ready"
    SERVER_METADATA = "server_metadata"
    MODEL_METADATA = "model_metadata"
    MODEL_READY = "model_ready"
    INFER = "infer"
    REPOSITORY_INDEX = "repository_index"
    REPOSITORY_LOAD = "repository_load"
    REPOSITORY_UNLOAD = "repository_unload"
    ADMIN_STATUS = "admin_status"
    HEALTH = "health"  # grpc.health.v1: the server ("") or one model
    REFLECTION = "reflection"  # gRPC server reflection
    MODEL_STATS = "model_stats"  # Triton's statistics extension
    METRICS = "metrics"  # Prometheus text format
    OPENAPI = "openapi"  # the OpenAPI document of the HTTP API
    EMBEDDINGS = "embeddings"  # OpenAI's POST /v1/embeddings
    OPENAI_MODELS = "openai_models"  # OpenAI's model list, of the models that embed or rerank
    RERANK = "rerank"  # Cohere's POST /v1/rerank and /v2/rerank (Jina's shape too)
    TEI_RERANK = "tei_rerank"  # Text Embeddings Inference's POST /rerank
    # KServe ModelMesh's model-runtime SPI, on its own port (api/grpc/modelmesh.py)
    MODELMESH_LOAD = "modelmesh_load"
    MODELMESH_UNLOAD = "modelmesh_unload"
    MODELMESH_PREDICT_SIZE = "modelmesh_predict_size"
    MODELMESH_MODEL_SIZE = "modelmesh_model_size"
    MODELMESH_STATUS = "modelmesh_status"


class Access(StrEnum):
    """What an operation exposes, for the roles to decide on: probes anyone may call,
    reading what is deployed, running models, and changing what is loaded."""

    PROBE = "probe"
    READ = "read"
    INFER = "infer"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class OperationSpec:
    access: Access
    # The request names a model, in its path (statistics: or asks for every model) or, for
    # OpenAI's /v1/embeddings and the rerank routes, in its body.
    model_scoped: bool
    http: tuple[tuple[str, str], ...] = ()  # (method, path); GET routes answer HEAD too
    grpc: tuple[str, ...] = ()  # full method names, "/package.Service/Method"


_OIP = "/inference.GRPCInferenceService/"
_MMESH = "/mmesh.ModelRuntime/"
_VERSIONED = "/v2/models/{name}/versions/{version}"


def _get(*paths: str) -> tuple[tuple[str, str], ...]:
    return tuple(("GET", path) for path in paths)


def _post(*paths: str) -> tuple[tuple[str, str], ...]:
    return tuple(("POST", path) for path in paths)


OPERATIONS: Mapping[Operation, OperationSpec] = {
    Operation.SERVER_LIVE: OperationSpec(
        Access.PROBE, False, _get("/v2/health/live", "/health/live"), (_OIP + "ServerLive",)),
    Operation.SERVER_READY: OperationSpec(
        Access.PROBE, False, _get("/v2/health/ready", "/health/ready"),
        (_OIP + "ServerReady",)),
    Operation.SERVER_METADATA: OperationSpec(
        Access.READ, False, _get("/v2"), (_OIP + "ServerMetadata",)),
    Operation.MODEL_METADATA: OperationSpec(
        Access.READ, True, _get("/v2/models/{name}", _VERSIONED), (_OIP + "ModelMetadata",)),
    Operation.MODEL_READY: OperationSpec(
        Access.READ, True, _get("/v2/models/{name}/ready", _VERSIONED + "/ready"),
        (_OIP + "ModelReady",)),
    Operation.INFER: OperationSpec(
        Access.INFER, True, _post("/v2/models/{name}/infer", _VERSIONED + "/infer"),
        (_OIP + "ModelInfer",)),
    Operation.REPOSITORY_INDEX: OperationSpec(
        Access.READ, False, _post("/v2/repository/index"), (_OIP + "RepositoryIndex",)),
    Operation.REPOSITORY_LOAD: OperationSpec(
        Access.ADMIN, True,
        _post("/v2/repository/models/{name}/load",
              "/v2/repository/models/{name}/versions/{version}/load"),
        (_OIP + "RepositoryModelLoad",)),
    Operation.REPOSITORY_UNLOAD: OperationSpec(
        Access.ADMIN, True,
        _post("/v2/repository/models/{name}/unload",
              "/v2/repository/models/{name}/versions/{version}/unload"),
        (_OIP + "RepositoryModelUnload",)),
    Operation.ADMIN_STATUS: OperationSpec(Access.READ, False, _get("/admin/status")),
    Operation.HEALTH: OperationSpec(
        Access.PROBE, False, (), ("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")),
    Operation.REFLECTION: OperationSpec(
        Access.READ, False, (),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",)),
    Operation.MODEL_STATS: OperationSpec(
        Access.READ, True,
        # Before `/v2/models/{name}` in routing: api/http/rest.py registers literal paths first.
        _get("/v2/models/stats", "/v2/models/{name}/stats", _VERSIONED + "/stats"),
        (_OIP + "ModelStatistics",)),
    Operation.METRICS: OperationSpec(Access.READ, False, _get("/metrics")),
    Operation.OPENAPI: OperationSpec(Access.READ, False, _get("/openapi.json")),
    Operation.EMBEDDINGS: OperationSpec(Access.INFER, True, _post("/v1/embeddings")),
    Operation.OPENAI_MODELS: OperationSpec(
        Access.READ, True, _get("/v1/models", "/v1/models/{name}")),
    # A rerank request may leave its model out when the daemon has one reranker.
    Operation.RERANK: OperationSpec(Access.INFER, True, _post("/v1/rerank", "/v2/rerank")),
    Operation.TEI_RERANK: OperationSpec(Access.INFER, True, _post("/rerank")),
    # No credentials: ModelMesh sends none. The SPI listens on its own port, on loopback
    # unless configured otherwise (the ModelMesh container shares the pod's network).
    Operation.MODELMESH_LOAD: OperationSpec(Access.ADMIN, True, (), (_MMESH + "loadModel",)),
    Operation.MODELMESH_UNLOAD: OperationSpec(
        Access.ADMIN, True, (), (_MMESH + "unloadModel",)),
    Operation.MODELMESH_PREDICT_SIZE: OperationSpec(
        Access.READ, True, (), (_MMESH + "predictModelSize",)),
    Operation.MODELMESH_MODEL_SIZE: OperationSpec(
        Access.READ, True, (), (_MMESH + "modelSize",)),
    Operation.MODELMESH_STATUS: OperationSpec(
        Access.READ, False, (), (_MMESH + "runtimeStatus",)),
}


def operation_for_rpc(method: str) -> Operation:
    """The operation of a full gRPC method name; KeyError for one the table lacks."""
    return _BY_RPC[method]


_BY_RPC: dict[str, Operation] = {
    rpc: operation for operation, spec in OPERATIONS.items() for rpc in spec.grpc
}
