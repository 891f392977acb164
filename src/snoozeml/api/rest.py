"""HTTP transport: the Open Inference Protocol REST endpoints on FastAPI.

Endpoints take the raw Request and answer with orjson bytes: tensors never pass through
pydantic, which would cost more than the model on small requests. Each endpoint is a boundary:
domain errors become their status from api/errors.py, anything else a logged 500.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from snoozeml.api.codec import parse_json
from snoozeml.api.errors import http_status, retry_after_header
from snoozeml.engine.manager import InferenceService
from snoozeml.engine.model import describe_exception
from snoozeml.errors import InvalidInput, RequestTooLarge, SnoozeError
from snoozeml.logs import log_event

JSON = "application/json"
Endpoint = Callable[[Request], Awaitable[Response]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type=JSON,
        headers=headers,
    )


def error_response(error: SnoozeError) -> Response:
    return json_response({"error": error.message}, http_status(error), retry_after_header(error))


def boundary(endpoint: Endpoint) -> Endpoint:
    """Turn every failure of one request into an answer; the server keeps serving."""

    @functools.wraps(endpoint)
    async def wrapper(request: Request) -> Response:
        try:
            return await endpoint(request)
        except SnoozeError as exc:
            status = http_status(exc)
            if status >= 500 and status != 501:  # 501: the client asked for a missing feature
                log_event("request_failed", logging.WARNING, path=request.url.path,
                          status=status, error=exc.message)
            return error_response(exc)
        except Exception as exc:
            log_event("request_failed", logging.ERROR, path=request.url.path, status=500,
                      error=describe_exception(exc))
            logging.getLogger("snoozeml").debug("traceback", exc_info=True)
            return json_response({"error": f"internal error: {describe_exception(exc)}"}, 500)

    return wrapper


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything over `limit` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidInput("invalid Content-Length header") from None
        if size > limit:
            raise RequestTooLarge(f"request body of {size} bytes exceeds the limit of {limit}")
        return await request.body()
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(service: InferenceService, max_request_size: int) -> FastAPI:
    """The HTTP application for `service`."""
    app = FastAPI(
        title="SnoozeML", docs_url=None, redoc_url=None, openapi_url=None,
        # A path with a trailing slash is a 404 with a JSON body, not a bodiless 307.
        redirect_slashes=False,
    )

    def route(path: str, method: str, endpoint: Endpoint, *aliases: str) -> None:
        wrapped = boundary(endpoint)
        methods = ["GET", "HEAD"] if method == "GET" else [method]  # HTTP: HEAD wherever GET
        for p in (path, *aliases):
            app.add_api_route(p, wrapped, methods=methods, include_in_schema=False)

    def model_args(request: Request) -> tuple[str, str | None]:
        params = request.path_params
        return params["name"], params.get("version")

    # --- health and server ----------------------------------------------------------------

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def ready(request: Request) -> Response:
        is_ready = service.server_ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 503)

    async def server_metadata(request: Request) -> Response:
        return json_response(service.server_metadata())

    route("/v2/health/live", "GET", live, "/health/live")
    route("/v2/health/ready", "GET", ready, "/health/ready")
    route("/v2", "GET", server_metadata)

    # --- models ---------------------------------------------------------------------------

    async def model_metadata(request: Request) -> Response:
        name, version = model_args(request)
        meta = await service.model_metadata(name, version)
        return json_response({
            "name": meta.name,
            "versions": ["1"],
            "platform": meta.platform,
            "inputs": [_spec_json(s) for s in meta.inputs],
            "outputs": [_spec_json(s) for s in meta.outputs],
        })

    async def model_ready(request: Request) -> Response:
        name, version = model_args(request)
        is_ready = service.model_ready(name, version)
        return json_response({"name": name, "ready": is_ready}, 200 if is_ready else 503)

    route("/v2/models/{name}", "GET", model_metadata, "/v2/models/{name}/versions/{version}")
    route("/v2/models/{name}/ready", "GET", model_ready,
          "/v2/models/{name}/versions/{version}/ready")
    # POST /v2/models/{name}[/versions/{version}]/infer is served by api/fastpath.py.

    # --- repository -----------------------------------------------------------------------

    async def repository_index(request: Request) -> Response:
        doc = parse_json(await read_body(request, max_request_size), allow_empty=True)
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
        await service.load(*model_args(request))
        return json_response({})

    async def unload(request: Request) -> Response:
        await service.unload(*model_args(request))
        return json_response({})

    route("/v2/repository/index", "POST", repository_index)
    route("/v2/repository/models/{name}/load", "POST", load,
          "/v2/repository/models/{name}/versions/{version}/load")
    route("/v2/repository/models/{name}/unload", "POST", unload,
          "/v2/repository/models/{name}/versions/{version}/unload")

    # --- operators ------------------------------------------------------------------------

    async def admin_status(request: Request) -> Response:
        return json_response(service.status())

    route("/admin/status", "GET", admin_status)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        # Starlette's own headers stay (a 405 names the allowed methods in Allow).
        return json_response({"error": str(exc.detail)}, exc.status_code, dict(exc.headers or {}))

    app.add_exception_handler(StarletteHTTPException, http_error)
    return app


def _spec_json(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}
