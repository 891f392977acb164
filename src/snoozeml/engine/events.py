"""What happens in the engine, as typed events on one bus.

The engine publishes; logs, counters (and later metrics, the dashboard and the autoscaler)
subscribe. Nothing in the engine counts or logs these things in place. Whoever waits for
"something changed" (memory admission waiting for room, health Watch streams) waits on
`EventBus.changed()`, which the events that change state set.

Invariants:
- Events are published on the event loop, synchronously: a subscriber sees them in order, and
  the state they describe is already in place when it runs.
- An event is a value: nobody changes it once published. (They are not frozen dataclasses
  only because those cost five times as much to build, and three are built per request.)
- A subscriber that raises is logged and skipped; it never fails the publisher.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from snoozeml.engine.lifecycle import State
from snoozeml.errors import describe_exception
from snoozeml.logs import log_event
from snoozeml.operations import Operation


@dataclass(slots=True)
class EngineEvent:
    """Base of every event. `wakes`: whether it may free memory or change what a health
    check answers, i.e. whether `changed()` waiters should look again."""

    wakes: ClassVar[bool] = False


# --- lifecycle --------------------------------------------------------------------------------


@dataclass(slots=True)
class StateChanged(EngineEvent):
    wakes: ClassVar[bool] = True
    model: str
    state: State
    reason: str


@dataclass(slots=True)
class LoadStarted(EngineEvent):
    """Memory was admitted and the backend starts building the instance."""

    model: str
    replica: int
    device: str
    path: str


@dataclass(slots=True)
class LoadFinished(EngineEvent):
    model: str
    replica: int
    device: str
    seconds: float  # from admission to a running replica; waiting for memory is not loading
    bytes: int  # measured on the device
    reserved_bytes: int = 0  # what admission held for the load (its expected peak)
    peak_bytes: int | None = None  # the real peak above the use before the load, when known


@dataclass(slots=True)
class LoadFailed(EngineEvent):
    """The model is FAILED until `retry_in` seconds have passed (or an explicit load)."""

    model: str
    error: str
    retry_in: float
    seconds: float


@dataclass(slots=True)
class LoadDeferred(EngineEvent):
    """No memory could be freed in time: the model is back to UNLOADED, not broken."""

    model: str
    error: str


@dataclass(slots=True)
class Unloaded(EngineEvent):
    wakes: ClassVar[bool] = True
    model: str
    reason: str  # idle, admin, memory_pressure, oom, shutdown
    freed_bytes: int


@dataclass(slots=True)
class ModelAdded(EngineEvent):
    """A model registered at run time (not from models.toml): by ModelMesh's loadModel or the
    repository extension's load with a path. Not loaded yet."""

    wakes: ClassVar[bool] = True
    model: str
    origin: str  # "repository" or "modelmesh"
    path: str


@dataclass(slots=True)
class ModelRemoved(EngineEvent):
    """A model added at run time was unloaded and forgotten: its name is unknown from now."""

    wakes: ClassVar[bool] = True
    model: str
    origin: str


@dataclass(slots=True)
class ModelIdle(EngineEvent):
    """The model's last lease ended: it may be evicted now."""

    wakes: ClassVar[bool] = True
    model: str


# --- replicas (beyond the first load, which the lifecycle events describe) --------------------


@dataclass(slots=True)
class ReplicaAdded(EngineEvent):
    """One more replica serves the model (its load was LoadStarted/LoadFinished)."""

    model: str
    replica: int
    device: str
    replicas: int  # ready replicas now


@dataclass(slots=True)
class ReplicaFailed(EngineEvent):
    """A replica could not be added: memory refused it (`memory`) or its load failed. The
    model keeps serving on the replicas it has. `first`: the first of an episode of such
    failures (it ends when a replica is added, or the model stops wanting one)."""

    model: str
    error: str
    memory: bool
    first: bool


@dataclass(slots=True)
class ReplicaDraining(EngineEvent):
    """A replica gets no new requests; it closes once it has finished those it holds."""

    model: str
    replica: int
    replicas: int  # ready replicas now


@dataclass(slots=True)
class ReplicaRemoved(EngineEvent):
    wakes: ClassVar[bool] = True
    model: str
    replica: int
    device: str
    freed_bytes: int
    replicas: int  # ready replicas now


# --- memory -----------------------------------------------------------------------------------


@dataclass(slots=True)
class ReplicaUpgraded(EngineEvent):
    """A replica swapped in the faster form of its model (onnx: pre-packed weights) that its
    load left for later; requests kept running meanwhile."""

    model: str
    replica: int
    device: str
    seconds: float
    bytes: int  # the replica's measured size now


@dataclass(slots=True)
class UpgradeDeferred(EngineEvent):
    """The upgrade did not happen now (memory did not admit it, or it failed); the replica
    keeps serving as it was."""

    model: str
    replica: int
    reason: str
    retry: bool  # whether a later batch may try again


