"""Prometheus metrics for `GET /metrics`, on a registry the daemon owns (never the global one).

Two sources, and no counting anywhere else:
- the event bus: `EventSums` adds up what the boundary and the engine publish (requests,
  batches, loads, unloads, replica changes, evictions) as it happens;
- the engine's `StatusSnapshot`, read when Prometheus scrapes, for what is true now (state,
  queues, memory): api/metrics_gauges.py.
Every series, the process and Python collectors included, is listed in docs/operations.md.

Label values come from the configuration and from this code, never from a request: an event's
model is looked up among the configured names, and anything else (a request for a model that
does not exist) is counted under the model "". `per_model = false` maps every model to "".

Invariants: events are published on the event loop, and the sums are read there too (a scrape
copies them, and takes its snapshot, before formatting the copy on a thread), so they are plain
ints and lists, without locks. An event costs a dict lookup and an add per series (measured in
bench/run_metrics.py); histograms are cumulated when scraped, not when observed.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric

from snoozeml.api.metrics_gauges import ModelLabels, SnapshotGauges, gauge_families
from snoozeml.engine.events import (
    BatchRun,
    EventBus,
    Evicting,
    LoadDeferred,
    LoadFailed,
    LoadFinished,
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
from snoozeml.engine.snapshots import StatusSnapshot
from snoozeml.operations import Operation

# Upper bounds (seconds, rows) of the histograms' buckets; +Inf is implied.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0, 30.0)
LOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                300.0)
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)

PROTOCOLS = ("http", "grpc")
LOAD_RESULTS = ("ok", "failed", "deferred")
UNLOAD_REASONS = ("idle", "memory_pressure", "oom", "admin", "shutdown")
REPLICA_EVENTS = ("added", "removed", "failed")
AUTH_REASONS = ("unauthenticated", "forbidden")  # RequestFinished outcomes
EVICTION_REASONS = ("memory_pressure", "oom")
QUEUE_DROPS = ("full", "timeout", "client_gone")

K = TypeVar("K")


class Histogram:
    """Observations counted per bucket; cumulated into Prometheus' `le` buckets at scrape."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # `le`: value <= bound
        self.total += value

    def copy(self) -> Histogram:
        twin = Histogram(self._bounds)
        twin.counts[:] = self.counts
        twin.total = self.total
        return twin

    def buckets(self) -> list[tuple[str, float]]:
        cumulative: list[tuple[str, float]] = []
        seen = 0
        for bound, count in zip((*map(repr, self._bounds), "+Inf"), self.counts, strict=True):
            seen += count
            cumulative.append((bound, seen))
        return cumulative


@dataclass(slots=True)
class Sums:
    """What the events added up to, by series. Plain data: `copy` it on the event loop, read
    the copy anywhere."""

    requests: dict[tuple[str, str, Operation, int], int]
    request_seconds: dict[tuple[str, str], Histogram]
    queue_seconds: dict[str, Histogram]
    run_seconds: dict[str, Histogram]
    batch_rows: dict[str, Histogram]
    load_seconds: dict[str, Histogram]
    loads: dict[tuple[str, str], int]
    unloads: dict[tuple[str, str], int]
    replica_events: dict[tuple[str, str], int]
    queue_drops: dict[tuple[str, str], int]
    auth_failures: dict[tuple[str, str], int]
    evictions: dict[str, int]

    @classmethod
    def zero(cls, models: Sequence[str]) -> Sums:
        """Every series a configured model label may have, at zero (histograms are shown
        from their first observation; counters from the start, so that `increase` sees their
        first step)."""
        everyone = sorted({*models, ""})  # server-level requests are the model ""
        return cls(
            requests={},
            request_seconds=_histograms(_pairs(everyone, PROTOCOLS), DURATION_BUCKETS),
            queue_seconds=_histograms(models, DURATION_BUCKETS),
            run_seconds=_histograms(models, DURATION_BUCKETS),
            batch_rows=_histograms(models, BATCH_BUCKETS),
            load_seconds=_histograms(models, LOAD_BUCKETS),
            loads=dict.fromkeys(_pairs(models, LOAD_RESULTS), 0),
            unloads=dict.fromkeys(_pairs(models, UNLOAD_REASONS), 0),
            replica_events=dict.fromkeys(_pairs(models, REPLICA_EVENTS), 0),
            queue_drops=dict.fromkeys(_pairs(models, QUEUE_DROPS), 0),
            auth_failures=dict.fromkeys(_pairs(PROTOCOLS, AUTH_REASONS), 0),
            evictions=dict.fromkeys(EVICTION_REASONS, 0),
        )

    def copy(self) -> Sums:
        def each(histograms: dict[K, Histogram]) -> dict[K, Histogram]:  # the shown ones
            return {key: histogram.copy() for key, histogram in histograms.items()
                    if any(histogram.counts)}

        return Sums(
            dict(self.requests), each(self.request_seconds), each(self.queue_seconds),
            each(self.run_seconds), each(self.batch_rows), each(self.load_seconds),
            dict(self.loads), dict(self.unloads), dict(self.replica_events),
            dict(self.queue_drops), dict(self.auth_failures), dict(self.evictions),
        )

    def families(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "snooze_requests", "Requests answered, by operation and HTTP status (gRPC calls "
            "too: the status their error maps to; 499: the client left).",
            labels=("model", "protocol", "operation", "code"))
        for (model, protocol, operation, status), count in sorted(self.requests.items()):
            requests.add_metric((model, protocol, operation.value, str(status)), count)
        yield requests
        yield _histogram_family(
            "snooze_request_duration_seconds", "Time from a request's start at the boundary "
            "to its answer, every operation.", ("model", "protocol"), self.request_seconds)
        yield _histogram_family(
            "snooze_queue_duration_seconds", "Time each request waited in a batch queue.",
            ("model",), self.queue_seconds)
        yield _histogram_family(
            "snooze_inference_duration_seconds", "Time each batch took to run.", ("model",),
            self.run_seconds)
        yield _histogram_family(
            "snooze_batch_size", "Rows per batch run.", ("model",), self.batch_rows)
        yield _histogram_family(
            "snooze_model_load_duration_seconds", "Time from a replica's memory admission to "
            "it serving (a cold start is its model's first replica's).", ("model",),
            self.load_seconds)
        yield _counter("snooze_model_loads", "Replica loads, by result.", ("model", "result"),
                       self.loads)
        yield _counter("snooze_model_unloads", "Models unloaded, by reason.",
                       ("model", "reason"), self.unloads)
        yield _counter("snooze_replica_events", "Replicas added beyond a load's own, drained "
                       "and removed, or refused (memory) and failed.", ("model", "event"),
                       self.replica_events)
        yield _counter("snooze_queue_dropped", "Requests that never ran: the queue was full, "
                       "their timeout passed in it, or their client left.",
                       ("model", "reason"), self.queue_drops)
        yield _counter("snooze_auth_failures", "Requests refused by authentication (401) or "
                       "authorisation (403).", ("protocol", "reason"), self.auth_failures)
        yield _counter("snooze_evictions", "Idle models unloaded to make room for another "
                       "(memory_pressure) or after an out-of-memory error (oom).", ("reason",),
                       self.evictions)


