"""The request boundary's one mapping from errors to answers, for each error kind and both
transports, and the one event it publishes for every call however it ends."""

from __future__ import annotations

import grpc
import pytest

from snoozeml.api.boundary import CLIENT_CLOSED, RequestBoundary, answer_for
from snoozeml.engine.events import EngineEvent, EventBus, RequestFinished
from snoozeml.errors import (
    BackendError,
    ConfigError,
    InvalidInput,
    LoadTimeout,
    MemoryExhausted,
    ModelLoadFailed,
    ModelNotFound,
    ModelTooLarge,
    QueueFull,
    QueueTimeout,
    RequestTooLarge,
    ShuttingDown,
    Unsupported,
)
from snoozeml.operations import Operation

Code = grpc.StatusCode

CASES = [
    # error, HTTP status, gRPC code, Retry-After seconds, outcome
    pytest.param(InvalidInput("bad shape"), 400, Code.INVALID_ARGUMENT, None, "invalid_input",
                 id="invalid-input"),
    pytest.param(ModelNotFound("unknown model 'x'"), 404, Code.NOT_FOUND, None, "not_found",
                 id="model-not-found"),
    pytest.param(RequestTooLarge("too big"), 413, Code.RESOURCE_EXHAUSTED, None, "too_large",
                 id="request-too-large"),
    pytest.param(QueueFull("full", retry_after=2.2), 503, Code.RESOURCE_EXHAUSTED, 3,
                 "queue_full", id="queue-full-rounds-its-retry-up"),
    pytest.param(Unsupported("no shm"), 501, Code.UNIMPLEMENTED, None, "unsupported",
                 id="unsupported"),
    pytest.param(ModelLoadFailed("broken", retry_after=0.2), 503, Code.UNAVAILABLE, 1,
                 "unavailable", id="load-failed-retries-after-at-least-a-second"),
    pytest.param(LoadTimeout("slow", retry_after=5.0), 503, Code.UNAVAILABLE, 5,
                 "unavailable", id="load-timeout"),
    pytest.param(QueueTimeout("late", retry_after=1.0), 503, Code.UNAVAILABLE, 1,
                 "unavailable", id="queue-timeout"),
    pytest.param(MemoryExhausted("no room", retry_after=5.0), 503, Code.UNAVAILABLE, 5,
                 "unavailable", id="memory-exhausted"),
    pytest.param(ShuttingDown("draining", retry_after=1.0), 503, Code.UNAVAILABLE, 1,
                 "unavailable", id="shutting-down"),
    pytest.param(BackendError("model 'm' failed to run"), 500, Code.INTERNAL, None,
                 "backend_error", id="backend-error"),
    pytest.param(ConfigError(["line 1: bad"]), 500, Code.INTERNAL, None, "config_error",
                 id="config-error"),
    pytest.param(ModelTooLarge("does not fit"), 500, Code.INTERNAL, None, "error",
                 id="a-domain-error-the-table-does-not-name"),
    pytest.param(RuntimeError("boom"), 500, Code.INTERNAL, None, "internal",
                 id="a-bug"),
]


@pytest.mark.parametrize(("error", "status", "code", "retry_after", "outcome"), CASES)
def test_each_error_kind_has_one_answer_for_both_transports(
    error: Exception, status: int, code: grpc.StatusCode, retry_after: int | None, outcome: str,
) -> None:
    answer = answer_for(error)
    assert (answer.http_status, answer.grpc_code, answer.retry_after) == \
        (status, code, retry_after)
    if retry_after is None:
        assert answer.http_headers() == {}
        assert answer.grpc_trailers() == ()
    else:
        assert answer.http_headers() == {"Retry-After": str(retry_after)}
        assert answer.grpc_trailers() == (("retry-after", str(retry_after)),
                                          ("grpc-retry-pushback-ms", str(retry_after * 1000)))


@pytest.mark.parametrize(("error", "status", "code", "retry_after", "outcome"), CASES)
def test_a_failed_call_publishes_one_event_with_its_outcome(
    error: Exception, status: int, code: grpc.StatusCode, retry_after: int | None, outcome: str,
) -> None:
    bus = EventBus()
    seen: list[EngineEvent] = []
    bus.subscribe(seen.append)
    call = RequestBoundary(bus).begin(Operation.INFER, "grpc", "m")

    answer = call.failed(error)

    assert len(seen) == 1
    event = seen[0]
    assert isinstance(event, RequestFinished)
    assert (event.operation, event.protocol, event.model) == (Operation.INFER, "grpc", "m")
    assert (event.outcome, event.status, event.error) == (outcome, status, answer.message)
    assert event.seconds >= 0


def test_messages_are_the_errors_own_and_a_bug_says_internal_error() -> None:
    assert answer_for(InvalidInput("input 'x': bad")).message == "input 'x': bad"
    assert answer_for(KeyError("k")).message == "internal error: KeyError: 'k'"
    assert answer_for(RuntimeError()).message == "internal error: RuntimeError"


def test_success_and_cancellation_are_published_too() -> None:
    bus = EventBus()
    seen: list[EngineEvent] = []
    bus.subscribe(seen.append)
    boundary = RequestBoundary(bus)

    boundary.begin(Operation.MODEL_READY, "http", "m").succeeded(503)  # "not ready" answered
    boundary.begin(Operation.INFER, "http", "m").cancelled()

    assert [(e.outcome, e.status) for e in seen if isinstance(e, RequestFinished)] == [
        ("ok", 503), ("cancelled", CLIENT_CLOSED),
    ]
