"""The domain error tree. Transports map these to HTTP status / gRPC codes in one table each.

    SnoozeError
    ├── ConfigError            invalid models.toml / environment (one line per problem)
    ├── ModelNotFound          no model of that name (or version)
    ├── ModelTooLarge          the model cannot fit its device's budget at all
    ├── InvalidInput           the request does not fit the model (names, dtypes, shapes, data)
    ├── RequestTooLarge        body over max_request_size
    ├── Unsupported            a feature the server does not implement
    ├── Unavailable            try again later (carries retry_after seconds)
    │   ├── ModelLoadFailed    the model is FAILED; message is the load error
    │   ├── LoadTimeout        the load did not finish within load_timeout
    │   ├── QueueFull          the model's queue is at max_queue
    │   ├── QueueTimeout       the request's own timeout expired while queued
    │   ├── MemoryExhausted    nothing could give way in time for a load (or an OOM retry)
    │   └── ShuttingDown       the daemon is draining
    └── BackendError           the backend raised while running a request (a 500)

Domain errors never carry transport codes.
"""

from __future__ import annotations


class SnoozeError(Exception):
    """Base of every error SnoozeML raises on purpose."""

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(SnoozeError):
    """The configuration is invalid; `problems` holds one readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class ModelNotFound(SnoozeError):
    pass


class InvalidInput(SnoozeError):
    pass


class ModelTooLarge(SnoozeError):
    pass


class RequestTooLarge(SnoozeError):
    pass


class Unsupported(SnoozeError):
    pass


class Unavailable(SnoozeError):
    """Temporarily unable to serve; clients should retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = max(retry_after, 0.0)


class ModelLoadFailed(Unavailable):
    pass


class LoadTimeout(Unavailable):
    pass


class QueueFull(Unavailable):
    pass


class QueueTimeout(Unavailable):
    pass


class ShuttingDown(Unavailable):
    pass


class MemoryExhausted(Unavailable):
    pass


class BackendError(SnoozeError):
    """The backend raised while running a request. The daemon keeps serving."""


def describe_exception(exc: BaseException) -> str:
    """`Type: message` for an exception that is not one of ours (logs, 500 bodies)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
