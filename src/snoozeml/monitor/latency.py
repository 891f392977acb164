"""Requests per second and p50 / p99 latency per model, from two scrapes of `/metrics`.

`snooze_request_duration_seconds{model,protocol}` is a cumulative histogram. Between two polls
the monitor subtracts the older scrape from the newer one (per bucket, summed over protocols)
and reads quantiles off the difference the way Prometheus' `histogram_quantile` does: find the
bucket holding the rank, then interpolate linearly within it. So the p99 of a window is only as
fine as the buckets around it, and one that falls in the `+Inf` bucket reads as the largest
finite bound.

Pure: no I/O, no Textual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

REQUEST_DURATION = "snooze_request_duration_seconds"


@dataclass(frozen=True)
class Histogram:
    """Cumulative counts: `buckets` holds (upper bound, requests at or below it), ascending,
    the last bound `+Inf` (so its count is the total)."""

    buckets: tuple[tuple[float, float], ...]

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0


@dataclass(frozen=True)
class Latency:
    """One model over one window between polls; the quantiles are None without requests."""

    per_s: float
    p50_s: float | None
    p99_s: float | None


def parse_histograms(text: str, metric: str = REQUEST_DURATION) -> dict[str, Histogram]:
    """The histogram `metric` of a Prometheus text exposition, per `model` label, summed over
    every other label (protocol). Series without a `model` label (the daemon's
    `per_model = false`) are left out. Raises ValueError for text that doesn't parse."""
    sums: dict[str, dict[float, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name != metric:
                continue
            for sample in family.samples:
                model = sample.labels.get("model")
                if sample.name != f"{metric}_bucket" or model is None or \
                        "le" not in sample.labels:
                    continue
                bound = float(sample.labels["le"])
                per_bound = sums.setdefault(model, {})
                per_bound[bound] = per_bound.get(bound, 0.0) + float(sample.value)
    except (ValueError, IndexError, KeyError) as exc:  # the parser's ways of saying "no"
        raise ValueError(f"not Prometheus text: {exc}") from exc
    return {model: Histogram(tuple(sorted(per_bound.items())))
            for model, per_bound in sums.items()}


def subtract(newer: Histogram, older: Histogram | None) -> Histogram | None:
    """What `newer` counted since `older`; None when the two can't be compared (the buckets
    differ, or a count went down: the daemon restarted and its counters began again)."""
    if older is None:
        return newer
    if [b for b, _ in newer.buckets] != [b for b, _ in older.buckets]:
        return None
    counts = [(bound, new - old) for (bound, new), (_, old) in zip(newer.buckets, older.buckets,
                                                                    strict=True)]
    if any(count < 0 for _, count in counts):
        return None
    return Histogram(tuple(counts))


def quantile(q: float, histogram: Histogram) -> float | None:
    """The q-quantile (0 ≤ q ≤ 1) in the histogram's unit, as Prometheus' histogram_quantile
    computes it; None when the histogram is empty or has no `+Inf` bucket."""
    buckets = histogram.buckets
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]) or histogram.count <= 0:
        return None
    # Cumulative counts must not go down; float sums can wobble (Prometheus evens them too).
    cumulative: list[tuple[float, float]] = []
    highest = 0.0
    for bound, count in buckets:
        highest = max(highest, count)
        cumulative.append((bound, highest))
    rank = q * histogram.count
    index = next(i for i, (_, count) in enumerate(cumulative) if count >= rank)
    if index == len(cumulative) - 1:
        return cumulative[-2][0]  # in the +Inf bucket: the largest finite bound
    end, count = cumulative[index]
    if index == 0:
        if end <= 0:
            return end
        start, below = 0.0, 0.0
    else:
        start, below = cumulative[index - 1]
    in_bucket = count - below
    if in_bucket <= 0:
        return end
    return start + (end - start) * (rank - below) / in_bucket


def window(newer: dict[str, Histogram], older: dict[str, Histogram],
           elapsed_s: float) -> dict[str, Latency]:
    """Per model, what happened between two scrapes `elapsed_s` apart. A model that can't be
    compared (a counter reset) is left out, and so is every model when no time passed."""
    if elapsed_s <= 0:
        return {}
    latencies: dict[str, Latency] = {}
    for model, histogram in newer.items():
        diff = subtract(histogram, older.get(model))
        if diff is None:
            continue
        latencies[model] = Latency(
            per_s=diff.count / elapsed_s,
            p50_s=quantile(0.5, diff),
            p99_s=quantile(0.99, diff),
        )
    return latencies


class LatencyTracker:
    """Keeps the previous scrape so each poll can be turned into a window."""

    def __init__(self) -> None:
        self._previous: tuple[dict[str, Histogram], float] | None = None

    def update(self, histograms: dict[str, Histogram] | None,
               at: float) -> dict[str, Latency] | None:
        """The window since the last update, or None when there is none yet (the first
        scrape, or no /metrics now or last time); `at` is a monotonic time in seconds. `None`
        for `histograms` (no /metrics this time) forgets the previous scrape."""
        previous, self._previous = self._previous, None
        if histograms is None:
            return None
        self._previous = (histograms, at)
        if previous is None:
            return None
        older, then = previous
        return window(histograms, older, at - then)

    def reset(self) -> None:
        """Forget the previous scrape (the daemon went away: its counters may restart)."""
        self._previous = None
