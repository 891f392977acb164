"""The interpreter's switch interval, shortened while a worker that is kept waiting runs.

A thread that wants the GIL while another holds it may ask the holder to let go only after the
switch interval (`sys.getswitchinterval()`, 5 ms by default). onnxruntime and torch release the
GIL while they compute; a model's worker coming back from a run needs it again to split the
outputs and start the next batch, and under load the event loop, decoding and answering, holds
it. So the worker sat idle for up to 5 ms after each run. While at least one such run is in
flight, `SwitchInterval.fast()` lowers the interval to at most `FAST_SWITCH`; when the last one
ends, the interval the process had is back.

Only a worker that is kept waiting asks for it (`kept_waiting`): a long run spent at least the
short interval off the CPU, a wait the short interval can cut. A shorter wait it cannot (the
forced switch comes only after the interval), and the extra switches only cost: with the
interval short for every long run, bench/run_replicas.py's batching-off models (the event loop
mostly idle) served 10-17% less. The worker keeps it for `SHORT_RUNS` runs after its last such
wait. A process serving only short runs (where the loop is the bottleneck) never sees a change.

Invariants:
- The interval is lowered exactly while the count of fast regions in flight is above zero.
- `base()` is the interval outside those regions: what the process (or its user) chose.
- Someone else's `sys.setswitchinterval` inside a region is kept: it is not overwritten at the
  end, and it is the new base.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# A worker kept waiting waits at most this long for the GIL; measured in bench/results.md,
# issue 19's fifth step.
FAST_SWITCH = 0.001
# A worker once kept waiting keeps the short interval until this many runs in a row were not:
# set and reset run by run, it cost the heavy MLP at c16 (waits around the threshold) 6-8%.
SHORT_RUNS = 16


def kept_waiting(cpu: float, wall: float, long_run: float, short: float = FAST_SWITCH) -> bool:
    """Whether a run of `cpu` seconds on the CPU in `wall` seconds was long (`long_run` or more)
    and spent at least the `short` interval off it (waiting for the GIL, or for a core): a wait
    that the short interval can cut, since a waiting thread may ask for the GIL only after it."""
    return cpu >= long_run and wall - cpu >= short


class SwitchInterval:
    """A count of the fast regions in flight, and the interval to go back to."""

    def __init__(self, fast: float = FAST_SWITCH) -> None:
        self._fast = fast
        self._lock = threading.Lock()
        self._in_flight = 0
        self._base = 0.0  # the interval to restore; read while a region is in flight
        self._set = 0.0  # the interval this set, to tell it from someone else's

    def base(self) -> float:
        """The switch interval outside fast regions."""
        with self._lock:
            return self._base if self._in_flight else sys.getswitchinterval()

    @contextmanager
    def fast(self) -> Iterator[None]:
        """A region (a run of a worker kept waiting) during which the interval is short."""
        with self._lock:
            if self._in_flight == 0:
                self._base = sys.getswitchinterval()
                sys.setswitchinterval(min(self._base, self._fast))
                self._set = sys.getswitchinterval()  # as stored: whole microseconds
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                now = sys.getswitchinterval()
                if self._in_flight == 0 and now == self._set:
                    sys.setswitchinterval(self._base)
                elif now != self._set:  # someone else set it: theirs is the base now
                    self._base = self._set = now


# The interval is the process's, so there is one count for it.
SWITCH = SwitchInterval()
