"""Prometheus metrics for `GET /metrics`, on a registry the daemon owns (never the global one).

Two sources, and no counting anywhere else:
- the event bus: `EventSums` adds up what the boundary and the engine publish (requests,
  batches, loads, unloads, replica changes, evictions) as it happens;
- the engine's `StatusSnapshot`, read when Prometheus scrapes, for what is true now (state,
  queues, memory): api/metrics/gauges.py.
Every series, the process and Python collectors included, is listed in docs/metrics.md.

Label values come from the configuration and from this code, never from a request: an event's
model is looked up among the models' names (configured, or added at run time: a removed model's
series go with it), and anything else (a request for a model that does not exist) is counted
under the model "". `per_model = false` maps every model to "".

Invariants: events are published on the event loop, and the sums are read there too (a scrape
copies them, and takes its snapshot, before formatting the copy on a thread), so they are plain
ints and lists, without locks. An event costs a dict lookup and an add per series (measured in
bench/run.py metrics); histograms are cumulated when scraped, not when observed. Counting needs
nothing of prometheus_client: the registry and its collectors are built, and the client
imported, at the first scrape (on the loop), so a daemon never scraped never loads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from snoozeml.api.metrics.gauges import ModelLabels, SnapshotGauges, gauge_families
from snoozeml.api.metrics.sums import (
    BATCH_BUCKETS,
    DURATION_BUCKETS,
    LOAD_BUCKETS,
    PROTOCOLS,
    Histogram,
    Sums,
    count_in,
    histogram_in,
)
from snoozeml.engine.events import (
    BatchRun,
    EventBus,
    Evicting,
    LoadDeferred,
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
    Unloaded,
)
from snoozeml.engine.keepalive.events import ColdStart, Prewarm
from snoozeml.engine.observe.snapshots import StatusSnapshot

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric


class EventSums:
    """The bus subscriber that keeps `sums`, and a Prometheus collector of them."""

    def __init__(self, names: Sequence[str], labels: ModelLabels) -> None:
        self._labels = labels
        self._model = labels.of
        self.sums = Sums.zero(labels.values())
        # What a request's and a batch's events touch, found with one lookup by the event's
        # own model name. Only the models' names (and None) are keys: a name from a request
        # never grows these.
        self._per_request: dict[tuple[str | None, str], tuple[str, Histogram]] = {}
        self._per_batch: dict[str, tuple[Histogram, Histogram, Histogram]] = {}
        for name in (*names, None):
            self._index(name)

    def _index(self, name: str | None) -> None:
        sums, label = self.sums, self._model(name)
        for protocol in PROTOCOLS:
            self._per_request[name, protocol] = (label, sums.request_seconds[label, protocol])
        if name is not None:
            self._per_batch[name] = (sums.queue_seconds[label], sums.run_seconds[label],
                                     sums.batch_rows[label])

    def _added(self, event: ModelAdded) -> None:
        self.sums.add_label(self._labels.add(event.model))
        self._index(event.model)

    def _removed(self, event: ModelRemoved) -> None:
        for protocol in PROTOCOLS:
            self._per_request.pop((event.model, protocol), None)
        self._per_batch.pop(event.model, None)
        gone = self._labels.remove(event.model)
        if gone is not None:
            self.sums.drop_label(gone)

    def subscribe(self, bus: EventBus) -> Callable[[], None]:
        sums, model, count = self.sums, self._model, count_in
        return bus.subscribe_each({
            RequestFinished: self._finished,
            BatchRun: self._batch,
            LoadFinished: self._loaded,
            LoadFailed: lambda e: count(sums.loads, (model(e.model), "failed")),
            LoadDeferred: lambda e: count(sums.loads, (model(e.model), "deferred")),
            Unloaded: lambda e: count(sums.unloads, (model(e.model), e.reason)),
            ReplicaAdded: lambda e: count(sums.replica_events, (model(e.model), "added")),
            ReplicaRemoved: lambda e: count(sums.replica_events, (model(e.model), "removed")),
            ReplicaFailed: lambda e: count(sums.replica_events, (model(e.model), "failed")),
            QueueFull: lambda e: count(sums.queue_drops, (model(e.model), "full")),
            QueueTimedOut: lambda e: count(sums.queue_drops, (model(e.model), "timeout")),
            RequestDropped: lambda e: count(sums.queue_drops, (model(e.model), "client_gone")),
            Evicting: lambda e: count(sums.evictions, "memory_pressure", len(e.victims)),
            OomRetry: lambda e: count(sums.evictions, "oom", len(e.victims)),
            ColdStart: lambda e: count(sums.cold_starts, (model(e.model), e.cause)),
            Prewarm: self._prewarm,
            ModelAdded: self._added,
            ModelRemoved: self._removed,
        })

    # --- per event: the hot ones (every request, every batch) first --------------------------

    def _finished(self, event: RequestFinished) -> None:
        protocol = event.protocol
        found = self._per_request.get((event.model, protocol))
        if found is None:  # a model no one configured, or a new protocol
            label = self._model(event.model)
            found = label, histogram_in(self.sums.request_seconds, (label, protocol),
                                      DURATION_BUCKETS)
        label, seconds = found
        key = (label, protocol, event.operation, event.status)
        requests = self.sums.requests
        requests[key] = requests.get(key, 0) + 1
        seconds.observe(event.seconds)
        outcome = event.outcome
        if outcome == "unauthenticated" or outcome == "forbidden":
            count_in(self.sums.auth_failures, (protocol, outcome))

    def _batch(self, event: BatchRun) -> None:
        found = self._per_batch.get(event.model)
        if found is None:  # never expected: the engine only runs configured models
            label = self._model(event.model)
            found = (histogram_in(self.sums.queue_seconds, label, DURATION_BUCKETS),
                     histogram_in(self.sums.run_seconds, label, DURATION_BUCKETS),
                     histogram_in(self.sums.batch_rows, label, BATCH_BUCKETS))
        queue, run, rows = found
        for seconds in event.queue_seconds:
            queue.observe(seconds)
        run.observe(event.run_seconds)
        rows.observe(event.rows)

    def _prewarm(self, event: Prewarm) -> None:
        if event.outcome != "started":
            count_in(self.sums.prewarms, (self._model(event.model), event.outcome))

    def _loaded(self, event: LoadFinished) -> None:
        label = self._model(event.model)
        count_in(self.sums.loads, (label, "ok"))
        histogram_in(self.sums.load_seconds, label, LOAD_BUCKETS).observe(event.seconds)

    # --- as a collector (on the event loop) --------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        return self.sums.families()

    def describe(self) -> Iterator[Metric]:
        """The families without samples, for the registry's check of duplicate names."""
        for family in Sums.zero(()).families():
            family.samples = []
            yield family