class EventSums:
    """The bus subscriber that keeps `sums`, and a Prometheus collector of them."""

    def __init__(self, names: Sequence[str], labels: ModelLabels) -> None:
        self._model = labels.of
        self.sums = sums = Sums.zero(labels.values())
        # What a request's and a batch's events touch, found with one lookup by the event's
        # own model name. Only configured names (and None) are keys: a name from a request
        # never grows these.
        self._per_request: dict[tuple[str | None, str], tuple[str, Histogram]] = {
            (name, protocol): (label, sums.request_seconds[label, protocol])
            for name in (*names, None) for label in [self._model(name)]
            for protocol in PROTOCOLS
        }
        self._per_batch: dict[str, tuple[Histogram, Histogram, Histogram]] = {
            name: (sums.queue_seconds[label], sums.run_seconds[label], sums.batch_rows[label])
            for name in names for label in [self._model(name)]
        }

    def subscribe(self, bus: EventBus) -> Callable[[], None]:
        sums, model, count = self.sums, self._model, _count
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
        })

    # --- per event: the hot ones (every request, every batch) first --------------------------

    def _finished(self, event: RequestFinished) -> None:
        protocol = event.protocol
        found = self._per_request.get((event.model, protocol))
        if found is None:  # a model no one configured, or a new protocol
            label = self._model(event.model)
            found = label, _histogram(self.sums.request_seconds, (label, protocol),
                                      DURATION_BUCKETS)
        label, seconds = found
        key = (label, protocol, event.operation, event.status)
        requests = self.sums.requests
        requests[key] = requests.get(key, 0) + 1
        seconds.observe(event.seconds)
        outcome = event.outcome
        if outcome == "unauthenticated" or outcome == "forbidden":
            _count(self.sums.auth_failures, (protocol, outcome))

    def _batch(self, event: BatchRun) -> None:
        found = self._per_batch.get(event.model)
        if found is None:  # never expected: the engine only runs configured models
            label = self._model(event.model)
            found = (_histogram(self.sums.queue_seconds, label, DURATION_BUCKETS),
                     _histogram(self.sums.run_seconds, label, DURATION_BUCKETS),
                     _histogram(self.sums.batch_rows, label, BATCH_BUCKETS))
        queue, run, rows = found
        for seconds in event.queue_seconds:
            queue.observe(seconds)
        run.observe(event.run_seconds)
        rows.observe(event.rows)

    def _loaded(self, event: LoadFinished) -> None:
        label = self._model(event.model)
        _count(self.sums.loads, (label, "ok"))
        _histogram(self.sums.load_seconds, label, LOAD_BUCKETS).observe(event.seconds)

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
    collectors. `subscribe` before the first request; `scrape` (or `render`) on the loop."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, models: Iterable[str], snapshot: Callable[[], StatusSnapshot],
                 per_model: bool = True) -> None:
        names = list(models)
        self._labels = labels = ModelLabels(names, per_model)
        self._snapshot = snapshot
        self._events = EventSums(names, labels)
        self._runtime = CollectorRegistry()  # the process, not the models: safe off the loop
        ProcessCollector(registry=self._runtime)
        PlatformCollector(registry=self._runtime)
        GCCollector(registry=self._runtime)  # a no-op where the interpreter lacks gc stats
        self.registry = CollectorRegistry()
        self.registry.register(self._events)
        self.registry.register(SnapshotGauges(snapshot, labels))
        self.registry.register(self._runtime)

    def subscribe(self, bus: EventBus) -> Callable[[], None]:
        return self._events.subscribe(bus)

    def render(self) -> bytes:
        """Every series now, in the Prometheus text format, formatted on the calling thread
        (the event loop's: the one that may read the sums and take snapshots)."""
        return generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """`render`, with only the copying on the event loop: formatting (about 10 µs a
        line, thousands of lines per hundred models) runs on a thread meanwhile."""
        frozen = _Scrape(self._events.sums.copy(), self._snapshot(), self._labels,
                         self._runtime)
        return await asyncio.get_running_loop().run_in_executor(None, generate_latest, frozen)


# --- helpers ----------------------------------------------------------------------------------


def _pairs(firsts: Iterable[str], seconds: Iterable[str]) -> list[tuple[str, str]]:
    return [(first, second) for first in firsts for second in seconds]


def _histograms(keys: Iterable[K], bounds: tuple[float, ...]) -> dict[K, Histogram]:
    return {key: Histogram(bounds) for key in keys}


def _count(counts: dict[K, int], key: K, amount: int = 1) -> None:
    counts[key] = counts.get(key, 0) + amount


def _histogram(histograms: dict[K, Histogram], key: K, bounds: tuple[float, ...]) -> Histogram:
    found = histograms.get(key)
    if found is None:  # a label value not created at start (none is expected)
        found = histograms[key] = Histogram(bounds)
    return found


def _label_values(key: object) -> tuple[str, ...]:
    """A series' label values from its key: a tuple of them, or the one value."""
    return tuple(map(str, key)) if isinstance(key, tuple) else (str(key),)


def _histogram_family(name: str, documentation: str, labels: tuple[str, ...],
                      histograms: Mapping[K, Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for key, histogram in sorted(histograms.items(), key=lambda item: _label_values(item[0])):
        if any(histogram.counts):  # shown from its first observation
            family.add_metric(_label_values(key), histogram.buckets(), histogram.total)
    return family


def _counter(name: str, documentation: str, labels: tuple[str, ...],
             counts: Mapping[K, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, count in sorted(counts.items(), key=lambda item: _label_values(item[0])):
        family.add_metric(_label_values(key), count)
    return family
