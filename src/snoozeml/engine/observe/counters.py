"""The counters `/admin/status` shows, kept by one subscriber of the event bus.

Nothing else in the engine counts: the service, the batcher and the replica set publish what
happened, and this module sums it. Metrics subscribe to the same events and keep
distributions (every event carries its own durations), so the two never disagree about what
happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from snoozeml.engine.events import (
    BatchRun,
    EventBus,
    Evicting,
    InferenceFailed,
    InferenceStarted,
    LoadFailed,
    LoadFinished,
    ModelAdded,
    ModelRemoved,
    OomRetry,
    QueueFull,
    QueueTimedOut,
    ReplicaAdded,
    ReplicaFailed,
    ReplicaRemoved,
    RequestDropped,
    RequestFinished,
)


@dataclass(slots=True)
class ModelCounters:
    requests: int = 0  # inference requests that reached the model (decoded, model known),
    # counted as they arrive
    errors: int = 0  # of those, answered with an error (a client that left is not one)
    loads: int = 0
    load_failures: int = 0
    last_load_ms: float | None = None
    batches: int = 0
    batched_requests: int = 0
    rows: int = 0
    largest_batch: int = 0
    queue_wait_s: float = 0.0
    run_s: float = 0.0
    queue_timeouts: int = 0
    queue_full: int = 0
    dropped: int = 0
    replica_batches: dict[int, int] = field(default_factory=dict)  # replica index -> batches
    replica_requests: dict[int, int] = field(default_factory=dict)  # replica index -> requests
    replicas_added: int = 0
    replicas_removed: int = 0
    replica_failures: int = 0


class _ByModel(dict[str, ModelCounters]):
    def __missing__(self, name: str) -> ModelCounters:
        return ModelCounters()  # a late event of a model removed at run time: kept nowhere


class Counters:
    """`subscribe` it to the bus; read `model(name)` and `evictions`."""

    def __init__(self, models: Iterable[str]) -> None:
        self._models = _ByModel((name, ModelCounters()) for name in models)
        self.evictions: dict[str, int] = {}
        self.auth_refusals: dict[str, int] = {}  # "unauthenticated" / "forbidden" -> calls

    def subscribe(self, bus: EventBus) -> Callable[[], None]:
        return bus.subscribe_each({
            InferenceStarted: self._started,
            InferenceFailed: self._failed,
            BatchRun: self._batch,
            LoadFinished: self._loaded,
            LoadFailed: self._load_failed,
            QueueFull: self._queue_full,
            QueueTimedOut: self._timed_out,
            RequestDropped: self._dropped,
            Evicting: self._evicting,
            OomRetry: self._oom,
            ReplicaAdded: self._replica_added,
            ReplicaRemoved: self._replica_removed,
            ReplicaFailed: self._replica_failed,
            RequestFinished: self._finished,
            ModelAdded: self._added,
            ModelRemoved: self._removed,
        })

    def _added(self, event: ModelAdded) -> None:
        self._models[event.model] = ModelCounters()

    def _removed(self, event: ModelRemoved) -> None:
        self._models.pop(event.model, None)

    def model(self, name: str) -> ModelCounters:
        return self._models[name]

    def _started(self, event: InferenceStarted) -> None:
        self._models[event.model].requests += 1

    def _failed(self, event: InferenceFailed) -> None:
        self._models[event.model].errors += 1

    def _batch(self, event: BatchRun) -> None:
        counters = self._models[event.model]
        requests = len(event.queue_seconds)
        counters.batches += 1
        counters.batched_requests += requests
        counters.rows += event.rows
        counters.largest_batch = max(counters.largest_batch, requests)
        counters.queue_wait_s += sum(event.queue_seconds)
        counters.run_s += event.run_seconds
        replica = event.replica
        counters.replica_batches[replica] = counters.replica_batches.get(replica, 0) + 1
        counters.replica_requests[replica] = counters.replica_requests.get(replica, 0) + requests

    def _loaded(self, event: LoadFinished) -> None:
        counters = self._models[event.model]
        counters.loads += 1
        counters.last_load_ms = event.seconds * 1000.0

    def _load_failed(self, event: LoadFailed) -> None:
        self._models[event.model].load_failures += 1

    def _queue_full(self, event: QueueFull) -> None:
        self._models[event.model].queue_full += 1

    def _timed_out(self, event: QueueTimedOut) -> None:
        self._models[event.model].queue_timeouts += 1

    def _dropped(self, event: RequestDropped) -> None:
        self._models[event.model].dropped += 1

    def _replica_added(self, event: ReplicaAdded) -> None:
        self._models[event.model].replicas_added += 1

    def _replica_removed(self, event: ReplicaRemoved) -> None:
        self._models[event.model].replicas_removed += 1

    def _replica_failed(self, event: ReplicaFailed) -> None:
        self._models[event.model].replica_failures += 1

    def _finished(self, event: RequestFinished) -> None:
        outcome = event.outcome
        if outcome == "unauthenticated" or outcome == "forbidden":
            self.auth_refusals[outcome] = self.auth_refusals.get(outcome, 0) + 1

    def _evicting(self, event: Evicting) -> None:
        self._evicted("memory_pressure", len(event.victims))

    def _oom(self, event: OomRetry) -> None:
        self._evicted("oom", len(event.victims))

    def _evicted(self, reason: str, count: int) -> None:
        if count:
            self.evictions[reason] = self.evictions.get(reason, 0) + count
