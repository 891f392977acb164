"""The OpenAPI 3.0 document of the HTTP API, served at `GET /openapi.json`.

Written by hand from what the handlers answer (api/http/rest.py, api/http/fastpath.py and the error
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
from snoozeml.api.openapi import openai as openapi_openai
from snoozeml.api.openapi import rerank as openapi_rerank
from snoozeml.api.openapi.parts import (
    BINARY,
    BOOL,
    COUNT,
    DATATYPES,
    HEADER,
    SECONDS,
    STR,
    TIME,
    Schema,
    answer,
    array,
    counts,
    get_op,
    keep_alive_status,
    nullable,
    obj,
    post_op,
    ref,
)


def _error(description: str, *headers: str) -> Schema:
    response = answer(description, ref("Error"))
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
    "501": _error("An extension SnoozeML does not implement: shared memory."),
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
            "application/json": {"schema": ref("InferRequest")},
            "application/octet-stream": {"schema": BINARY}}}
    ok = {"description": "The outputs. With binary outputs (`binary_data_output`, or an "
                         "output's `binary_data`), the body is the JSON header then the "
                         "outputs' raw bytes, and the header gives the JSON's length.",
          "headers": {HEADER: {"$ref": f"#/components/headers/{HEADER}"}},
          "content": {"application/json": {"schema": ref("InferResponse")},
                      "application/octet-stream": {"schema": BINARY}}}
    return _op("infer", "Inference (the model loads first if it is not loaded)", ok,
               "400", "404", "413", "500", "501", "503", tag="inference",
               parameters=[binary_header, encoding], requestBody=body)


def _health_operations() -> dict[str, Schema]:
    live = _op("server_live", "The process is up",
               answer("Always, while the process answers", obj(live={"enum": [True]})),
               tag="health", security=PUBLIC)
    ready = _op("server_ready", "The server takes requests (models may be cold)",
                answer("Ready", obj(ready={"enum": [True]})), tag="health", security=PUBLIC)
    ready["responses"]["503"] = answer("Shutting down", obj(ready={"enum": [False]}))
    return {"live": live, "ready": ready}


def _model_operations() -> dict[str, Schema]:
    """The server's and each model's metadata, readiness and statistics."""
    metadata = _op("server_metadata", "Server metadata",
                   answer("Name, version, extensions", ref("ServerMetadata")), tag="metadata")
    model_metadata = _op("model_metadata", "Model metadata (the first request loads the model)",
                         answer("Inputs and outputs", ref("ModelMetadata")), "404", "503",
                         tag="metadata")
    model_ready = _op("model_ready", "Whether the model can serve (all but FAILED)",
                      answer("Ready", ref("ModelReady")), "404", tag="metadata")
    model_ready["responses"]["503"] = answer("The model is FAILED", ref("ModelReady"))
    stats = _op("model_stats", "Triton's statistics extension",
                answer("Counts and summed durations", ref("Statistics")), "404", tag="metadata")
    every_stats = {**stats, "summary": "Triton's statistics extension, every model"}
    every_stats["responses"] = {k: v for k, v in stats["responses"].items() if k != "404"}
    return {"metadata": metadata, "model_metadata": model_metadata, "model_ready": model_ready,
            "stats": stats, "every_stats": every_stats}


def _repository_operations() -> dict[str, Schema]:
    index = _op("repository_index", "Every model (configured or added) and its state",
                answer("The models, in config order", array(ref("IndexEntry"))), "400", "413",
                tag="repository", requestBody={"required": False, "content": {
                    "application/json": {"schema": {
                        "type": "object", "properties": {"ready": BOOL},
                        "description": "`ready`: only READY models. No body: every model."}}}})
    load = _op("repository_load", "Load the model now; answers once it is READY",
               answer("Loaded", obj()), "400", "404", "413", "503", tag="repository",
               requestBody={"required": False, "content": {"application/json": {"schema": {
                   "type": "object", "properties": {"parameters": {
                       "type": "object", "properties": {"path": STR, "model_type": STR},
                       "additionalProperties": False}},
                   "description": "`parameters.path`: add a model that models.toml does not "
                   "have, from an .onnx file, a folder holding one, or a safetensors model "
                   "folder on the daemon's machine (absolute); `model_type` (onnx, "
                   "safetensors, pytorch) narrows its format. No body: load a known model."}}}})
    unload = _op("repository_unload", "Unload the model now; answers once it is UNLOADED "
                 "(a model added by path is forgotten too)",
                 answer("Unloaded", obj()), "404", tag="repository")
    return {"index": index, "load": load, "unload": unload}


def _admin_operations() -> dict[str, Schema]:
    status = _op("admin_status", "State, timers, memory and counters of every model",
                 answer("The status", ref("AdminStatus")), tag="admin")
    metrics = _op("metrics", "Prometheus metrics (public with `[auth] metrics_public`)",
                  answer("The text exposition format", STR, "text/plain"), "404", tag="admin")
    metrics["responses"]["404"] = _error("Metrics are off (`[server.metrics] enabled = false`).")
    openapi = _op("openapi", "This document", answer("OpenAPI 3.0", {"type": "object"}),
                  tag="metadata")
    return {"status": status, "metrics": metrics, "openapi": openapi}


def paths() -> dict[str, Schema]:
    op = {**_health_operations(), **_model_operations(), "infer": _infer(),
          **_repository_operations(), **_admin_operations()}
    versioned = "/v2/models/{name}/versions/{version}"
    return {
        "/v2/health/live": get_op(op["live"]),
        "/health/live": get_op(op["live"], "_short"),
        "/v2/health/ready": get_op(op["ready"]),
        "/health/ready": get_op(op["ready"], "_short"),
        "/v2": get_op(op["metadata"]),
        "/v2/models/{name}": _model(get_op(op["model_metadata"])),
        versioned: _model(get_op(op["model_metadata"], "_versioned"), versioned=True),
        "/v2/models/{name}/ready": _model(get_op(op["model_ready"])),
        versioned + "/ready": _model(get_op(op["model_ready"], "_versioned"), versioned=True),
        "/v2/models/{name}/infer": _model(post_op(op["infer"])),
        versioned + "/infer": _model(post_op(op["infer"], "_versioned"), versioned=True),
        "/v2/repository/index": post_op(op["index"]),
        "/v2/repository/models/{name}/load": _model(post_op(op["load"])),
        "/v2/repository/models/{name}/versions/{version}/load":
            _model(post_op(op["load"], "_versioned"), versioned=True),
        "/v2/repository/models/{name}/unload": _model(post_op(op["unload"])),
        "/v2/repository/models/{name}/versions/{version}/unload":
            _model(post_op(op["unload"], "_versioned"), versioned=True),
        "/v2/models/stats": get_op(op["every_stats"], "_all"),
        "/v2/models/{name}/stats": _model(get_op(op["stats"])),
        versioned + "/stats": _model(get_op(op["stats"], "_versioned"), versioned=True),
        "/admin/status": get_op(op["status"]),
        "/metrics": get_op(op["metrics"]),
        "/openapi.json": get_op(op["openapi"]),
        **openapi_openai.paths(),
        **openapi_rerank.paths(),
    }


# --- the schemas ----------------------------------------------------------------------------

_SCALAR: Schema = {"anyOf": [{"type": "number"}, {"type": "boolean"}, STR]}
_DURATION = obj(count=COUNT, ns=COUNT)


def _request_parameters(**known: Schema) -> Schema:
    return {"type": "object", "nullable": True, "properties": known,
            "description": "Name to value; names not listed here are accepted and ignored."}


def _infer_request() -> Schema:
    shared_memory = {"description": "Shared memory is not supported: any value is a 501."}
    tensor = {
        "type": "object", "required": ["name", "shape", "datatype"],
        "properties": {
            "name": STR,
            "shape": {"type": "array", "maxItems": 32, "items": COUNT},
            "datatype": ref("Datatype"),
            "parameters": _request_parameters(
                binary_data_size={**nullable(COUNT), "description": "Binary extension: this many "
                                  "bytes after the JSON header (and the ones before): the data."},
                max_tokens={"type": "integer", "minimum": 1, "description": "On `text_pair` (a "
                            "text classifier's): each row cut to its first this many tokens."},
                shared_memory_region=shared_memory),
            "data": ref("TensorData"),
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
            classification={"type": "integer", "minimum": 1, "description": "Classification "
                            "extension: the output's k best classes instead, as BYTES "
                            "\"score:index:label\" ([N, k]); a 400 for an output that is "
                            "not numeric."}),
    }}
    return {
        "type": "object", "required": ["inputs"],
        "properties": {
            "id": nullable(STR),
            "parameters": _request_parameters(
                timeout={**nullable(COUNT), "maximum": 2**64 - 1, "description": "Microseconds "
                         "the request may wait in the batch queue (0: no limit); then a 503."},
                binary_data_output={"description": "true: every output binary (unless "
                                    "its own `binary_data` says otherwise)."}),
            "inputs": {"type": "array", "minItems": 1, "items": tensor},
            "outputs": {"type": "array", "nullable": True, "items": output},
        },
    }


def _infer_response() -> Schema:
    out_tensor = {
        "type": "object", "required": ["name", "datatype", "shape"],
        "additionalProperties": False,
        "properties": {
            "name": STR, "datatype": ref("Datatype"), "shape": array(COUNT),
            "data": array({"anyOf": [nullable({"type": "number"}), BOOL, STR]}),
            "parameters": obj(binary_data_size=COUNT),
        },
        "description": "Flat row-major `data`, or (a binary output) `binary_data_size`. A "
                       "NaN or infinite float has no JSON form and is sent as null.",
    }
    return {
        "type": "object", "required": ["model_name", "model_version", "outputs"],
        "additionalProperties": False,
        "properties": {"model_name": STR, "model_version": STR, "id": STR,
                       "outputs": array(out_tensor)},
    }


def _model_status() -> Schema:
    """One model in /admin/status."""
    replica = obj(index=COUNT, device=STR, state={"enum": ["loading", "ready", "draining"]},
                   in_flight=COUNT, queued=COUNT, inline=BOOL, batches=COUNT, requests=COUNT,
                   measured_bytes=nullable(COUNT), loaded_at=nullable(TIME))
    scaling = obj(min=COUNT, max=COUNT, strategy=STR, target_queue=SECONDS,
                   scale_up_after_s=SECONDS, scale_down_after_s=SECONDS, devices=array(STR),
                   intra_op_threads=COUNT, desired=nullable(COUNT), blocked=nullable(STR),
                   last_error=nullable(STR), **counts("added", "removed", "failures"))
    mean = nullable({"type": "number"})
    batching = obj(enabled=BOOL, max_batch_size=COUNT, max_delay_s=SECONDS, max_queue=COUNT,
                    inline=BOOL, **counts("batches", "requests", "rows"),
                    mean_requests_per_batch=mean, mean_rows_per_batch=mean,
                    largest_batch=COUNT, mean_queue_wait_ms=mean, mean_run_ms=mean,
                    **counts("queue_timeouts", "queue_full", "dropped"))
    return obj(
        name=STR, origin={"enum": ["config", "repository", "modelmesh"]},
        format=nullable(STR), device=STR, pinned=BOOL, state=ref("State"), reason=STR,
        replicas=COUNT, replica_details=array(replica), scaling=scaling, in_flight=COUNT,
        queued=COUNT, last_used=nullable(TIME), expires_at=nullable(TIME),
        idle_timeout_s=nullable(SECONDS), predicted_bytes=nullable(COUNT),
        measured_bytes=nullable(COUNT), resident_bytes=COUNT, last_load_ms=mean,
        **counts("loads", "load_failures", "requests", "errors"), batching=batching,
        keep_alive=nullable(keep_alive_status()))


def _admin_status() -> Schema:
    by_name = {"type": "object", "additionalProperties": COUNT}
    return obj(
        server=obj(name=STR, version=STR, started_at=TIME, uptime_s=SECONDS, draining=BOOL),
        devices=array(obj(name=STR, **counts(
            "total_bytes", "budget_bytes", "used_bytes", "reserved_bytes",
            "process_bytes"))),
        evictions=by_name, auth_refusals=by_name,
        recent_events=array(obj(time=TIME, kind=STR, model=nullable(STR), detail=STR)),
        models=array(_model_status()),
        process=obj(pid=COUNT, rss_bytes=COUNT, open_fds=nullable(COUNT),
                    threads=nullable(COUNT), asyncio_tasks=nullable(COUNT)))


def _model_statistics() -> Schema:
    """One model in Triton's statistics extension."""
    return obj(
        name=STR, version=STR, last_inference=COUNT, inference_count=COUNT, execution_count=COUNT,
        inference_stats=obj(**dict.fromkeys(
            ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss"), _DURATION)),
        batch_stats=array(obj(batch_size=COUNT, compute_input=_DURATION,
                                compute_infer=_DURATION, compute_output=_DURATION)),
        memory_usage={"type": "array", "maxItems": 0},
        response_stats={"type": "object", "maxProperties": 0})


def schemas() -> dict[str, Schema]:
    return {
        "Error": obj(error=STR),
        "Datatype": {"enum": DATATYPES},
        "State": {"enum": ["UNLOADED", "LOADING", "READY", "UNLOADING", "FAILED"]},
        "ServerMetadata": obj(name=STR, version=STR, extensions=array(STR)),
        "TensorMetadata": obj(name=STR, datatype=ref("Datatype"),
                               shape=array({"type": "integer", "minimum": -1})),
        "ModelMetadata": obj(name=STR, versions=array(STR),
                              platform={"enum": ["onnxruntime_onnx", "pytorch_safetensors"]},
                              inputs=array(ref("TensorMetadata")),
                              outputs=array(ref("TensorMetadata"))),
        "ModelReady": obj(name=STR, ready=BOOL),
        "TensorData": {"anyOf": [_SCALAR, array({"$ref": "#/components/schemas/TensorData"})]},
        "InferRequest": _infer_request(),
        "InferResponse": _infer_response(),
        "IndexEntry": obj(name=STR, version=STR, state=ref("State"), reason=STR),
        "Statistics": obj(model_stats=array(_model_statistics())),
        "AdminStatus": _admin_status(),
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
            "binary tensor data extensions, Triton's statistics extension, SnoozeML's own "
            "endpoints, OpenAI's embeddings (/v1), Cohere's and TEI's rerank. Every error body "
            "is `{\"error\": \"...\"}`, but OpenAI's, Cohere's or TEI's on theirs. Every GET "
            "answers HEAD. With auth off (no `[auth]` table), no operation needs "
            "credentials. See docs/http-api.md.")},
        "paths": paths(),
        "components": {
            "schemas": {**schemas(), **openapi_openai.schemas(), **openapi_rerank.schemas()},
            "headers": headers,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "An API key or a JWT"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }
