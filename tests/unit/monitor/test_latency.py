"""The monitor's latency (monitor/latency.py): histograms read from /metrics, summed over
protocols, quantiles interpolated within buckets, and the difference of two scrapes as a
window per model. No daemon."""

from __future__ import annotations

import math

import pytest
from monitor_answers import METRICS

from snoozeml.monitor.latency import (
    Histogram,
    Latency,
    LatencyTracker,
    parse_histograms,
    quantile,
    subtract,
    window,
)

INF = math.inf


def hist(*pairs: tuple[float, float]) -> Histogram:
    return Histogram(tuple(pairs))


def test_histograms_are_summed_over_protocols_per_model() -> None:
    histograms = parse_histograms(METRICS)
    assert histograms["a"] == hist((0.001, 3.0), (0.01, 5.0), (INF, 6.0))
    assert histograms["a"].count == 6.0
    assert histograms[""].count == 9.0  # requests naming no model: kept, shown for no row


def test_text_without_the_metric_gives_no_histograms_and_garbage_does_not_parse() -> None:
    assert parse_histograms("# nothing here\n") == {}
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_histograms("this is { not prometheus")


# Prometheus' histogram_quantile on these buckets, worked by hand: rank = q * count (10), found
# in the first bucket whose cumulative count reaches it, interpolated linearly inside it.
@pytest.mark.parametrize(("q", "expected"), [
    (0.1, 0.001 * 1 / 2),  # rank 1 of the 2 in the first bucket, which starts at 0
    (0.2, 0.001),  # rank 2: the first bucket's top
    (0.5, 0.001 + (0.01 - 0.001) * (5 - 2) / (8 - 2)),  # rank 5 in (0.001, 0.01]
    (0.9, 0.1),  # rank 9: the third bucket's top
    (0.99, 0.1),  # rank 9.9 in the +Inf bucket: the largest finite bound
])
def test_quantiles_interpolate_within_buckets_like_histogram_quantile(
        q: float, expected: float) -> None:
    h = hist((0.001, 2.0), (0.01, 8.0), (0.1, 9.0), (INF, 10.0))
    assert quantile(q, h) == pytest.approx(expected)


def test_an_empty_histogram_or_one_without_inf_has_no_quantile() -> None:
    assert quantile(0.5, hist((0.001, 0.0), (INF, 0.0))) is None
    assert quantile(0.5, hist((0.001, 1.0), (0.01, 2.0))) is None
    assert quantile(0.5, hist()) is None


def test_the_difference_of_two_scrapes_is_what_happened_between_them() -> None:
    older = hist((0.001, 2.0), (0.01, 4.0), (INF, 4.0))
    newer = hist((0.001, 2.0), (0.01, 14.0), (INF, 15.0))
    assert subtract(newer, older) == hist((0.001, 0.0), (0.01, 10.0), (INF, 11.0))
    assert subtract(newer, None) == newer  # a series new since the last scrape
    assert subtract(older, newer) is None  # counters went back: a restarted daemon
    assert subtract(newer, hist((0.005, 1.0), (INF, 1.0))) is None  # other buckets


def test_a_window_gives_requests_per_second_and_quantiles_per_model() -> None:
    older = {"a": hist((0.001, 0.0), (0.01, 0.0), (INF, 0.0)),
             "b": hist((0.001, 5.0), (0.01, 5.0), (INF, 5.0))}
    newer = {"a": hist((0.001, 10.0), (0.01, 20.0), (INF, 20.0)),
             "b": hist((0.001, 5.0), (0.01, 5.0), (INF, 5.0))}
    result = window(newer, older, elapsed_s=2.0)
    assert result["a"].per_s == 10.0
    assert result["a"].p50_s == pytest.approx(0.001)
    assert result["a"].p99_s == pytest.approx(0.001 + 0.009 * (19.8 - 10) / 10)
    assert result["b"] == Latency(per_s=0.0, p50_s=None, p99_s=None)
    assert window(newer, older, elapsed_s=0.0) == {}


def test_the_tracker_needs_two_scrapes_and_starts_again_after_a_gap() -> None:
    tracker = LatencyTracker()
    first = {"a": hist((0.01, 1.0), (INF, 1.0))}
    second = {"a": hist((0.01, 3.0), (INF, 3.0))}
    assert tracker.update(first, at=10.0) is None
    assert tracker.update(second, at=11.0) == {"a": Latency(2.0, 0.005, 0.0099)}
    assert tracker.update(None, at=12.0) is None  # no /metrics this time
    assert tracker.update(second, at=13.0) is None  # a new first scrape
    tracker.reset()
    assert tracker.update(second, at=14.0) is None
