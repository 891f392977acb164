"""The idle-gap histogram: bins from 0.01 s to 48 h, percentiles as bin edges, the counts
outside the range, halving past the cap, and its JSON form (malformed JSON refused)."""

from __future__ import annotations

import json
import math

import pytest

from snoozeml.engine.keepalive.histogram import (
    BINS,
    HIGH_S,
    LOW_S,
    IdleHistogram,
    bin_of,
    lower_edge,
    upper_edge,
)


def filled(*gaps: float) -> IdleHistogram:
    histogram = IdleHistogram()
    for gap in gaps:
        histogram.add(gap)
    return histogram


@pytest.mark.parametrize("gap", [0.01, 0.5, 1.0, 15.0, 600.0, 3600.0, 86_400.0, HIGH_S])
def test_a_gap_lies_between_its_bins_edges(gap: float) -> None:
    index = bin_of(gap)
    assert 0 <= index < BINS
    assert lower_edge(index) <= gap * (1 + 1e-12)
    assert gap <= upper_edge(index) * (1 + 1e-12)
    assert upper_edge(index) / lower_edge(index) <= 2 ** (1 / 8) + 1e-9 or index == BINS - 1


def test_gaps_outside_the_range_are_counted_apart() -> None:
    histogram = filled(0.001, 0.0, 5.0, HIGH_S * 2, HIGH_S * 3)
    assert histogram.count == 5
    assert histogram.out_of_range_share() == pytest.approx(2 / 5)
    assert histogram.percentile(0.0) == LOW_S  # below the range: its upper edge
    assert histogram.percentile(1.0) == math.inf


def test_negative_and_nan_gaps_are_ignored() -> None:
    histogram = filled(-1.0, math.nan)
    assert histogram.count == 0
    assert histogram.percentile(0.5) is None
    assert histogram.out_of_range_share() == 0.0


PERCENTILE_CASES = [
    pytest.param([10.0] * 20, 0.05, 10.0, id="one-gap-repeated"),
    pytest.param([1.0] * 95 + [100.0] * 5, 0.95, 1.0, id="the-95th-is-the-short-mode"),
    pytest.param([1.0] * 95 + [100.0] * 5, 0.99, 100.0, id="the-99th-is-the-long-mode"),
    pytest.param([1.0, 2.0, 4.0, 8.0], 0.5, 2.0, id="the-median-of-four"),
    pytest.param([1.0, 2.0, 4.0, 8.0], 0.0, 1.0, id="q0-is-the-smallest"),
    pytest.param([1.0, 2.0, 4.0, 8.0], 1.0, 8.0, id="q1-is-the-largest"),
]


@pytest.mark.parametrize(("gaps", "q", "gap"), PERCENTILE_CASES)
def test_a_percentile_is_the_edges_of_the_bin_it_falls_in(gaps: list[float], q: float,
                                                          gap: float) -> None:
    histogram = filled(*gaps)
    assert histogram.percentile(q) == upper_edge(bin_of(gap))
    assert histogram.percentile(q, upper=False) == lower_edge(bin_of(gap))
    assert histogram.percentile(q, upper=False) <= gap <= histogram.percentile(q)  # type: ignore[operator]


def test_a_percentile_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        filled(1.0).percentile(1.5)


def test_counts_are_halved_past_the_cap_so_old_traffic_fades() -> None:
    histogram = IdleHistogram(max_count=100)
    for _ in range(100):
        histogram.add(1.0)
    assert histogram.count == 100
    histogram.add(60.0)  # the 101st: every count halves, the lone 60 s gap drops out
    assert histogram.count == 50
    assert histogram.percentile(1.0) == upper_edge(bin_of(1.0))
    for _ in range(60):
        histogram.add(60.0)  # the new pattern takes over
    assert histogram.percentile(0.5) == upper_edge(bin_of(60.0))


def test_json_round_trip_keeps_every_count() -> None:
    histogram = filled(0.001, 0.2, 0.2, 30.0, 3600.0, HIGH_S * 2)
    again = IdleHistogram.from_json(json.loads(json.dumps(histogram.to_json())))
    assert list(again.bins()) == list(histogram.bins())
    assert again.count == histogram.count
    assert again.percentile(0.5) == histogram.percentile(0.5)


GOOD = IdleHistogram().to_json()

MALFORMED = [
    pytest.param([], id="not-an-object"),
    pytest.param({**GOOD, "format": 2}, id="another-format"),
    pytest.param({**GOOD, "per_doubling": 4}, id="another-layout"),
    pytest.param({**GOOD, "counts": [1, 2]}, id="counts-not-an-object"),
    pytest.param({**GOOD, "counts": {"x": 1}}, id="a-bin-not-a-number"),
    pytest.param({**GOOD, "counts": {str(BINS + 1): 1}}, id="a-bin-out-of-range"),
    pytest.param({**GOOD, "counts": {"3": -1}}, id="a-negative-count"),
    pytest.param({**GOOD, "counts": {"3": 1.5}}, id="a-fractional-count"),
    pytest.param({**GOOD, "counts": {"3": True}}, id="a-boolean-count"),
]


@pytest.mark.parametrize("data", MALFORMED)
def test_malformed_json_is_refused(data: object) -> None:
    with pytest.raises(ValueError, match="idle histogram"):
        IdleHistogram.from_json(data)
