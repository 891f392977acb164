"""The building blocks of the OpenAPI document (api/openapi/document.py, api/openapi/openai.py)."""

from __future__ import annotations

from typing import Any

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


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def obj(**fields: Schema) -> Schema:
    """A response object: every field always sent, and no other."""
    schema: Schema = {"type": "object", "properties": fields, "additionalProperties": False}
    if fields:  # (OpenAPI 3.0: `required` is never empty)
        schema["required"] = list(fields)
    return schema


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def counts(*names: str) -> dict[str, Schema]:
    return dict.fromkeys(names, COUNT)


# --- answers --------------------------------------------------------------------------------

def answer(description: str, schema: Schema, media_type: str = "application/json") -> Schema:
    return {"description": description, "content": {media_type: {"schema": schema}}}



def get_op(op: Schema, suffix: str = "") -> Schema:
    """GET, and HEAD with the same statuses and headers but no body."""
    head = {**op, "operationId": f"{op['operationId']}{suffix}_head",
            "summary": f"{op['summary']} (headers only)",
            "responses": {code: {k: v for k, v in response.items() if k != "content"}
                          for code, response in op["responses"].items()}}
    return {"get": {**op, "operationId": op["operationId"] + suffix}, "head": head}


def post_op(op: Schema, suffix: str = "") -> Schema:
    return {"post": {**op, "operationId": op["operationId"] + suffix}}


def keep_alive_status() -> Schema:
    """A model's `keep_alive` in /admin/status (api/status.py)."""
    window = nullable(SECONDS)
    return obj(mode={"enum": ["fixed", "adaptive"]}, reason=nullable(STR),
               unload_after_s=window, prewarm_after_s=window, keep_until_s=window,
               prewarm_at=nullable(TIME), next_arrival_at=nullable(TIME), history=COUNT,
               loaded_by=nullable(STR), prewarms=obj(**counts("used", "wasted", "skipped")),
               idle_memory_byte_seconds=SECONDS)
