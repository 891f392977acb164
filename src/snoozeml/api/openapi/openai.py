"""The OpenAI-compatible routes in the OpenAPI document (api/http/openai.py): their own request and
answer shapes, and OpenAI's error object instead of the OIP routes' `{"error": "..."}`."""

from __future__ import annotations

from typing import Any

from snoozeml.api.openapi.parts import COUNT, STR, Schema, answer, array, get_op, nullable, obj, ref

_ERRORS = {
    "400": "The body is not JSON, or a field is wrong (`param` names it): an empty or mixed "
           "`input`, more than `max_embedding_inputs` items, a text longer than the model "
           "takes with `truncate = false`, `dimensions` the model does not allow.",
    "401": "Auth is on and the credentials are missing, invalid or expired.",
    "403": "The credential's role is too low for this operation.",
    "404": "No such model, or a model that does not make embeddings (`/v1/models/{name}`: "
           "nor reranks; `code`: `model_not_found`).",
    "413": "The body (or its inflated form) is larger than `max_request_size`.",
    "500": "The model raised while running the request; the daemon keeps serving.",
    "503": "The model is FAILED, still loading after `load_timeout`, has no memory to load, "
           "its queue is full, or the server is shutting down.",
}
_HEADERS = {"401": "WWW-Authenticate", "503": "Retry-After"}


def _op(operation: str, summary: str, ok: Schema, *errors: str, **extra: Any) -> Schema:
    responses = {"200": ok}
    for code in sorted(("401", "403", *errors)):
        response = answer(_ERRORS[code], ref("OpenAIError"))
        if code in _HEADERS:
            name = _HEADERS[code]
            response["headers"] = {name: {"$ref": f"#/components/headers/{name}"}}
        responses[code] = response
    return {"operationId": operation, "summary": summary, "tags": ["openai"],
            "x-operation": operation, "responses": responses, **extra}


def paths() -> dict[str, Schema]:
    body = {"required": True, "content": {"application/json": {"schema": ref(
        "EmbeddingRequest")}}}
    embeddings = _op("embeddings", "OpenAI's embeddings (the model loads first if it is not "
                     "loaded)", answer("One embedding per input, in order",
                                       ref("EmbeddingList")),
                     "400", "404", "413", "500", "503", requestBody=body)
    models = _op("openai_models", "The models that make embeddings or rerank, in OpenAI's shape",
                 answer("The list", obj(object={"enum": ["list"]},
                                        data=array(ref("OpenAIModel")))))
    model = _op("openai_models", "One model that makes embeddings or reranks, in OpenAI's shape",
                answer("The model", ref("OpenAIModel")), "404")
    name = {"name": "name", "in": "path", "required": True,
            "schema": {"type": "string", "minLength": 1}, "description": "The model."}
    return {
        "/v1/embeddings": {"post": embeddings},
        "/v1/models": get_op(models),
        "/v1/models/{name}": {**get_op(model, "_one"), "parameters": [name]},
    }


def schemas() -> dict[str, Schema]:
    token_ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
    strings = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}
    return {
        "EmbeddingRequest": {
            "type": "object", "required": ["model", "input"],
            "description": "Fields not listed here are accepted and ignored.",
            "properties": {
                "model": {"type": "string", "minLength": 1},
                "input": {"oneOf": [
                    {"type": "string", "minLength": 1}, strings, token_ids,
                    {"type": "array", "minItems": 1, "items": token_ids}]},
                "encoding_format": {"enum": ["float", "base64"], "nullable": True},
                "dimensions": {"type": "integer", "minimum": 1, "nullable": True},
                "user": STR,
            },
        },
        "EmbeddingList": obj(
            object={"enum": ["list"]},
            data=array(obj(object={"enum": ["embedding"]}, index=COUNT, embedding={
                "oneOf": [array({"type": "number"}), {"type": "string", "format": "byte"}]})),
            model=STR,
            usage=obj(prompt_tokens=COUNT, total_tokens=COUNT)),
        "OpenAIModel": obj(id=STR, object={"enum": ["model"]}, created=COUNT, owned_by=STR,
                           capabilities=array({"enum": ["embeddings", "rerank"]})),
        "OpenAIError": obj(error=obj(message=STR, type=STR, param=nullable(STR),
                                     code=nullable(STR))),
    }
