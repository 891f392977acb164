"""The rerank routes in the OpenAPI document (api/http/rerank.py): Cohere's `/v1/rerank` and
`/v2/rerank` (Jina's shape too) and Text Embeddings Inference's `/rerank`, each with its own
request, answer and error object."""

from __future__ import annotations

from typing import Any

from snoozeml.api.openapi.parts import COUNT, STR, Schema, answer, array, obj, ref

_ERRORS = {
    "400": "The body is not JSON, or a field is wrong: `query` missing or empty, `documents` "
           "empty, of the wrong type or more than `max_rerank_documents`, `top_n` below 1, "
           "no `model` while the server has several rerankers; or the model does not rerank "
           "(it is not a sequence classifier that takes text, or has more than one label).",
    "401": "Auth is on and the credentials are missing, invalid or expired.",
    "403": "The credential's role is too low for this operation.",
    "404": "No such model, or no `model` named and no model on the server reranks.",
    "413": "The body (or its inflated form) is larger than `max_request_size`.",
    "422": "A field is of the wrong type or value (`texts` more than `max_rerank_documents`, "
           "`truncation_direction` not right, no `model` while the server has several "
           "rerankers): TEI's validation error.",
    "500": "The model raised while running the request; the daemon keeps serving.",
    "503": "The model is FAILED, still loading after `load_timeout`, has no memory to load, "
           "its queue is full, or the server is shutting down.",
}
_TEI_400 = ("The body is not JSON, `texts` is empty (`error_type` `Empty`), or the model does "
            "not rerank.")
_HEADERS = {"401": "WWW-Authenticate", "503": "Retry-After"}
_COMMON = ("400", "401", "403", "404", "413", "500", "503")


def _op(operation: str, summary: str, ok: Schema, error: str, codes: tuple[str, ...],
        suffix: str = "", **extra: Any) -> Schema:
    responses = {"200": ok}
    for code in sorted(codes):
        text = _TEI_400 if error == "TeiError" and code == "400" else _ERRORS[code]
        response = answer(text, ref(error))
        if code in _HEADERS:
            name = _HEADERS[code]
            response["headers"] = {name: {"$ref": f"#/components/headers/{name}"}}
        responses[code] = response
    return {"operationId": operation + suffix, "summary": summary, "tags": ["rerank"],
            "x-operation": operation, "responses": responses, **extra}


def _body(schema: str) -> Schema:
    return {"required": True, "content": {"application/json": {"schema": ref(schema)}}}


def paths() -> dict[str, Schema]:
    def cohere(suffix: str = "") -> Schema:
        return _op("rerank", "Cohere's rerank (Jina's shape too); the model loads first if it "
                   "is not loaded", answer("The documents best first (`top_n` of them)",
                                           ref("RerankResults")),
                   "RerankError", _COMMON, suffix, requestBody=_body("RerankRequest"))

    tei = _op("tei_rerank", "Text Embeddings Inference's rerank",
              answer("The texts best first", array(ref("TeiRank"))), "TeiError",
              (*_COMMON, "422"), requestBody=_body("TeiRerankRequest"))
    return {
        "/v1/rerank": {"post": cohere()},
        "/v2/rerank": {"post": cohere("_v2")},
        "/rerank": {"post": tei},
    }


_POSITIVE = {"type": "integer", "minimum": 1, "nullable": True}
_FLAG = {"type": "boolean", "nullable": True}
_MODEL = {"type": "string", "minLength": 1, "nullable": True,
          "description": "Left out: the server's one reranker."}


def schemas() -> dict[str, Schema]:
    return {**_cohere_schemas(), **_tei_schemas()}


def _cohere_schemas() -> dict[str, Schema]:
    positive, flag = _POSITIVE, _FLAG
    document = {"type": "object", "required": ["text"], "properties": {"text": STR},
                "description": "Its other fields come back with it."}
    return {
        "RerankRequest": {
            "type": "object", "required": ["query", "documents"],
            "description": "Fields not listed here are accepted and ignored. "
                           "`max_tokens_per_doc` cuts each document to its first tokens "
                           "before it is paired with the query; the model's `max_length` "
                           "then truncates each pair. `max_chunks_per_doc` is checked, not "
                           "used: a document is never split into chunks.",
            "properties": {
                "model": _MODEL,
                "query": {"type": "string", "minLength": 1},
                "documents": {"type": "array", "minItems": 1,
                              "items": {"oneOf": [STR, document]}},
                "top_n": positive,
                "return_documents": flag,
                "max_tokens_per_doc": {**positive, "description": "The tokens (the model's "
                                       "tokenizer's) each document keeps, from its start."},
                "max_chunks_per_doc": {**positive, "description": "Checked, not used."},
                "rank_fields": {"type": "array", "minItems": 1, "maxItems": 1,
                                "items": {"enum": ["text"]}, "nullable": True},
            },
        },
        "RerankResults": _without_usage_required(obj(
            id=STR,
            results=array({
                "type": "object", "required": ["index", "relevance_score"],
                "additionalProperties": False,
                "properties": {"index": COUNT,
                               "relevance_score": {"type": "number", "minimum": 0,
                                                   "maximum": 1},
                               "document": {"type": "object", "required": ["text"],
                                            "properties": {"text": STR}}}}),
            meta=obj(api_version=obj(version={"enum": ["1", "2"]}),
                     billed_units=obj(search_units=COUNT)),
            model=STR,
            usage=obj(total_tokens=COUNT))),
        "RerankError": obj(message=STR, detail=STR),
    }


def _without_usage_required(schema: Schema) -> Schema:
    """`usage` comes only from a model that counts its tokens (a `token_count` output)."""
    schema["required"].remove("usage")
    return schema


def _tei_schemas() -> dict[str, Schema]:
    flag = _FLAG
    return {
        "TeiRerankRequest": {
            "type": "object", "required": ["query", "texts"],
            "description": "Fields not listed here are accepted and ignored. `truncate` is "
                           "checked; the model's entry decides (`truncate`, `max_length`).",
            "properties": {
                "model": _MODEL,
                "query": {"type": "string", "minLength": 1},
                "texts": {"type": "array", "minItems": 1, "items": STR},
                "raw_scores": flag,
                "return_text": flag,
                "truncate": flag,
                "truncation_direction": {"enum": ["right", "Right"], "nullable": True},
            },
        },
        "TeiRank": {
            "type": "object", "required": ["index", "score"], "additionalProperties": False,
            "properties": {"index": COUNT, "score": {"type": "number"}, "text": STR}},
        "TeiError": obj(error=STR, error_type={"enum": ["Unhealthy", "Backend", "Overloaded",
                                                        "Validation", "Tokenizer", "Empty"]}),
    }
