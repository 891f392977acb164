"""The sums the metrics keep between scrapes (api/metrics/sums.py): a histogram counts each
value in the first bucket whose bound holds it."""

from __future__ import annotations

from snoozeml.api.metrics.prometheus import DURATION_BUCKETS, Histogram


def test_a_histogram_counts_each_value_in_the_first_bucket_whose_bound_holds_it() -> None:
    histogram = Histogram((1.0, 2.0))
    for observed in (0.5, 1.0, 1.5, 2.0, 7.0):
        histogram.observe(observed)

    assert histogram.buckets() == [("1.0", 2), ("2.0", 4), ("+Inf", 5)]
    assert histogram.total == 12.0
    assert DURATION_BUCKETS[0] == 0.0005
    assert DURATION_BUCKETS[-1] == 30.0
