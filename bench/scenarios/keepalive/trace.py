"""A seeded trace shaped like the Azure Functions 2019 trace (Shahrad et al., ATC 2020).

That trace gives, per function, invocations per minute over two weeks; what shapes it, and what
this generator draws each model from:

- timers (about a third of the functions have one): one call every 1, 2, 5, 10, 15, 30, 60 or
  120 minutes, or every 10, 20 or 30 s, at a fixed second of the minute - exact periods;
- Poisson traffic at heavy-tailed rates (invocation rates span eight orders of magnitude, a few
  functions carry almost all calls): a lognormal rate per minute, from a call every hour to
  hundreds a minute, swung by a diurnal cycle (each model its own amplitude and phase);
- bursts: a burst (minutes of tens of calls a minute) every 20 minutes to 3 hours, diurnal too;
- rare models: a few calls an hour at most (45% of the trace's applications are called at most
  once an hour).

Each model also has a size (lognormal, median 150 MiB, 5 MiB to 2 GiB), a load time (the cold
start: 30 ms plus 17 ms per 100 MB, as measured for ONNX) and a run time per request. The
counts are expanded to arrival times: a timer at its second, the rest uniformly in the minute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MB_PER_MIB = 1.048576
LOAD_FLOOR_S = 0.030
LOAD_S_PER_100MB = 0.017
KINDS = (("timer", 0.30), ("poisson", 0.37), ("bursty", 0.16), ("rare", 0.17))
TIMER_PERIODS_S = (10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
TIMER_WEIGHTS = (1, 1, 1, 3, 2, 3, 2, 3, 2, 3, 1)


@dataclass(frozen=True)
class TraceModel:
    name: str
    kind: str  # timer, poisson, bursty, rare
    detail: str  # its parameters in words
    size_mib: float
    load_s: float
    run_s: float
    counts: np.ndarray = field(repr=False)  # invocations per minute
    second: float = 0.0  # a timer's second in the minute


@dataclass(frozen=True)
class Trace:
    seed: int
    minutes: int
    models: list[TraceModel]

    def arrivals(self) -> list[tuple[float, int]]:
        """Every request as (seconds from the start, model index), in time order."""
        rng = np.random.default_rng(self.seed + 7919)
        out: list[tuple[float, int]] = []
        for index, model in enumerate(self.models):
            minutes = np.repeat(np.arange(self.minutes), model.counts)
            if model.kind == "timer":
                period = 60.0 / max(int(model.counts.max()), 1)
                rank = _rank_in_minute(minutes)
                times = minutes * 60.0 + (model.second + rank * period) % 60.0
            else:
                times = minutes * 60.0 + rng.uniform(0.0, 60.0, len(minutes))
            out.extend((float(t), index) for t in times)
        out.sort()
        return out

    @property
    def requests(self) -> int:
        return int(sum(int(m.counts.sum()) for m in self.models))


def _rank_in_minute(minutes: np.ndarray) -> np.ndarray:
    """0, 1, 2... for the calls of each minute (minutes sorted)."""
    if len(minutes) == 0:
        return minutes.astype(float)
    starts = np.r_[0, np.flatnonzero(np.diff(minutes)) + 1]
    first = np.repeat(starts, np.diff(np.r_[starts, len(minutes)]))
    return (np.arange(len(minutes)) - first).astype(float)


def generate(seed: int, models: int = 60, hours: float = 12.0) -> Trace:
    """The trace of `models` models over `hours` hours from `seed`."""
    rng = np.random.default_rng(seed)
    minutes = int(hours * 60)
    kinds = [name for name, share in KINDS for _ in range(round(share * models))]
    kinds = (kinds + ["poisson"] * models)[:models]
    rng.shuffle(kinds)
    built = []
    for index, kind in enumerate(kinds):
        counts, detail, second = _traffic(kind, rng, minutes)
        size = float(np.clip(rng.lognormal(math.log(150.0), 1.0), 5.0, 2048.0))
        built.append(TraceModel(
            name=f"m{index:02d}", kind=kind, detail=detail, size_mib=round(size, 1),
            load_s=LOAD_FLOOR_S + LOAD_S_PER_100MB * size * MB_PER_MIB / 100.0,
            run_s=float(np.clip(rng.lognormal(math.log(0.02), 0.8), 0.002, 0.5)),
            counts=counts, second=second))
    return Trace(seed, minutes, built)


def diurnal(rng: np.random.Generator, minutes: int) -> np.ndarray:
    """A day's swing over the trace's minutes: 1 +- amplitude (0.3-0.9), a random phase."""
    amplitude = rng.uniform(0.3, 0.9)
    phase = rng.uniform(0.0, 2 * math.pi)
    return 1.0 + amplitude * np.sin(2 * math.pi * np.arange(minutes) / 1440.0 + phase)


def _traffic(kind: str, rng: np.random.Generator,
             minutes: int) -> tuple[np.ndarray, str, float]:
    """(calls per minute, what they are in words, a timer's second)."""
    if kind == "timer":
        weights = np.array(TIMER_WEIGHTS, dtype=float)
        period = int(rng.choice(TIMER_PERIODS_S, p=weights / weights.sum()))
        second = float(rng.uniform(0.0, 60.0))
        if period < 60:
            return np.full(minutes, 60 // period), f"every {period} s", second % period
        step = period // 60
        counts = np.zeros(minutes, dtype=int)
        counts[int(rng.integers(step))::step] = 1
        return counts, f"every {step} min", second
    if kind == "poisson":
        rate = float(np.clip(rng.lognormal(math.log(0.5), 2.0), 1 / 60, 120.0))
        return rng.poisson(rate * diurnal(rng, minutes)), f"{rate:.3g}/min", 0.0
    if kind == "bursty":
        every = rng.uniform(20.0, 180.0)
        length = int(rng.integers(1, 11))
        rate = rng.uniform(5.0, 60.0)
        starts = rng.random(minutes) < diurnal(rng, minutes) / every
        active = np.convolve(starts, np.ones(length), mode="full")[:minutes] > 0
        detail = f"{length} min at {rate:.0f}/min every {every:.0f} min"
        return rng.poisson(rate * active), detail, 0.0
    per_hour = rng.uniform(0.2, 3.0)
    return rng.poisson(per_hour / 60 * diurnal(rng, minutes)), f"{per_hour:.2f}/h", 0.0
