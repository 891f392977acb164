"""The adaptive keep-alive: what a model does after its last request ends, from its idle gaps.

After Shahrad et al.'s hybrid histogram policy ("Serverless in the Wild", ATC 2020): with a
young history (under `min_history` gaps, or `min_steady_history` when every gap so far fell
in two adjacent bins, as a timer's do), or gaps mostly beyond the histogram's range, the
model keeps its fixed `idle_timeout` (the fallback, today's behaviour). Otherwise the plans
the histogram suggests are weighed against the fallback on the model's own gaps:

- pre-warm: unload right away, load again just before the low percentile (5th, less a
  margin and the load time), keep the pre-warmed model until the high percentile (99th, plus a
  margin) - when the low percentile is far enough (`min_unload_gap_s`) to be worth an unload;
- keep alive until the high percentile (or a lower one: a bursty model's gaps inside a burst),
  then unload;
- unload right away (a model whose next call is always far and never predictable).

Each plan's expected cold starts and idle seconds per gap are read off the histogram
(`expected`), and the cheapest wins, where one cold start is worth `cold_start_worth` (4)
fallback windows of idle time, at least `cold_start_worth_s`. Four, not one: the memory a
learned plan saves on timers and bursts is better spent holding the models whose next call
cannot be predicted (on bench/run.py keepalive's trace, 1 saves more memory but cuts fewer
than half the cold starts of a fixed window; 4 cuts more than half and still holds less
memory; 8 adds little). A plan that is no cheaper than the fallback loses to it ("fallback:
unpredictable"): a memoryless (Poisson) model called more often than that keeps its fixed
window, or is kept longer; one called less often is unloaded right away.

A pre-warm nobody used counts against the policy: each model keeps the share of its recent
pre-warms that were wasted (`wasted_share`: the newest weighs a quarter, and the share fades
by 5% a gap), and where that share is above what its histogram predicts, the pre-warm plan is
charged the difference as cold starts and windows held for nothing (`observed`). A model
whose pre-warms keep missing falls back to keeping alive or unloading, and tries again once
the evidence has faded.

Pure: a function of the histogram, the wasted share and the settings; the engine keeps the
clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from snoozeml.engine.keepalive.histogram import BINS, LOW_S, IdleHistogram, lower_edge, upper_edge


@dataclass(frozen=True, slots=True)
class KeepAliveSettings:
    min_history: int = 10  # gaps before the histogram is trusted
    min_steady_history: int = 4  # ... or this many, all in two adjacent bins (a timer's)
    low: float = 0.05  # pre-warm just before this percentile
    high: float = 0.99  # keep alive until this percentile
    margin: float = 0.10  # widen both by this share (pre-warm earlier, keep longer)
    min_unload_gap_s: float = 10.0  # unload-after-use only when the low percentile is this far
    max_out_of_range: float = 0.5  # more gaps than this share above 48 h: fall back
    cold_start_worth: float = 4.0  # idle seconds a cold start is worth, in fallback windows
    cold_start_worth_s: float = 60.0  # ... and at least this many
    keep_quantiles: tuple[float, ...] = (0.5, 0.75, 0.9, 0.95)  # shorter windows also weighed
    waste_weight: float = 0.25  # the newest pre-warm's weight in the share nobody used
    waste_forget: float = 0.95  # ... and what is left of that share after each new gap


@dataclass(frozen=True, slots=True)
class Plan:
    unload_after_s: float | None  # after the last request ends: unload after this (None: never)
    prewarm_after_s: float | None  # after the last request ends: load again then (None: no)
    keep_until_s: float | None  # a pre-warmed model stays until this (None: never unloads)
    reason: str  # "learned", "fallback: young history", "fallback: unpredictable",
    # "fallback: out of range", "pinned"


@dataclass(frozen=True, slots=True)
class Expected:
    """What a plan costs per idle gap of the histogram, on average."""

    cold: float  # share of gaps that end in a cold start
    idle_s: float  # seconds the model is held loaded while idle
    wasted: float  # share of gaps with a pre-warm nobody used


def plan(histogram: IdleHistogram, fallback_s: float | None,
         settings: KeepAliveSettings = KeepAliveSettings(), load_s: float = 0.0,
         wasted: float = 0.0) -> Plan:
    """The plan for a model whose last request just ended. `fallback_s` is its idle_timeout
    (None: pinned), `load_s` its last load's seconds (a pre-warm starts that much earlier),
    `wasted` the share of its recent pre-warms that nobody used (`wasted_share`)."""
    if fallback_s is None:
        return Plan(None, None, None, "pinned")
    if histogram.count < settings.min_history and not (
            histogram.count >= settings.min_steady_history and steady(histogram)):
        return Plan(fallback_s, None, None, "fallback: young history")
    if histogram.out_of_range_share() > settings.max_out_of_range:
        return Plan(fallback_s, None, None, "fallback: out of range")
    worth = max(fallback_s * settings.cold_start_worth, settings.cold_start_worth_s)
    gaps = _gaps(histogram)
    best = Plan(fallback_s, None, None, "fallback: unpredictable")
    best_cost = cost(_expected(best, gaps), worth)
    for candidate in candidates(histogram, settings, load_s):
        candidate_cost = cost(observed(candidate, _expected(candidate, gaps), wasted), worth)
        if candidate_cost < best_cost:
            best, best_cost = candidate, candidate_cost
    return best


def steady(histogram: IdleHistogram) -> bool:
    """Every gap within two adjacent bins of the range (about 19% apart): a timer's history,
    evident after a few gaps, where waiting for ten would take ten periods (ten hours for an
    hourly job)."""
    found = [index for index, _ in histogram.bins()]
    return bool(found) and found[0] >= 0 and found[-1] < BINS and found[-1] - found[0] <= 1


def candidates(histogram: IdleHistogram, settings: KeepAliveSettings,
               load_s: float = 0.0) -> list[Plan]:
    """The learned plans weighed against the fallback: pre-warm (when the low percentile is
    far), keep alive to the high percentile and to each of `keep_quantiles`, unload at once."""
    found: list[Plan] = []
    high = histogram.percentile(settings.high)
    low = histogram.percentile(settings.low, upper=False)
    if high is None or low is None:
        return found
    keep_high = high * (1 + settings.margin)
    prewarm = low * (1 - settings.margin) - load_s
    if prewarm >= settings.min_unload_gap_s and math.isfinite(keep_high):
        found.append(Plan(0.0, prewarm, keep_high, "learned"))
    for q in (settings.high, *sorted(settings.keep_quantiles, reverse=True)):
        window = histogram.percentile(q)
        if window is not None and math.isfinite(window):
            found.append(Plan(window * (1 + settings.margin), None, None, "learned"))
    found.append(Plan(0.0, None, None, "learned"))
    return found


def observed(chosen: Plan, outcome: Expected, wasted: float) -> Expected:
    """A pre-warm plan's `outcome` once its model's own pre-warms count against it: where more
    of them went unused (`wasted`) than the histogram predicts, each one more is a pre-warm
    held to its window's end for nothing and the cold start of the request that came after."""
    if chosen.prewarm_after_s is None or wasted <= outcome.wasted:
        return outcome
    more = wasted - outcome.wasted
    held = 0.0 if chosen.keep_until_s is None else chosen.keep_until_s - chosen.prewarm_after_s
    return Expected(min(outcome.cold + more, 1.0), outcome.idle_s + more * max(held, 0.0),
                    wasted)