class _Scrape:
    """One scrape's values, taken on the event loop and formatted off it."""

    def __init__(self, sums: Sums, snapshot: StatusSnapshot, labels: ModelLabels,
                 runtime: CollectorRegistry) -> None:
        self._sums = sums
        self._snapshot = snapshot
        self._labels = labels
        self._runtime = runtime

    def collect(self) -> Iterator[Metric]:
        yield from self._sums.families()
        yield from gauge_families(self._snapshot, self._labels)
        yield from self._runtime.collect()


class Metrics:
    """The daemon's registry: event sums, snapshot gauges, and the process and Python
    collectors. `subscribe` before the first request; `scrape` (or `render`) on the loop.
    The registries are built by the first of `scrape`, `render` or `registry`."""

    def __init__(self, models: Iterable[str], snapshot: Callable[[], StatusSnapshot],
                 per_model: bool = True) -> None:
        names = list(models)
        self._labels = ModelLabels(names, per_model)
        self._snapshot = snapshot
        self._events = EventSums(names, self._labels)
        self._registries: tuple[CollectorRegistry, CollectorRegistry] | None = None

    @property
    def content_type(self) -> str:
        from prometheus_client import CONTENT_TYPE_LATEST

        return CONTENT_TYPE_LATEST

    @property
    def registry(self) -> CollectorRegistry:
        """Every series: the event sums, the snapshot gauges and the runtime's."""
        return self._built()[0]

    def _built(self) -> tuple[CollectorRegistry, CollectorRegistry]:
        """The registry, and the runtime's own (the process, not the models: safe to collect
        off the loop), built once."""
        if self._registries is None:
            from prometheus_client import (
                CollectorRegistry,
                GCCollector,
                PlatformCollector,
                ProcessCollector,
            )

            runtime = CollectorRegistry()
            ProcessCollector(registry=runtime)
            PlatformCollector(registry=runtime)
            GCCollector(registry=runtime)  # a no-op where the interpreter lacks gc stats
            registry = CollectorRegistry()
            registry.register(self._events)
            registry.register(SnapshotGauges(self._snapshot, self._labels))
            registry.register(runtime)
            self._registries = registry, runtime
        return self._registries

    def subscribe(self, bus: EventBus) -> Callable[[], None]:
        return self._events.subscribe(bus)

    def render(self) -> bytes:
        """Every series now, in the Prometheus text format, formatted on the calling thread
        (the event loop's: the one that may read the sums and take snapshots)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """`render`, with only the copying on the event loop: formatting (about 10 µs a
        line, thousands of lines per hundred models) runs on a thread meanwhile."""
        from prometheus_client import generate_latest

        runtime = self._built()[1]
        frozen = _Scrape(self._events.sums.copy(), self._snapshot(), self._labels, runtime)
        return await asyncio.get_running_loop().run_in_executor(None, generate_latest, frozen)


