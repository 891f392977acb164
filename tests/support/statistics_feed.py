"""Triton statistics fed from events, with a wall clock fixed by the test: what the engine's
statistics tests and the wire format's tests (JSON, protobuf) both start from."""

from __future__ import annotations

from snoozeml.engine.events import EventBus, RequestFinished
from snoozeml.engine.observe.triton_statistics import Statistics
from snoozeml.operations import Operation

WALL = 1_700_000_000.25  # seconds since the epoch


def infer_finished(model: str | None, outcome: str, seconds: float,
                   protocol: str = "http") -> RequestFinished:
    status = {"ok": 200, "cancelled": 499, "invalid_input": 400}.get(outcome, 503)
    return RequestFinished(Operation.INFER, protocol, model, outcome, status, seconds)


def fed(*events: object) -> Statistics:
    statistics = Statistics(["m", "other"], wall=lambda: WALL)
    bus = EventBus()
    statistics.subscribe(bus)
    for event in events:
        bus.publish(event)  # type: ignore[arg-type]
    return statistics
