"""What happens in the engine, as typed events on one bus.

The engine publishes; logs, counters (and later metrics, the dashboard and the autoscaler)
subscribe. Nothing in the engine counts or logs these things in place. Whoever waits for
"something changed" (memory admission waiting for room, health Watch streams) waits on
`EventBus.changed()`, which the events that change state set.

Invariants:
- Events are published on the event loop, synchronously: a subscriber sees them in order, and
  the state they describe is already in place when it runs.
- A subscriber that raises is logged and skipped; it never fails the publisher.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from snoozeml.engine.lifecycle import State
from snoozeml.errors import describe_exception
from snoozeml.logs import log_event
from snoozeml.operations import Operation


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """Base of every event. `wakes`: whether it may free memory or change what a health
    check answers, i.e. whether `changed()` waiters should look again."""

    wakes: ClassVar[bool] = False


# --- lifecycle --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateChanged(EngineEvent):
    wakes: ClassVar[bool] = True
    model: str
    state: State
    reason: str


@dataclass(frozen=True, slots=True)
class LoadStarted(EngineEvent):
    """Memory was admitted and the backend starts building the instance."""

    model: str
    replica: int
    device: str
    path: str


@dataclass(frozen=True, slots=True)
class LoadFinished(EngineEvent):
    model: str
    replica: int
    device: str
    seconds: float  # from admission to a running replica; waiting for memory is not loading
    bytes: int  # measured on the device


@dataclass(frozen=True, slots=True)
class LoadFailed(EngineEvent):
    """The model is FAILED until `retry_in` seconds have passed (or an explicit load)."""

    model: str
    error: str
    retry_in: float
    seconds: float


@dataclass(frozen=True, slots=True)
class LoadDeferred(EngineEvent):
    """No memory could be freed in time: the model is back to UNLOADED, not broken."""

    model: str
    error: str


@dataclass(frozen=True, slots=True)
class Unloaded(EngineEvent):
    wakes: ClassVar[bool] = True
    model: str
    reason: str  # idle, admin, memory_pressure, oom, shutdown
    freed_bytes: int


@dataclass(frozen=True, slots=True)
class ModelIdle(EngineEvent):
    """The model's last lease ended: it may be evicted now."""

    wakes: ClassVar[bool] = True
    model: str


# --- memory -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evicting(EngineEvent):
    """Idle models unloaded (reason memory_pressure) to make room for `model`'s load."""

    model: str
    device: str
    needed_bytes: int
    victims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OomRetry(EngineEvent):
    """`model` ran out of memory while loading or running: every idle model on its device is
    unloaded (reason oom) and the load or batch is tried once more."""

    model: str
    device: str
    phase: str  # "load" or "run"
    error: str
    victims: tuple[str, ...]


# --- batching ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchRun(EngineEvent):
    model: str
    replica: int
    rows: int
    queue_seconds: tuple[float, ...]  # one per request, in batch order
    run_seconds: float
    inline: bool  # ran on the event loop (see engine/inline.py)


@dataclass(frozen=True, slots=True)
class QueueFull(EngineEvent):
    model: str
    queued: int


@dataclass(frozen=True, slots=True)
class QueueTimedOut(EngineEvent):
    """A request's own `timeout` passed while it was queued; it never ran."""

    model: str


@dataclass(frozen=True, slots=True)
class RequestDropped(EngineEvent):
    """A queued request's client went away; it never ran."""

    model: str


@dataclass(frozen=True, slots=True)
class BatchingDisabled(EngineEvent):
    model: str
    reason: str


@dataclass(frozen=True, slots=True)
class InlineDisabled(EngineEvent):
    model: str
    reason: str


# --- server and requests ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Draining(EngineEvent):
    wakes: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class RequestFinished(EngineEvent):
    """One public operation answered (or abandoned), from the transports' shared boundary."""

    operation: Operation
    protocol: str  # "http" or "grpc"
    model: str | None
    outcome: str  # "ok", "cancelled", or the error kind: "invalid_input", "unavailable", ...
    status: int  # the HTTP status it was (or would be) answered with; 499 when cancelled
    seconds: float
    error: str | None = None


Subscriber = Callable[[EngineEvent], None]


class EventBus:
    def __init__(self) -> None:
        self._subscribers: tuple[Subscriber, ...] = ()
        self._changed: asyncio.Event | None = None

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Call `subscriber` with every event from now on; returns the unsubscribe."""
        self._subscribers = (*self._subscribers, subscriber)

        def unsubscribe() -> None:
            self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

        return unsubscribe

    def publish(self, event: EngineEvent) -> None:
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception as exc:  # a subscriber's bug must not fail the engine
                log_event("event_subscriber_failed", logging.ERROR,
                          kind=type(event).__name__, error=describe_exception(exc))
        if event.wakes and self._changed is not None:
            changed, self._changed = self._changed, None
            changed.set()

    def changed(self) -> asyncio.Event:
        """An event set by the next state-changing event. Take it *before* reading the state
        it guards, so a change in between is not missed."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed
