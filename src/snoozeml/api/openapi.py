"""The OpenAPI 3.0 document of the HTTP API, served at `GET /openapi.json`.

Written by hand from what the handlers answer (api/rest.py, api/fastpath.py and the error
table of api/boundary.py), never generated from the routes: tests/integration/test_openapi.py
holds its paths and methods to the operation table's HTTP routes, both ways, and validates it
as OpenAPI; tests/integration/test_fuzz_http.py fuzzes the real daemon from it and checks
every answer against it. Change it with the endpoint it describes.

Responses are strict (every field listed is sent, and no other) so that a field added to an
answer without its line here fails the fuzz test; request bodies are open, as the handlers
ignore what they do not read. OpenAPI 3.0, not 3.1: its `integer` is a JSON number written
without a fraction, which is what the daemon takes for a shape, a size or an integer tensor's
element (as Triton does: `2.0` is refused), where 3.1's JSON Schema counts `2.0` an integer.
"""

from __future__ import annotations

from typing import Any

from snoozeml import __version__

Schema = dict[str, Any]

STR: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}
COUNT: Schema = {"type": "integer", "minimum": 0}
SECONDS: Schema = {"type": "number", "minimum": 0}
TIME: Schema = {"type": "string", "format": "date-time"}  # 2026-12-01T00:10:18.544Z
BINARY: Schema = {"type": "string", "format": "binary"}
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES"]
HEADER = "Inference-Header-Content-Length"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _null(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def _obj(**fields: Schema) -> Schema:
    """A response object: every field always sent, and no other."""
    schema: Schema = {"type": "object", "properties": fields, "additionalProperties": False}
    if fields:  # (OpenAPI 3.0: `required` is never empty)
        schema["required"] = list(fields)
    return schema


def _array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def _counts(*names: str) -> dict[str, Schema]:
    return dict.fromkeys(names, COUNT)


# --- answers --------------------------------------------------------------------------------

def _ok(description: str, schema: Schema, media_type: str = "application/json") -> Schema:
    return {"description": description, "content": {media_type: {"schema": schema}}}


def _error(description: str, *headers: str) -> Schema:
    response = _ok(description, _ref("Error"))
    if headers:
        response["headers"] = {h: {"$ref": f"#/components/headers/{h}"} for h in headers}
    return response


ERRORS: dict[str, Schema] = {
    "400": _error("The request is malformed or does not fit the model; the message says how."),
    "401": _error("Auth is on and the credentials are missing, invalid or expired.",
                  "WWW-Authenticate"),
    "403": _error("The credential's role is too low for this operation."),
    "404": _error("Unknown model, or a version other than \"1\"."),
    "413": _error("The body (or its inflated form) is larger than `max_request_size`."),
    "500": _error("The model raised while running the request; the daemon keeps serving."),
    "501": _error("An extension SnoozeML does not implement: shared memory, classification."),
    "503": _error("The model is FAILED, still loading after `load_timeout`, has no memory to "
                  "load, its queue is full, the request's `timeout` ran out in the queue, or "
                  "the server is shutting down.", "Retry-After"),
}
PUBLIC: list[Schema] = []  # no credentials needed, even with auth on


def _op(operation: str, summary: str, ok: Schema, *errors: str, tag: str,
        security: list[Schema] | None = None, **extra: Any) -> Schema:
    """One operation; `operation` is its name in the operation table (its metrics label)."""
    responses = {"200": ok}
    if security is not PUBLIC:
        errors = ("401", "403", *errors)
    responses.update((code, ERRORS[code]) for code in sorted(errors))
    op: Schema = {"operationId": operation, "summary": summary, "tags": [tag],
                  "x-operation": operation, "responses": responses, **extra}
    if security is not None:
        op["security"] = security
    return op


def _get(op: Schema, suffix: str = "") -> Schema:
    """GET, and HEAD with the same statuses and headers but no body."""
    head = {**op, "operationId": f"{op['operationId']}{suffix}_head",
            "summary": f"{op['summary']} (headers only)",
            "responses": {code: {k: v for k, v in response.items() if k != "content"}
                          for code, response in op["responses"].items()}}
    return {"get": {**op, "operationId": op["operationId"] + suffix}, "head": head}


def _post(op: Schema, suffix: str = "") -> Schema:
    return {"post": {**op, "operationId": op["operationId"] + suffix}}


NAME: Schema = {"name": "name", "in": "path", "required": True,
                "schema": {"type": "string", "minLength": 1}, "description": "The model."}
VERSION: Schema = {"name": "version", "in": "path", "required": True, "schema": STR,
                   "description": "Every model has one version, \"1\"; any other is a 404."}


def _model(item: Schema, versioned: bool = False) -> Schema:
    return {**item, "parameters": [NAME, VERSION] if versioned else [NAME]}


# --- the endpoints --------------------------------------------------------------------------

def _infer() -> Schema:
    binary_header = {"name": HEADER, "in": "header", "required": False,
                     "schema": {"type": "integer", "minimum": 0},
                     "description": "Binary tensor data extension: the length of the JSON "
                                    "header; the inputs' raw bytes follow it. Required with "
                                    "binary inputs; without it the body is JSON only."}
    encoding = {"name": "Content-Encoding", "in": "header", "required": False,
                "schema": {"enum": ["gzip", "deflate", "identity"]},
                "description": "The body is inflated first, under the same size limit."}
    body = {"required": True, "description": (
        "The JSON request, or (binary tensor data extension, with the "
        f"`{HEADER}` header) that many bytes of JSON followed by the raw bytes of each input "
        "that has `binary_data_size` instead of `data`, in order. The Content-Type is not "
        "read."), "content": {
            "application/json": {"schema": _ref("InferRequest")},
            "application/octet-stream": {"schema": BINARY}}}
    ok = {"description": "The outputs. With binary outputs (`binary_data_output`, or an "
                         "output's `binary_data`), the body is the JSON header then the "
                         "outputs' raw bytes, and the header gives the JSON's length.",
          "headers": {HEADER: {"$ref": f"#/components/headers/{HEADER}"}},
          "content": {"application/json": {"schema": _ref("InferResponse")},
                      "application/octet-stream": {"schema": BINARY}}}
    return _op("infer", "Inference (the model loads first if it is not loaded)", ok,
               "400", "404", "413", "500", "501", "503", tag="inference",
               parameters=[binary_header, encoding], requestBody=body)


def paths() -> dict[str, Schema]:
    live = _op("server_live", "The process is up",
               _ok("Always, while the process answers", _obj(live={"enum": [True]})),
               tag="health", security=PUBLIC)
    ready = _op("server_ready", "The server takes requests (models may be cold)",
                _ok("Ready", _obj(ready={"enum": [True]})), tag="health", security=PUBLIC)
    ready["responses"]["503"] = _ok("Shutting down", _obj(ready={"enum": [False]}))
    metadata = _op("server_metadata", "Server metadata",
                   _ok("Name, version, extensions", _ref("ServerMetadata")), tag="metadata")
    model_metadata = _op("model_metadata", "Model metadata (the first request loads the model)",
                         _ok("Inputs and outputs", _ref("ModelMetadata")), "404", "503",
                         tag="metadata")
    model_ready = _op("model_ready", "Whether the model can serve (all but FAILED)",
                      _ok("Ready", _ref("ModelReady")), "404", tag="metadata")
    model_ready["responses"]["503"] = _ok("The model is FAILED", _ref("ModelReady"))
    infer = _infer()
    index = _op("repository_index", "Every configured model and its state",
                _ok("The models, in config order", _array(_ref("IndexEntry"))), "400", "413",
                tag="repository", requestBody={"required": False, "content": {
                    "application/json": {"schema": {
                        "type": "object", "properties": {"ready": BOOL},
                        "description": "`ready`: only READY models. No body: every model."}}}})
    load = _op("repository_load", "Load the model now; answers once it is READY",
               _ok("Loaded", _obj()), "404", "503", tag="repository")
    unload = _op("repository_unload", "Unload the model now; answers once it is UNLOADED",
                 _ok("Unloaded", _obj()), "404", tag="repository")
    stats = _op("model_stats", "Triton's statistics extension",
                _ok("Counts and summed durations", _ref("Statistics")), "404", tag="metadata")
    every_stats = {**stats, "summary": "Triton's statistics extension, every model"}
    every_stats["responses"] = {k: v for k, v in stats["responses"].items() if k != "404"}
    status = _op("admin_status", "State, timers, memory and counters of every model",
                 _ok("The status", _ref("AdminStatus")), tag="admin")
    metrics = _op("metrics", "Prometheus metrics (public with `[auth] metrics_public`)",
                  _ok("The text exposition format", STR, "text/plain"), "404", tag="admin")
    metrics["responses"]["404"] = _error("Metrics are off (`[server.metrics] enabled = false`).")
    openapi = _op("openapi", "This document", _ok("OpenAPI 3.0", {"type": "object"}),
                  tag="metadata")
    versioned = "/v2/models/{name}/versions/{version}"
    return {
        "/v2/health/live": _get(live),
        "/health/live": _get(live, "_short"),
        "/v2/health/ready": _get(ready),
        "/health/ready": _get(ready, "_short"),
        "/v2": _get(metadata),
        "/v2/models/{name}": _model(_get(model_metadata)),
        versioned: _model(_get(model_metadata, "_versioned"), versioned=True),
        "/v2/models/{name}/ready": _model(_get(model_ready)),
        versioned + "/ready": _model(_get(model_ready, "_versioned"), versioned=True),
        "/v2/models/{name}/infer": _model(_post(infer)),
        versioned + "/infer": _model(_post(infer, "_versioned"), versioned=True),
        "/v2/repository/index": _post(index),
        "/v2/repository/models/{name}/load": _model(_post(load)),
        "/v2/repository/models/{name}/versions/{version}/load":
            _model(_post(load, "_versioned"), versioned=True),
        "/v2/repository/models/{name}/unload": _model(_post(unload)),
        "/v2/repository/models/{name}/versions/{version}/unload":
            _model(_post(unload, "_versioned"), versioned=True),
        "/v2/models/stats": _get(every_stats, "_all"),
        "/v2/models/{name}/stats": _model(_get(stats)),
        versioned + "/stats": _model(_get(stats, "_versioned"), versioned=True),
        "/admin/status": _get(status),
        "/metrics": _get(metrics),
        "/openapi.json": _get(openapi),
    }


# --- the schemas ----------------------------------------------------------------------------

_SCALAR: Schema = {"anyOf": [{"type": "number"}, {"type": "boolean"}, STR]}
_DURATION = _obj(count=COUNT, ns=COUNT)


def _request_parameters(**known: Schema) -> Schema:
    return {"type": "object", "nullable": True, "properties": known,
            "description": "Name to value; names not listed here are accepted and ignored."}


def schemas() -> dict[str, Schema]:
    shared_memory = {"description": "Shared memory is not supported: any value is a 501."}
    tensor = {
        "type": "object", "required": ["name", "shape", "datatype"],
        "properties": {
            "name": STR,
            "shape": {"type": "array", "maxItems": 32, "items": COUNT},
            "datatype": _ref("Datatype"),
            "parameters": _request_parameters(
                binary_data_size={**_null(COUNT), "description": "Binary extension: this many "
                                  "bytes after the JSON header (and the ones before) are the "
                                  "data."},
                shared_memory_region=shared_memory),
            "data": _ref("TensorData"),
        },
        "description": "`data` (nested or flat, row-major, as many elements as the shape "
                       "holds: true/false for BOOL, strings for BYTES, integers for the "
                       "integer types, numbers for the float types), or the parameter "
                       "`binary_data_size`, not both.",
    }
    output = {"type": "object", "required": ["name"], "properties": {
        "name": STR,
        "parameters": _request_parameters(
            binary_data={"description": "true: send this output binary; any other value: "
                                        "JSON, whatever `binary_data_output` says."},
            shared_memory_region=shared_memory,
            classification={"description": "Not supported: any value is a 501."}),
    }}
    out_tensor = {
        "type": "object", "required": ["name", "datatype", "shape"],
        "additionalProperties": False,
        "properties": {
            "name": STR, "datatype": _ref("Datatype"), "shape": _array(COUNT),
            "data": _array({"anyOf": [_null({"type": "number"}), BOOL, STR]}),
            "parameters": _obj(binary_data_size=COUNT),
        },
        "description": "Flat row-major `data`, or (a binary output) `binary_data_size`. A "
                       "NaN or infinite float has no JSON form and is sent as null.",
    }
    replica = _obj(index=COUNT, device=STR, state={"enum": ["loading", "ready", "draining"]},
                   in_flight=COUNT, queued=COUNT, inline=BOOL, batches=COUNT, requests=COUNT,
                   measured_bytes=_null(COUNT), loaded_at=_null(TIME))
    scaling = _obj(min=COUNT, max=COUNT, strategy=STR, target_queue=SECONDS,
                   scale_up_after_s=SECONDS, scale_down_after_s=SECONDS, devices=_array(STR),
                   intra_op_threads=COUNT, desired=_null(COUNT), blocked=_null(STR),
                   last_error=_null(STR), **_counts("added", "removed", "failures"))
    mean = _null({"type": "number"})
    batching = _obj(enabled=BOOL, max_batch_size=COUNT, max_delay_s=SECONDS, max_queue=COUNT,
                    inline=BOOL, **_counts("batches", "requests", "rows"),
                    mean_requests_per_batch=mean, mean_rows_per_batch=mean,
                    largest_batch=COUNT, mean_queue_wait_ms=mean, mean_run_ms=mean,
                    **_counts("queue_timeouts", "queue_full", "dropped"))
    model_status = _obj(
        name=STR, format=_null(STR), device=STR, pinned=BOOL, state=_ref("State"), reason=STR,
        replicas=COUNT, replica_details=_array(replica), scaling=scaling, in_flight=COUNT,
        queued=COUNT, last_used=_null(TIME), expires_at=_null(TIME),
        idle_timeout_s=_null(SECONDS), predicted_bytes=_null(COUNT),
        measured_bytes=_null(COUNT), resident_bytes=COUNT, last_load_ms=mean,
        **_counts("loads", "load_failures", "requests", "errors"), batching=batching)
    by_name = {"type": "object", "additionalProperties": COUNT}
    model_stats = _obj(
        name=STR, version=STR, last_inference=COUNT, inference_count=COUNT,
        execution_count=COUNT,
        inference_stats=_obj(**dict.fromkeys(
            ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss"), _DURATION)),
        batch_stats=_array(_obj(batch_size=COUNT, compute_input=_DURATION,
                                compute_infer=_DURATION, compute_output=_DURATION)),
        memory_usage={"type": "array", "maxItems": 0},
        response_stats={"type": "object", "maxProperties": 0})
    return {
        "Error": _obj(error=STR),
        "Datatype": {"enum": DATATYPES},
        "State": {"enum": ["UNLOADED", "LOADING", "READY", "UNLOADING", "FAILED"]},
        "ServerMetadata": _obj(name=STR, version=STR, extensions=_array(STR)),
        "TensorMetadata": _obj(name=STR, datatype=_ref("Datatype"),
                               shape=_array({"type": "integer", "minimum": -1})),
        "ModelMetadata": _obj(name=STR, versions=_array(STR),
                              platform={"enum": ["onnxruntime_onnx", "pytorch_safetensors"]},
                              inputs=_array(_ref("TensorMetadata")),
                              outputs=_array(_ref("TensorMetadata"))),
        "ModelReady": _obj(name=STR, ready=BOOL),
        "TensorData": {"anyOf": [_SCALAR, _array({"$ref": "#/components/schemas/TensorData"})]},
        "InferRequest": {
            "type": "object", "required": ["inputs"],
            "properties": {
                "id": _null(STR),
                "parameters": _request_parameters(
                    timeout={**_null(COUNT), "maximum": 2**64 - 1, "description": "Microseconds "
                             "the request may wait in the batch queue (0: no limit); then a 503."},
                    binary_data_output={"description": "true: every output binary (unless "
                                        "its own `binary_data` says otherwise)."}),
                "inputs": {"type": "array", "minItems": 1, "items": tensor},
                "outputs": {"type": "array", "nullable": True, "items": output},
            },
        },
        "InferResponse": {
            "type": "object", "required": ["model_name", "model_version", "outputs"],
            "additionalProperties": False,
            "properties": {"model_name": STR, "model_version": STR, "id": STR,
                           "outputs": _array(out_tensor)},
        },
        "IndexEntry": _obj(name=STR, version=STR, state=_ref("State"), reason=STR),
        "Statistics": _obj(model_stats=_array(model_stats)),
        "AdminStatus": _obj(
            server=_obj(name=STR, version=STR, started_at=TIME, uptime_s=SECONDS,
                        draining=BOOL),
            devices=_array(_obj(name=STR, **_counts(
                "total_bytes", "budget_bytes", "used_bytes", "reserved_bytes",
                "process_bytes"))),
            evictions=by_name, auth_refusals=by_name,
            recent_events=_array(_obj(time=TIME, kind=STR, model=_null(STR), detail=STR)),
            models=_array(model_status),
            process=_obj(pid=COUNT, rss_bytes=COUNT, open_fds=_null(COUNT), threads=_null(COUNT),
                         asyncio_tasks=_null(COUNT))),
    }


def document() -> Schema:
    """The whole document, as JSON-ready data."""
    headers = {
        "Retry-After": {"description": "Whole seconds, at least 1.", "required": True,
                        "schema": {"type": "integer", "minimum": 1}},
        "WWW-Authenticate": {"description": "`Bearer`, or `Bearer error=\"invalid_token\"`.",
                             "required": True, "schema": STR},
        HEADER: {"description": "Only with binary outputs: the JSON header's length.",
                 "schema": COUNT},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "SnoozeML", "version": __version__, "description": (
            "The Open Inference Protocol (KServe v2) over HTTP, its model-repository and "
            "binary tensor data extensions, Triton's statistics extension, and SnoozeML's "
            "own endpoints. Every error body is `{\"error\": \"...\"}`. Every GET also "
            "answers HEAD. With auth off (no `[auth]` table), no operation needs "
            "credentials. See docs/http-api.md.")},
        "paths": paths(),
        "components": {
            "schemas": schemas(),
            "headers": headers,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "An API key or a JWT"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }
