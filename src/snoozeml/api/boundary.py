"""The one request boundary both transports share.

Every public operation, over HTTP (the fast path and the Starlette routes alike) and gRPC,
starts a `Call` here and ends it here: `succeeded`, `cancelled` (the client left), or `failed`
with the exception that ended it. `failed` is the one place that turns an error into an answer
(the HTTP status, the gRPC code, the message, and Retry-After or its gRPC trailers); each
transport only writes that answer in its own framing. Every ending is published as one
`RequestFinished` event, which is what the request log, the counters of `/admin/status` (and
later metrics) read: no transport logs or counts a request itself. `Call.authorize` checks the
caller's credentials against the role the call's operation needs (auth/authenticator.py's one
table), first
thing in every handler, on both transports alike.

Domain errors never carry transport codes: the mapping is `ERRORS`, below.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

import grpc

from snoozeml.auth.authenticator import Authenticator, PermissionDenied, Unauthenticated
from snoozeml.engine.events import EventBus, RequestFinished
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
    describe_exception,
)
from snoozeml.operations import OPERATIONS, Access, Operation

_Code = grpc.StatusCode
CALL = "snoozeml.call"  # where an HTTP handler finds its Call in the ASGI scope


@dataclass(frozen=True, slots=True)
class ErrorKind:
    outcome: str  # the `outcome` of RequestFinished (and later the metrics label)
    http_status: int
    grpc_code: grpc.StatusCode


# Most specific first; the first class an error is an instance of wins.
ERRORS: tuple[tuple[type[SnoozeError], ErrorKind], ...] = (
    (Unauthenticated, ErrorKind("unauthenticated", 401, _Code.UNAUTHENTICATED)),
    (PermissionDenied, ErrorKind("forbidden", 403, _Code.PERMISSION_DENIED)),
    (InvalidInput, ErrorKind("invalid_input", 400, _Code.INVALID_ARGUMENT)),
    (ModelNotFound, ErrorKind("not_found", 404, _Code.NOT_FOUND)),
    (RequestTooLarge, ErrorKind("too_large", 413, _Code.RESOURCE_EXHAUSTED)),
    (QueueFull, ErrorKind("queue_full", 503, _Code.RESOURCE_EXHAUSTED)),
    (Unsupported, ErrorKind("unsupported", 501, _Code.UNIMPLEMENTED)),
    (Unavailable, ErrorKind("unavailable", 503, _Code.UNAVAILABLE)),
    (BackendError, ErrorKind("backend_error", 500, _Code.INTERNAL)),
    (ConfigError, ErrorKind("config_error", 500, _Code.INTERNAL)),
)
# A SnoozeError the table does not name, and any other exception (a bug: logged with its
# traceback at debug level).
OTHER_DOMAIN_ERROR = ErrorKind("error", 500, _Code.INTERNAL)
UNEXPECTED = ErrorKind("internal", 500, _Code.INTERNAL)
CLIENT_CLOSED = 499  # the status a cancelled call is recorded with (nginx's)


def error_kind(exc: BaseException) -> ErrorKind:
    if not isinstance(exc, SnoozeError):
        return UNEXPECTED
    for kind, found in ERRORS:
        if isinstance(exc, kind):
            return found
    return OTHER_DOMAIN_ERROR


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """How a failed call is answered, for either transport to write."""

    outcome: str  # the error's kind, as ErrorKind.outcome
    http_status: int
    grpc_code: grpc.StatusCode
    message: str
    retry_after: int | None  # whole seconds, at least 1, for errors worth retrying
    challenge: str | None = None  # WWW-Authenticate, for a call without valid credentials

    def http_headers(self) -> dict[str, str]:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.challenge is not None:
            headers["WWW-Authenticate"] = self.challenge
        return headers

    def grpc_trailers(self) -> tuple[tuple[str, str], ...]:
        """`retry-after` (seconds, as HTTP's header) and `grpc-retry-pushback-ms`, which a
        gRPC client with a retry policy honours before its next attempt."""
        if self.retry_after is None:
            return ()
        return (("retry-after", str(self.retry_after)),
                ("grpc-retry-pushback-ms", str(self.retry_after * 1000)))


def answer_for(exc: BaseException) -> ErrorAnswer:
    """The answer to a call that ended with `exc`. Pure: no logging, no event."""
    kind = error_kind(exc)
    if isinstance(exc, SnoozeError):
        message = exc.message
    else:
        message = f"internal error: {describe_exception(exc)}"
    retry_after = None
    if isinstance(exc, Unavailable):
        retry_after = max(1, math.ceil(exc.retry_after))
    challenge = None
    if isinstance(exc, Unauthenticated):  # RFC 6750: say why only when a token was given
        challenge = "Bearer" if exc.reason == "missing" else 'Bearer error="invalid_token"'
    return ErrorAnswer(kind.outcome, kind.http_status, kind.grpc_code, message, retry_after,
                       challenge)


class Call:
    """One request between its start and its answer. End it exactly once."""

    __slots__ = ("_auth", "_boundary", "_events", "counted", "model", "operation", "principal",
                 "protocol", "started")

    def __init__(
        self, boundary: RequestBoundary, operation: Operation, protocol: str,
        model: str | None,
    ) -> None:
        self._boundary = boundary
        self._events = boundary.events
        self._auth = boundary.auth
        self.counted = False  # whether a drain waits for it (set by the boundary)
        self.operation = operation
        self.protocol = protocol
        self.model = model
        self.principal: str | None = None  # who called, once known (a key's name, a subject)
        self.started = time.perf_counter()

    @property
    def checks_credentials(self) -> bool:
        """Whether `authorize` looks at credentials at all (auth is on)."""
        return self._auth.enabled

    def authorize(self, authorization: str | None, api_key: str | None) -> None:
        """Check the caller (the `Authorization` and `X-API-Key` values, or gRPC's metadata
        of those names) may run this call's operation; raises Unauthenticated or
        PermissionDenied, which `failed` answers 401/403 (UNAUTHENTICATED/PERMISSION_DENIED).
        A no-op with auth off and for the public probes."""
        if not self._auth.enabled:
            return
        try:
            principal = self._auth.check(self.operation, authorization, api_key)
        except PermissionDenied as exc:
            self.principal = exc.principal or None
            raise
        if principal is not None:
            self.principal = principal.name or None

    def succeeded(self, status: int = 200) -> None:
        """Answered as asked (`status`: the HTTP status it had, e.g. 503 for "not ready")."""
        self._finish("ok", status, None)

    def cancelled(self) -> None:
        """The client went away (or the server cut the call off) before an answer."""
        self._finish("cancelled", CLIENT_CLOSED, None)

    def failed(self, exc: BaseException) -> ErrorAnswer:
        """The answer for `exc`; the failure is published (and so logged) once, here."""
        answer = answer_for(exc)
        if answer.outcome == UNEXPECTED.outcome:
            logging.getLogger("snoozeml").debug("traceback", exc_info=exc)
        self._finish(answer.outcome, answer.http_status, answer.message)
        return answer

    def _finish(self, outcome: str, status: int, error: str | None) -> None:
        if self.counted:
            self._boundary.ended()
        self._events.publish(RequestFinished(
            self.operation, self.protocol, self.model, outcome, status,
            time.perf_counter() - self.started, error, self.principal,
        ))


# Calls a drain does not wait for: probes, health streams (which end by themselves), and calls
# begun once the drain has (the work they ask for is refused: they end at once).
PROBES = frozenset(op for op, spec in OPERATIONS.items() if spec.access is Access.PROBE)


class RequestBoundary:
    def __init__(self, events: EventBus, auth: Authenticator | None = None) -> None:
        self.events = events
        self.auth = auth or Authenticator.from_config(None, {})
        self.active = 0  # calls a drain waits for, begun and not ended
        self.draining = False
        self._idle: asyncio.Event | None = None

    def begin(self, operation: Operation, protocol: str, model: str | None = None) -> Call:
        call = Call(self, operation, protocol, model)
        if operation not in PROBES and not self.draining:
            call.counted = True
            self.active += 1
        return call

    def ended(self) -> None:
        self.active -= 1
        if self.active == 0 and self._idle is not None:
            self._idle.set()

    async def drained(self) -> None:
        """From now on, return once every call begun before is over (probes aside)."""
        self.draining = True
        await self._quiet()

    async def _quiet(self) -> None:
        while self.active:
            self._idle = asyncio.Event()
            await self._idle.wait()
            self._idle = None
