"""HTTP transport: the Open Inference Protocol REST endpoints on Starlette, except inference
(api/http/fastpath.py).

The routes are the ones snoozeml/operations.py lists, registered from that table: each
operation has one handler here, and each handler runs inside the shared request boundary.
Endpoints take the raw Request and answer with orjson bytes: tensors never pass through
pydantic, which would cost more than the model on small requests. Plain Starlette routes, not
FastAPI's: nothing here uses its validation, injection or generated OpenAPI (the document is
written by hand, api/openapi/), and importing it was a large part of the start-up.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from snoozeml.api.boundary import CALL, ErrorAnswer, RequestBoundary
from snoozeml.api.codec import parse_json
from snoozeml.api.http.body import ClientGone, read_body, scope_credentials
from snoozeml.api.http.openai import OPENAI_OPERATIONS, Embeddings, error_response
from snoozeml.api.http.rerank import Reranking, cohere_error_response, tei_error_response
from snoozeml.api.metrics.prometheus import Metrics
from snoozeml.api.repository_params import LoadParameters, load_parameters
from snoozeml.api.status import status_json
from snoozeml.api.triton_statistics import statistics_json
from snoozeml.datatypes import TensorSpec
from snoozeml.engine.service import InferenceService
from snoozeml.errors import InvalidInput
from snoozeml.operations import OPERATIONS, Operation

JSON = "application/json"
Endpoint = Callable[[Request], Awaitable[Response]]
ErrorRenderer = Callable[[BaseException, ErrorAnswer], Response]


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type=JSON,
        headers=headers,
    )


@functools.cache
def openapi_json() -> bytes:
    """The OpenAPI document, built at its first request and kept: it describes the code, not
    the config, and a daemon nobody asks for it never builds it (nor imports its modules)."""
    from snoozeml.api.openapi.document import document

    return orjson.dumps(document())


def _model_args(request: Request) -> tuple[str, str | None]:
    params = request.path_params
    return params["name"], params.get("version")


def handlers(
    service: InferenceService, max_request_size: int, metrics: Metrics | None = None
) -> dict[Operation, Endpoint]:
    """One endpoint per operation served here (`metrics` None: /metrics is off)."""
    return {**_health_and_metadata(service), **_repository(service, max_request_size),
            **_observability(service, metrics)}


def _health_and_metadata(service: InferenceService) -> dict[Operation, Endpoint]:
    """The probes, and the server's and each model's metadata and readiness."""

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def ready(request: Request) -> Response:
        is_ready = service.server_ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 503)

    async def server_metadata(request: Request) -> Response:
        meta = service.server_metadata()
        return json_response({"name": meta.name, "version": meta.version,
                              "extensions": list(meta.extensions)})

    async def model_metadata(request: Request) -> Response:
        meta = await service.model_metadata(*_model_args(request))
        return json_response({
            "name": meta.name,
            "versions": list(meta.versions),
            "platform": meta.platform,
            "inputs": [_spec_json(s) for s in meta.inputs],
            "outputs": [_spec_json(s) for s in meta.outputs],
        })

    async def model_ready(request: Request) -> Response:
        name, version = _model_args(request)
        is_ready = service.model_ready(name, version)
        return json_response({"name": name, "ready": is_ready}, 200 if is_ready else 503)

    return {
        Operation.SERVER_LIVE: live,
        Operation.SERVER_READY: ready,
        Operation.SERVER_METADATA: server_metadata,
        Operation.MODEL_METADATA: model_metadata,
        Operation.MODEL_READY: model_ready,
    }


def _repository(service: InferenceService, max_request_size: int) -> dict[Operation, Endpoint]:
    """The repository extension: the index, and loading and unloading a model now."""

    async def repository_index(request: Request) -> Response:
        body = await read_body(request.scope, request.receive, max_request_size)
        doc = parse_json(body, allow_empty=True)
        if not isinstance(doc, dict):
            raise InvalidInput("request body must be a JSON object")
        ready_only = doc.get("ready", False)
        if not isinstance(ready_only, bool):
            raise InvalidInput("'ready' must be a boolean")
        return json_response([
            {"name": e.name, "version": e.version, "state": e.state, "reason": e.reason}
            for e in service.index(ready_only)
        ])

    async def load(request: Request) -> Response:
        body = await read_body(request.scope, request.receive, max_request_size)
        doc = parse_json(body, allow_empty=True)
        if not isinstance(doc, dict):
            raise InvalidInput("request body must be a JSON object")
        params = load_parameters(doc["parameters"]) if "parameters" in doc else \
            LoadParameters()
        await service.load(*_model_args(request), path=params.path, kind=params.model_type)
        return json_response({})

    async def unload(request: Request) -> Response:
        await service.unload(*_model_args(request))
        return json_response({})

    return {
        Operation.REPOSITORY_INDEX: repository_index,
        Operation.REPOSITORY_LOAD: load,
        Operation.REPOSITORY_UNLOAD: unload,
    }


def _observability(service: InferenceService,
                   metrics: Metrics | None) -> dict[Operation, Endpoint]:
    """What the daemon says of itself: /admin/status, /metrics, the statistics extension and
    the OpenAPI document."""

    async def admin_status(request: Request) -> Response:
        return json_response(status_json(service.snapshot()))

    async def metrics_text(request: Request) -> Response:
        if metrics is None:
            return json_response({"error": "metrics are off ([server.metrics] enabled = false)"},
                                 404)
        return Response(await metrics.scrape(), media_type=metrics.content_type)

    async def model_stats(request: Request) -> Response:
        params = request.path_params  # no name: every model (GET /v2/models/stats)
        return json_response(statistics_json(
            service.statistics(params.get("name"), params.get("version"))))

    async def openapi(request: Request) -> Response:
        return Response(openapi_json(), media_type=JSON)

    return {
        Operation.ADMIN_STATUS: admin_status,
        Operation.METRICS: metrics_text,
        Operation.MODEL_STATS: model_stats,
        Operation.OPENAPI: openapi,
    }


def plain_error(exc: BaseException, answer: ErrorAnswer) -> Response:
    return json_response({"error": answer.message}, answer.http_status, answer.http_headers())


def within(boundary: RequestBoundary, operation: Operation, endpoint: Endpoint,
           render: ErrorRenderer = plain_error) -> Endpoint:
    """`endpoint` inside the request boundary: every failure becomes its answer there, in the
    body `render` writes (the OIP routes' `{"error": message}`, OpenAI's on /v1)."""

    async def bounded(request: Request) -> Response:
        call = boundary.begin(operation, "http", request.path_params.get("name"))
        request.scope[CALL] = call
        try:
            call.authorize(*scope_credentials(request.scope))
            response = await endpoint(request)
        except ClientGone:
            call.cancelled()
            return Response(status_code=400)  # nobody is there to read it
        except asyncio.CancelledError:
            call.cancelled()
            raise
        except Exception as exc:  # boundary: one request fails, the daemon keeps serving
            return render(exc, call.failed(exc))
        call.succeeded(response.status_code)
        return response

    bounded.__name__ = operation.value
    return bounded


# Served by api/http/fastpath.py in front of this app.
SERVED_ELSEWHERE = frozenset({Operation.INFER})
# The routes whose clients read another API's error body than `{"error": message}`.
_RENDERERS: dict[Operation, ErrorRenderer] = {
    **dict.fromkeys(OPENAI_OPERATIONS, error_response),
    Operation.RERANK: cohere_error_response,
    Operation.TEI_RERANK: tei_error_response,
}


def create_app(
    service: InferenceService, boundary: RequestBoundary, max_request_size: int,
    metrics: Metrics | None = None, max_embedding_inputs: int = 2048,
    max_rerank_documents: int = 1000,
) -> Starlette:
    """The HTTP application for `service`: every route of the operation table but inference
    (`metrics`: what /metrics serves; None: it answers 404), the OpenAI and rerank routes
    included."""
    endpoints = handlers(service, max_request_size, metrics)
    openai = Embeddings(service, max_request_size, max_embedding_inputs)
    endpoints[Operation.EMBEDDINGS] = openai.embeddings
    endpoints[Operation.OPENAI_MODELS] = openai.models
    reranking = Reranking(service, max_request_size, max_rerank_documents)
    endpoints[Operation.RERANK] = reranking.cohere
    endpoints[Operation.TEI_RERANK] = reranking.tei
    routes: list[tuple[str, str, Endpoint]] = []
    for operation, spec in OPERATIONS.items():
        if not spec.http or operation in SERVED_ELSEWHERE:
            continue
        render = _RENDERERS.get(operation, plain_error)
        endpoint = within(boundary, operation, endpoints.pop(operation), render)
        routes.extend((method, path, endpoint) for method, path in spec.http)
    if endpoints:  # a handler for an operation the table gives no route: a bug
        raise RuntimeError(f"no HTTP route in the operation table for {sorted(endpoints)}")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        # Starlette's own headers stay (a 405 names the allowed methods in Allow).
        body: dict[str, Any] = {"error": str(exc.detail)}
        if request.url.path.startswith("/v1/"):  # OpenAI's clients read their own shape
            body = {"error": {"message": str(exc.detail), "type": "invalid_request_error",
                              "param": None, "code": None}}
        return json_response(body, exc.status_code, dict(exc.headers or {}))

    app = Starlette(
        # Literal paths first: `/v2/models/stats` is not the metadata of a model named "stats".
        # HEAD wherever GET (Starlette adds it).
        routes=[Route(path, endpoint, methods=[method])
                for method, path, endpoint in sorted(routes, key=lambda route: "{" in route[1])],
        exception_handlers={StarletteHTTPException: http_error},
    )
    # A path with a trailing slash is a 404 with a JSON body, not a bodiless 307.
    app.router.redirect_slashes = False
    return app


def _spec_json(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}
