"""Time, injected: the engine's timers and timestamps go through a `Clock`, so the idle timer
and the other policies that wait are tested with a clock the test moves, not with sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds: every duration and deadline."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch: only for timestamps shown to people."""
        ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Run `callback` on the event loop once `delay` seconds of `now()` have passed."""
        ...


class LoopClock:
    """The real clock: time.monotonic (the event loop's own time base) and the loop's timers."""

    # The builtins themselves, not methods around them: now() is on every request's path.
    now = staticmethod(time.monotonic)
    wall = staticmethod(time.time)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback)
