"""Domain errors to transport codes: one table for HTTP status, one for gRPC status codes."""

from __future__ import annotations

import math

import grpc

from snoozeml.errors import (
    BackendError,
    ConfigError,
    InvalidInput,
    ModelNotFound,
    QueueFull,
    RequestTooLarge,
    SnoozeError,
    Unavailable,
    Unsupported,
)

# Most specific first; the first class the error is an instance of wins.
HTTP_STATUS: tuple[tuple[type[SnoozeError], int], ...] = (
    (InvalidInput, 400),
    (ModelNotFound, 404),
    (RequestTooLarge, 413),
    (Unsupported, 501),
    (QueueFull, 503),
    (Unavailable, 503),
    (BackendError, 500),
    (ConfigError, 500),
)


def http_status(error: SnoozeError) -> int:
    for kind, status in HTTP_STATUS:
        if isinstance(error, kind):
            return status
    return 500


def retry_after_header(error: SnoozeError) -> dict[str, str]:
    if isinstance(error, Unavailable):
        return {"Retry-After": str(max(1, math.ceil(error.retry_after)))}
    return {}


def grpc_status(error: SnoozeError) -> grpc.StatusCode:
    """The gRPC code for a domain error: the same classes, the same messages as HTTP."""
    for kind, code in GRPC_STATUS:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


# Most specific first, as HTTP_STATUS.
GRPC_STATUS: tuple[tuple[type[SnoozeError], grpc.StatusCode], ...] = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelNotFound, grpc.StatusCode.NOT_FOUND),
    (RequestTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Unsupported, grpc.StatusCode.UNIMPLEMENTED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (BackendError, grpc.StatusCode.INTERNAL),
    (ConfigError, grpc.StatusCode.INTERNAL),
)
