"""The one table from domain errors to HTTP status codes (gRPC gets its own table)."""

from __future__ import annotations

import math

from snoozeml.errors import (
    BackendError,
    ConfigError,
    InvalidInput,
    ModelNotFound,
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
