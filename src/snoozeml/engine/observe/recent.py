"""The last things that happened to the models, for `/admin/status` and the dashboard: one bus
subscriber keeps a bounded list of loads, load failures, unloads with their reason, evictions,
out-of-memory retries and replica changes, each with its wall-clock time and a line of detail.
Requests are not in it (metrics count those)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from snoozeml.engine.events import (
    BatchingDisabled,
    EngineEvent,
    EventBus,
    Evicting,
    LoadDeferred,
    LoadFailed,
    LoadFinished,
    OomRetry,
    ReplicaAdded,
    ReplicaFailed,
    ReplicaRemoved,
    Unloaded,
)
from snoozeml.units import format_bytes

RECENT_EVENTS = 100
Said = tuple[str, str | None, str]  # kind, model, detail
Describe = Callable[[Any], "Said | None"]


@dataclass(frozen=True, slots=True)
class RecentEvent:
    time: float  # epoch seconds
    kind: str  # as the log line's event name: model_loaded, model_unloaded, ...
    model: str | None
    detail: str


class RecentEvents:
    """`subscribe` it to the bus; `events()` is the last `limit`, oldest first."""

    def __init__(self, limit: int = RECENT_EVENTS, wall: Callable[[], float] = time.time) -> None:
        self._events: deque[RecentEvent] = deque(maxlen=limit)
        self._wall = wall

    def subscribe(self, bus: EventBus) -> Callable[[], None]:
        handlers: dict[type[EngineEvent], Callable[[Any], None]] = {
            kind: self._recorder(describe) for kind, describe in _DESCRIBE.items()
        }
        return bus.subscribe_each(handlers)

    def events(self) -> tuple[RecentEvent, ...]:
        return tuple(self._events)

    def _recorder(self, describe: Describe) -> Callable[[Any], None]:
        def record(event: Any) -> None:
            said = describe(event)
            if said is not None:
                kind, model, detail = said
                self._events.append(RecentEvent(self._wall(), kind, model, detail))

        return record


def _loaded(e: LoadFinished) -> tuple[str, str | None, str]:
    return ("model_loaded", e.model, f"replica {e.replica} on {e.device} in "
            f"{e.seconds * 1000:.0f} ms, {format_bytes(e.bytes)}")


def _load_failed(e: LoadFailed) -> tuple[str, str | None, str]:
    return "model_load_failed", e.model, f"{e.error} (retry in {e.retry_in:g}s)"


def _deferred(e: LoadDeferred) -> tuple[str, str | None, str]:
    return "model_load_deferred", e.model, e.error


def _unloaded(e: Unloaded) -> tuple[str, str | None, str]:
    return "model_unloaded", e.model, f"{e.reason}, freed {format_bytes(e.freed_bytes)}"


def _evicting(e: Evicting) -> tuple[str, str | None, str]:
    return ("memory_evicting", e.model, f"evicting {', '.join(e.victims)} on {e.device} to "
            f"make {format_bytes(e.needed_bytes)} of room")


def _oom(e: OomRetry) -> tuple[str, str | None, str]:
    victims = ", ".join(e.victims) or "nothing"
    return "memory_oom", e.model, f"out of memory while {e.phase}ing on {e.device}; evicting " \
        f"{victims}"


def _replica_added(e: ReplicaAdded) -> tuple[str, str | None, str]:
    return "replica_added", e.model, f"replica {e.replica} on {e.device}; {e.replicas} ready"


def _replica_removed(e: ReplicaRemoved) -> tuple[str, str | None, str]:
    return ("replica_removed", e.model, f"replica {e.replica} on {e.device}, freed "
            f"{format_bytes(e.freed_bytes)}; {e.replicas} ready")


def _replica_failed(e: ReplicaFailed) -> tuple[str, str | None, str] | None:
    if not e.first:
        return None  # once per episode, as the log says it
    return ("replica_refused" if e.memory else "replica_load_failed"), e.model, e.error


def _batching_disabled(e: BatchingDisabled) -> tuple[str, str | None, str]:
    return "batching_disabled", e.model, e.reason


_DESCRIBE: dict[type[EngineEvent], Describe] = {
    LoadFinished: _loaded,
    LoadFailed: _load_failed,
    LoadDeferred: _deferred,
    Unloaded: _unloaded,
    Evicting: _evicting,
    OomRetry: _oom,
    ReplicaAdded: _replica_added,
    ReplicaRemoved: _replica_removed,
    ReplicaFailed: _replica_failed,
    BatchingDisabled: _batching_disabled,
}
