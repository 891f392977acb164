"""Schemathesis hooks for tests/integration/test_fuzz_http.py, loaded by its `st run` through
SCHEMATHESIS_HOOKS: the binary tensor extension as a body schemathesis can generate, and two
checks of our own. Self-contained: schemathesis imports it by path, outside pytest."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import schemathesis

HEADER = "Inference-Header-Content-Length"
# The tests' own media type, for a generated request to go out in the binary tensor extension.
BINARY_FORM = "application/x-snooze-oip-binary"
BROKEN = "broken"  # the model that cannot load: its 503s are documented answers
ELEMENT_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
                 "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}


def binary_request(value: Any) -> tuple[bytes, int]:
    """A generated request in the binary tensor extension, and its JSON header's length: each
    input's `raw` (its bytes, or its BYTES strings) goes after the header, as its
    `binary_data_size` says. A request too broken for that (negative cases) goes as JSON."""
    try:
        return _binary_request(value)
    except (KeyError, TypeError, AttributeError, ValueError):
        text = json.dumps(value, default=repr).encode()
        return text, len(text)


def _binary_request(value: Any) -> tuple[bytes, int]:
    header = json.loads(json.dumps(value))
    blobs = []
    for tensor in header["inputs"]:
        raw = tensor.pop("raw")
        if tensor["datatype"] == "BYTES":
            blob = b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in raw)
        else:
            blob = bytes(raw)
        tensor["parameters"] = {"binary_data_size": len(blob)}
        blobs.append(blob)
    text = json.dumps(header).encode()
    return text + b"".join(blobs), len(text)


@schemathesis.serializer(BINARY_FORM)
def oip_binary(context: schemathesis.SerializationContext, value: Any) -> bytes:
    return binary_request(value)[0]


@schemathesis.hook
def before_call(context: schemathesis.HookContext, case: schemathesis.Case,
                kwargs: dict[str, Any]) -> None:
    """The binary form's header (a serializer gives only the body)."""
    if case.media_type == BINARY_FORM:
        case.headers = {**(case.headers or {}), HEADER: str(binary_request(case.body)[1])}


@schemathesis.check
def no_server_fault(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case,
) -> bool | None:
    """`not_a_server_error`, but for the documented 503s: the broken model's, and a request
    whose `timeout` ran out in the queue."""
    if response.status_code < 500:
        return None
    name = (case.path_parameters or {}).get("name")
    queue_timeout = response.content.startswith(b'{"error":"queue timeout:')
    if response.status_code != 503 or (name != BROKEN and not queue_timeout):
        raise AssertionError(f"{response.status_code} {response.content[:500]!r}")
    return True


@schemathesis.check
def infer_answer_adds_up(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case,
) -> bool | None:
    """A 200 inference answer holds each output's elements as its shape says: in JSON, or
    after the JSON header as exactly the bytes its `binary_data_size` says."""
    if response.status_code != 200 or not case.path.endswith("/infer"):
        return None
    body = response.content
    if response.headers.get("content-type", [""])[0] == "application/octet-stream":
        length = int(response.headers[HEADER.lower()][0])
        header = json.loads(body[:length])
        sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]
                 if "data" not in o]
        if not sizes or sum(sizes) != len(body) - length:
            raise AssertionError(f"binary outputs of {sizes} bytes, {len(body) - length} sent")
    else:
        if HEADER.lower() in response.headers:
            raise AssertionError(f"{HEADER} on a JSON answer")
        header = json.loads(body)
    for output in header["outputs"]:
        count = math.prod(output["shape"])
        if "data" in output:
            if len(output["data"]) != count or "parameters" in output:
                raise AssertionError(f"{output} does not hold its shape's {count} elements")
        elif output["datatype"] != "BYTES":  # a BYTES element's size is its own
            size = output["parameters"]["binary_data_size"]
            if size != count * ELEMENT_BYTES[output["datatype"]]:
                raise AssertionError(f"{output} does not hold its shape's {count} elements")
    return True