@dataclass(slots=True)
class SideRoomReleased(EngineEvent):
    """Background work of `model` (writing a cache entry) ended and gave back the room it
    held: a load waiting for memory looks again."""

    wakes: ClassVar[bool] = True
    model: str
    device: str
    bytes: int


@dataclass(slots=True)
class Evicting(EngineEvent):
    """Idle models unloaded (reason memory_pressure) to make room for `model`'s load."""

    model: str
    device: str
    needed_bytes: int
    victims: tuple[str, ...]


@dataclass(slots=True)
class OomRetry(EngineEvent):
    """`model` ran out of memory while loading or running: every idle model on its device is
    unloaded (reason oom) and the load or batch is tried once more."""

    model: str
    device: str
    phase: str  # "load" or "run"
    error: str
    victims: tuple[str, ...]


# --- batching ---------------------------------------------------------------------------------


@dataclass(slots=True)
class BatchRun(EngineEvent):
    model: str
    replica: int
    rows: int
    queue_seconds: tuple[float, ...]  # one per request, in batch order
    run_seconds: float
    inline: bool  # ran on the event loop (see engine/batching/inline.py)
    ok: bool = True  # False: the run raised, and its requests were answered with the error


@dataclass(slots=True)
class QueueFull(EngineEvent):
    model: str
    queued: int


@dataclass(slots=True)
class QueueTimedOut(EngineEvent):
    """A request's own `timeout` passed while it was queued; it never ran."""

    model: str


@dataclass(slots=True)
class RequestDropped(EngineEvent):
    """A queued request's client went away; it never ran."""

    model: str


@dataclass(slots=True)
class InferenceStarted(EngineEvent):
    """A decoded inference request for a known model reached the engine (requests refused
    before, as undecodable, are only RequestFinished)."""

    model: str


@dataclass(slots=True)
class InferenceFailed(EngineEvent):
    """That request ended with an error (a client that left is not one); the error itself is
    in the RequestFinished of its call."""

    model: str


@dataclass(slots=True)
class BatchingDisabled(EngineEvent):
    model: str
    reason: str


@dataclass(slots=True)
class InlineDisabled(EngineEvent):
    model: str
    reason: str


# --- server and requests ----------------------------------------------------------------------


@dataclass(slots=True)
class Draining(EngineEvent):
    wakes: ClassVar[bool] = True


@dataclass(slots=True)
class RequestFinished(EngineEvent):
    """One public operation answered (or abandoned), from the transports' shared boundary."""

    operation: Operation
    protocol: str  # "http" or "grpc"
    model: str | None
    outcome: str  # "ok", "cancelled", or the error kind: "invalid_input", "unavailable", ...
    status: int  # the HTTP status it was (or would be) answered with; 499 when cancelled
    seconds: float
    error: str | None = None
    principal: str | None = None  # the caller, when auth knows it (a key's name, a subject)


Subscriber = Callable[[EngineEvent], None]


class EventBus:
    def __init__(self) -> None:
        self._subscriptions: list[tuple[Subscriber, frozenset[type[EngineEvent]] | None]] = []
        self._routes: dict[type[EngineEvent], tuple[Subscriber, ...]] = {}
        self._changed: asyncio.Event | None = None

    def subscribe(
        self, subscriber: Subscriber, kinds: Iterable[type[EngineEvent]] | None = None
    ) -> Callable[[], None]:
        """Call `subscriber` with every event from now on (only those of `kinds`, when given);
        returns the unsubscribe."""
        entry = (subscriber, frozenset(kinds) if kinds is not None else None)
        self._subscriptions.append(entry)
        self._routes.clear()

        def unsubscribe() -> None:
            if entry in self._subscriptions:
                self._subscriptions.remove(entry)
                self._routes.clear()

        return unsubscribe

    def subscribe_each(
        self, handlers: Mapping[type[EngineEvent], Callable[[Any], None]]
    ) -> Callable[[], None]:
        """Subscribe one handler per kind of event, each called with events of its kind only
        (no dispatch of its own per event); returns the unsubscribe of them all."""
        cancels = [self.subscribe(handler, (kind,)) for kind, handler in handlers.items()]

        def unsubscribe() -> None:
            for cancel in cancels:
                cancel()

        return unsubscribe

    def publish(self, event: EngineEvent) -> None:
        kind = type(event)
        routes = self._routes.get(kind)
        if routes is None:
            routes = self._routes[kind] = tuple(
                subscriber for subscriber, kinds in self._subscriptions
                if kinds is None or kind in kinds
            )
        for subscriber in routes:
            try:
                subscriber(event)
            except Exception as exc:  # a subscriber's bug must not fail the engine
                log_event("event_subscriber_failed", logging.ERROR,
                          kind=kind.__name__, error=describe_exception(exc))
        if event.wakes and self._changed is not None:
            changed, self._changed = self._changed, None
            changed.set()

    def changed(self) -> asyncio.Event:
        """An event set by the next state-changing event. Take it *before* reading the state
        it guards, so a change in between is not missed."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed
