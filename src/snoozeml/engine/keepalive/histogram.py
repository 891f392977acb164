"""A model's idle gaps (end of its last request to the next arrival) as a histogram.

Bins are log-spaced from 0.01 s to 48 h, eight to a doubling (each bin about 9% wide), so one
layout holds a model called every few milliseconds and one called twice a day; gaps below or
above the range are counted apart. Counts are halved once they pass `max_count`, so old traffic
fades and a model whose pattern changes is learned again (Shahrad et al., "Serverless in the
Wild", ATC 2020, keep a window of recent idle times for the same reason).

The histogram is plain data: no clock, no I/O; `to_json`/`from_json` carry it across restarts.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

LOW_S = 0.01  # the range's lower end; shorter gaps are counted as below it
HIGH_S = 48 * 3600.0  # the range's upper end; longer gaps are counted as above it
PER_DOUBLING = 8
BINS = math.ceil(math.log2(HIGH_S / LOW_S) * PER_DOUBLING)
MAX_COUNT = 1000  # past this many gaps, every count is halved
FORMAT = 1


def lower_edge(index: int) -> float:
    """The lower edge of bin `index` (-1: the bin below the range, from 0)."""
    return 0.0 if index < 0 else LOW_S * math.pow(2.0, index / PER_DOUBLING)


def upper_edge(index: int) -> float:
    """The upper edge of bin `index` (-1: the bin below the range; BINS: above it, infinite)."""
    if index >= BINS:
        return math.inf
    return min(LOW_S * math.pow(2.0, (index + 1) / PER_DOUBLING), HIGH_S)


def bin_of(gap_s: float) -> int:
    """The bin a gap falls in: -1 below the range, BINS above it."""
    if gap_s < LOW_S:
        return -1
    if gap_s > HIGH_S:
        return BINS
    return min(int(math.log2(gap_s / LOW_S) * PER_DOUBLING), BINS - 1)


class IdleHistogram:
    """Idle gaps of one model (end of its last request to the next arrival), in log-spaced bins
    from 0.01 s to 48 h (eight per doubling), plus counts below/above the range."""

    __slots__ = ("_counts", "_max", "_total")

    def __init__(self, max_count: int = MAX_COUNT) -> None:
        self._counts: dict[int, int] = {}  # bin (-1 below, BINS above) -> gaps
        self._total = 0
        self._max = max_count

    def add(self, gap_s: float) -> None:
        """Record one gap (negative or NaN gaps are not gaps: ignored)."""
        if not gap_s >= 0.0:
            return
        index = bin_of(gap_s)
        self._counts[index] = self._counts.get(index, 0) + 1
        self._total += 1
        if self._total > self._max:
            self._halve()

    def _halve(self) -> None:
        self._counts = {i: c // 2 for i, c in self._counts.items() if c >= 2}
        self._total = sum(self._counts.values())

    @property
    def count(self) -> int:
        """Gaps recorded (after any halving), out-of-range ones included."""
        return self._total

    def bins(self) -> Iterator[tuple[int, int]]:
        """(bin, count) of the non-empty bins in order, -1 (below) to BINS (above)."""
        for index in sorted(self._counts):
            yield index, self._counts[index]

    def percentile(self, q: float, *, upper: bool = True) -> float | None:
        """The `q`-th percentile (q in [0, 1]) as the upper edge of its bin (with
        `upper=False`, the lower edge); None when empty; infinity when it is above the range."""
        if self._total == 0:
            return None
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"a percentile is between 0 and 1, not {q}")
        rank = max(math.ceil(q * self._total), 1)
        seen = 0
        found = BINS
        for index, count in self.bins():
            seen += count
            if seen >= rank:
                found = index
                break
        return upper_edge(found) if upper else lower_edge(found)

    def out_of_range_share(self) -> float:
        """Share of gaps above the range (0 when empty)."""
        return self._counts.get(BINS, 0) / self._total if self._total else 0.0

    def to_json(self) -> dict[str, object]:
        return {"format": FORMAT, "low_s": LOW_S, "per_doubling": PER_DOUBLING, "bins": BINS,
                "counts": {str(i): c for i, c in self.bins()}}

    @classmethod
    def from_json(cls, data: object) -> IdleHistogram:
        """The histogram `to_json` wrote; ValueError on anything malformed or of another
        layout (then the history is dropped, never guessed)."""
        if not isinstance(data, dict):
            raise ValueError("an idle histogram is a JSON object")
        layout = {"format": FORMAT, "low_s": LOW_S, "per_doubling": PER_DOUBLING, "bins": BINS}
        for key, expected in layout.items():
            if data.get(key) != expected:
                raise ValueError(f"idle histogram {key} is {data.get(key)!r}, not {expected!r}")
        counts = data.get("counts")
        if not isinstance(counts, dict):
            raise ValueError("idle histogram counts are a JSON object")
        histogram = cls()
        for key, count in counts.items():
            try:
                index = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"idle histogram bin {key!r} is not a number") from None
            if not -1 <= index <= BINS:
                raise ValueError(f"idle histogram bin {index} is outside -1..{BINS}")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"idle histogram bin {index} has count {count!r}")
            if count:
                histogram._counts[index] = count
        histogram._total = sum(histogram._counts.values())
        return histogram
