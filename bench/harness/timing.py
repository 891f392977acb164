"""In-process timing: back-to-back calls for a duration or a count, as p50/p99 and calls/s."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Latency:
    """One row of a latency table; times in milliseconds."""

    label: str
    p50_ms: float
    p99_ms: float
    per_s: float
    errors: int = 0


def summarize(label: str, samples_ns: Sequence[int], elapsed_s: float, errors: int = 0) -> Latency:
    """p50/p99 of ``samples_ns`` (nanoseconds) in ms; ``per_s`` is samples per second of
    ``elapsed_s``."""
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p99 = np.percentile(ms, [50, 99]) if len(ms) else (float("nan"), float("nan"))
    return Latency(label, float(p50), float(p99), len(ms) / elapsed_s, errors)


def time_calls(call: Callable[[], object], duration_s: float, label: str = "") -> Latency:
    """p50/p99 of ``call`` over ``duration_s`` seconds of back-to-back calls; ``per_s`` is
    calls per second."""
    samples: list[int] = []
    start = time.perf_counter_ns()
    stop = start + int(duration_s * 1e9)
    while True:
        before = time.perf_counter_ns()
        call()
        after = time.perf_counter_ns()
        samples.append(after - before)
        if after >= stop:
            break
    return summarize(label, samples, (time.perf_counter_ns() - start) / 1e9)


def warm_then_time(call: Callable[[], object], duration_s: float, label: str = "",
                   warm_up_s: float = 1.0) -> Latency:
    """:func:`time_calls` after ``min(warm_up_s, duration_s)`` of untimed calls."""
    time_calls(call, min(warm_up_s, duration_s))
    return time_calls(call, duration_s, label)


def time_count(call: Callable[[], object], count: int, label: str = "") -> Latency:
    """p50/p99 of ``count`` back-to-back calls of ``call``; ``per_s`` is calls per second."""
    samples: list[int] = []
    start = time.perf_counter_ns()
    for _ in range(count):
        before = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - before)
    return summarize(label, samples, (time.perf_counter_ns() - start) / 1e9)


def elapsed_ms(call: Callable[[], Any]) -> tuple[float, Any]:
    """How long one call took, in ms, and what it returned."""
    started = time.perf_counter()
    result = call()
    return (time.perf_counter() - started) * 1000.0, result
