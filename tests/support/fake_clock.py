"""A Clock the test moves by hand: `advance(seconds)` runs the timers that fall due, in order,
on the caller's thread (the event loop's, in async tests). Nothing here sleeps."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

EPOCH = 1_800_000_000.0  # wall-clock seconds at now() == 0


class FakeTimer:
    def __init__(self, clock: FakeClock, due: float, callback: Callable[[], None]) -> None:
        self.due = due
        self.callback = callback
        self.cancelled = False
        self._clock = clock

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._order = itertools.count()
        self._timers: list[tuple[float, int, FakeTimer]] = []

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return EPOCH + self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self, self._now + max(delay, 0.0), callback)
        heapq.heappush(self._timers, (timer.due, next(self._order), timer))
        return timer

    @property
    def armed(self) -> list[FakeTimer]:
        """Timers that will still run, soonest first."""
        return [timer for _, _, timer in sorted(self._timers) if not timer.cancelled]

    def advance(self, seconds: float) -> None:
        """Move time forward, running each timer that falls due at its own moment."""
        end = self._now + seconds
        while self._timers and self._timers[0][0] <= end:
            due, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, due)
            timer.callback()
        self._now = end
