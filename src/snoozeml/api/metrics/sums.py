"""The sums behind `/metrics` (api/metrics/prometheus.py): histograms counted per bucket, and every
series
the event bus adds to, as plain dicts keyed by their label values (on the event loop only)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from snoozeml.engine.keepalive.events import CAUSES, PREWARM_OUTCOMES
from snoozeml.operations import Operation

if TYPE_CHECKING:
    from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric

DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0, 30.0)
LOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                300.0)
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)

PROTOCOLS = ("http", "grpc")
LOAD_RESULTS = ("ok", "failed", "deferred")
UNLOAD_REASONS = ("idle", "memory_pressure", "oom", "admin", "shutdown", "removed")
REPLICA_EVENTS = ("added", "removed", "failed")
AUTH_REASONS = ("unauthenticated", "forbidden")  # RequestFinished outcomes
EVICTION_REASONS = ("memory_pressure", "oom")
QUEUE_DROPS = ("full", "timeout", "client_gone")

K = TypeVar("K")

# The fields of Sums whose keys begin with a model label.
_BY_MODEL = ("requests", "request_seconds", "queue_seconds", "run_seconds", "batch_rows",
             "load_seconds", "loads", "unloads", "replica_events", "queue_drops", "cold_starts",
             "prewarms")


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
    cold_starts: dict[tuple[str, str], int]
    prewarms: dict[tuple[str, str], int]

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
            cold_starts=dict.fromkeys(_pairs(models, CAUSES), 0),
            prewarms=dict.fromkeys(_pairs(models, PREWARM_OUTCOMES), 0),
        )

    def add_label(self, label: str) -> None:
        """The zero series of a model label added at run time (those it has already stay)."""
        zero = Sums.zero([label])
        for name in _BY_MODEL:
            mine: dict[Any, Any] = getattr(self, name)
            for key, value in getattr(zero, name).items():
                mine.setdefault(key, value)

    def drop_label(self, label: str) -> None:
        """Every series of a model label that no model has any more."""
        for name in _BY_MODEL:
            series: dict[Any, Any] = getattr(self, name)
            for key in [k for k in series if (k[0] if isinstance(k, tuple) else k) == label]:
                del series[key]

    def copy(self) -> Sums:
        def each(histograms: dict[K, Histogram]) -> dict[K, Histogram]:  # the shown ones
            return {key: histogram.copy() for key, histogram in histograms.items()
                    if any(histogram.counts)}

        return Sums(
            dict(self.requests), each(self.request_seconds), each(self.queue_seconds),
            each(self.run_seconds), each(self.batch_rows), each(self.load_seconds),
            dict(self.loads), dict(self.unloads), dict(self.replica_events),
            dict(self.queue_drops), dict(self.auth_failures), dict(self.evictions),
            dict(self.cold_starts), dict(self.prewarms),
        )

    def families(self) -> Iterator[Metric]:
        """Every series as Prometheus families (prometheus_client is imported by the first
        scrape, not by counting)."""
        from prometheus_client.metrics_core import CounterMetricFamily

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
        yield _counter("snooze_cold_starts", "Models loaded from cold (their first replica), "
                       "by cause: a request found it unloaded (request), the adaptive "
                       "keep-alive pre-warmed it (prewarm), an explicit load, preload at "
                       "start, or ModelMesh placed it.", ("model", "cause"), self.cold_starts)
        yield _counter("snooze_prewarms", "Pre-warms of the adaptive keep-alive that a request "
                       "used, that nobody used before the model unloaded (wasted), or that "
                       "never loaded (skipped: the pre-warm budget, memory).",
                       ("model", "outcome"), self.prewarms)


# --- helpers ----------------------------------------------------------------------------------


def _pairs(firsts: Iterable[str], seconds: Iterable[str]) -> list[tuple[str, str]]:
    return [(first, second) for first in firsts for second in seconds]


def _histograms(keys: Iterable[K], bounds: tuple[float, ...]) -> dict[K, Histogram]:
    return {key: Histogram(bounds) for key in keys}


def count_in(counts: dict[K, int], key: K, amount: int = 1) -> None:
    counts[key] = counts.get(key, 0) + amount


def histogram_in(histograms: dict[K, Histogram], key: K, bounds: tuple[float, ...]) -> Histogram:
    found = histograms.get(key)
    if found is None:  # a label value not created at start (none is expected)
        found = histograms[key] = Histogram(bounds)
    return found


def _label_values(key: object) -> tuple[str, ...]:
    """A series' label values from its key: a tuple of them, or the one value."""
    return tuple(map(str, key)) if isinstance(key, tuple) else (str(key),)


def _histogram_family(name: str, documentation: str, labels: tuple[str, ...],
                      histograms: Mapping[K, Histogram]) -> HistogramMetricFamily:
    from prometheus_client.metrics_core import HistogramMetricFamily

    family = HistogramMetricFamily(name, documentation, labels=labels)
    for key, histogram in sorted(histograms.items(), key=lambda item: _label_values(item[0])):
        if any(histogram.counts):  # shown from its first observation
            family.add_metric(_label_values(key), histogram.buckets(), histogram.total)
    return family


def _counter(name: str, documentation: str, labels: tuple[str, ...],
             counts: Mapping[K, int]) -> CounterMetricFamily:
    from prometheus_client.metrics_core import CounterMetricFamily

    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, count in sorted(counts.items(), key=lambda item: _label_values(item[0])):
        family.add_metric(_label_values(key), count)
    return family
