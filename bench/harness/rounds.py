"""Rounds and pairs. This machine drifts by tens of percent from minute to minute, so cases are
run in rounds, in an order reversed (or rotated) from round to round, and compared by ratios
paired within a round: two runs seconds apart share the drift."""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def alternate(items: Sequence[T], index: int) -> list[T]:
    """``items`` in order in rounds 0, 2, 4…, reversed in the others."""
    return list(items) if index % 2 == 0 else list(reversed(items))


def rotate(items: Sequence[T], index: int) -> list[T]:
    """``items`` starting ``index`` places further each round."""
    shift = index % len(items)
    return [*items[shift:], *items[:shift]]


def median_or_nan(values: Sequence[float]) -> float:
    """The median of the values that are numbers; NaN when there are none."""
    clean = [v for v in values if v == v]
    return statistics.median(clean) if clean else float("nan")


def spread(values: Sequence[float], fmt: str) -> str:
    """``median (min to max)`` in ``fmt``; an em dash for no values."""
    clean = [v for v in values if v == v]
    if not clean:
        return "—"
    middle = median_or_nan(clean)
    return f"{middle:{fmt}} ({min(clean):{fmt}} to {max(clean):{fmt}})"


def paired(top: Mapping[K, float], bottom: Mapping[K, float]) -> list[float]:
    """``top / bottom`` for every round (key) both have, in the keys' order."""
    return [top[key] / bottom[key] for key in sorted(top)  # type: ignore[type-var]
            if bottom.get(key)]


def versus_table(results: Mapping[tuple[str, int], Sequence[Mapping[str, float]]],
                 cases: Sequence[str], metric: str, label: str) -> list[str]:
    """Markdown rows of :func:`load.point_of`-shaped runs per (case, concurrency): median
    req/s and p50, each round's ``metric`` ("rps" or "p50") over the first case's, and
    errors."""
    table = [f"| case | c | req/s (median) | p50 ms (median) | {label}, per round | errors |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    for concurrency in sorted({c for _, c in results}):
        first = results[(cases[0], concurrency)]
        for case in cases:
            runs = results[(case, concurrency)]
            ratios = ", ".join(f"{r[metric] / f[metric]:.2f}"
                               for r, f in zip(runs, first, strict=True))
            table.append(
                f"| {case} | {concurrency} | {statistics.median(r['rps'] for r in runs):,.0f} | "
                f"{statistics.median(r['p50'] for r in runs):.3f} | {ratios} | "
                f"{int(sum(r['errors'] for r in runs))} |")
    return table