def wasted_share(share: float, settings: KeepAliveSettings, prewarm: str | None = None) -> float:
    """The share of a model's recent pre-warms nobody used, after one more ended (`prewarm`:
    "used" or "wasted"), or after a new gap (None: the evidence ages, so a model that stopped
    pre-warming because of it tries again once its gaps say so long enough)."""
    if prewarm is None:
        return share * settings.waste_forget
    return share + settings.waste_weight * (float(prewarm == "wasted") - share)


def cost(outcome: Expected, worth_s: float) -> float:
    """Cold starts plus idle seconds at `worth_s` seconds a cold start."""
    return outcome.cold + outcome.idle_s / worth_s


def expected(chosen: Plan, histogram: IdleHistogram) -> Expected:
    """`chosen`'s cold starts, idle seconds and wasted pre-warms per gap of `histogram`, each
    gap taken at its bin's geometric middle (below the range: half its edge)."""
    return _expected(chosen, _gaps(histogram))


def _gaps(histogram: IdleHistogram) -> list[tuple[float, int]]:
    """(the bin's middle gap, its count) of every non-empty bin."""
    return [(_middle(index), count) for index, count in histogram.bins()]


def _expected(chosen: Plan, gaps: list[tuple[float, int]]) -> Expected:
    total = sum(count for _, count in gaps)
    if total == 0:
        return Expected(0.0, 0.0, 0.0)
    cold = idle = wasted = 0.0
    for gap, count in gaps:
        gap_cold, gap_idle, gap_wasted = _one_gap(chosen, gap)
        cold += count * gap_cold
        idle += count * gap_idle
        wasted += count * gap_wasted
    return Expected(cold / total, idle / total, wasted / total)


def _middle(index: int) -> float:
    if index < 0:
        return LOW_S / 2
    if index >= BINS:
        return math.inf
    return math.sqrt(lower_edge(index) * upper_edge(index))


def _one_gap(chosen: Plan, gap: float) -> tuple[float, float, float]:
    """(cold start, idle seconds, wasted pre-warm) of one gap under `chosen`."""
    unload = math.inf if chosen.unload_after_s is None else chosen.unload_after_s
    if chosen.prewarm_after_s is None:
        return (0.0, gap, 0.0) if gap <= unload else (1.0, unload, 0.0)
    start = chosen.prewarm_after_s
    until = math.inf if chosen.keep_until_s is None else chosen.keep_until_s
    held = min(gap, unload)
    if gap < start:
        return 1.0, held, 0.0
    if gap <= until:
        return 0.0, held + gap - start, 0.0
    return 1.0, held + until - start, 1.0


def next_arrival_s(histogram: IdleHistogram, chosen: Plan, idle_for_s: float,
                   settings: KeepAliveSettings = KeepAliveSettings()) -> float | None:
    """Seconds until the model's next request is expected, `idle_for_s` after its last one
    ended: its pre-warm time while that is ahead, else its median gap while that is ahead;
    None with a young history or when the median has passed (overdue: nothing known)."""
    if chosen.prewarm_after_s is not None and idle_for_s < chosen.prewarm_after_s:
        return chosen.prewarm_after_s - idle_for_s
    if histogram.count < settings.min_history:
        return None
    median = histogram.percentile(0.5)
    if median is None or not math.isfinite(median) or idle_for_s >= median:
        return None
    return median - idle_for_s
