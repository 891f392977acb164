"""The idle timer: calls back once `timeout` seconds have passed since the last `touch()`.

A model touches it when its last lease ends (and when it finishes loading). At most one timer
is armed: a touch while one is armed only moves the mark, and the timer, when it fires early
for an older mark, re-arms itself for the remainder. So a model under steady traffic costs one
timer per `timeout`, not one per request.
"""

from __future__ import annotations

from collections.abc import Callable

from snoozeml.engine.clock import Clock, Timer

# A timer this close to its mark counts as due (loop timers fire up to a tick early).
_DUE = 1e-3


class IdleTimer:
    def __init__(
        self, clock: Clock, timeout: float | None, expire: Callable[[], None]
    ) -> None:
        self.timeout = timeout  # None: never expires (a pinned model)
        self.last_touch = clock.now()
        self._clock = clock
        self._expire = expire
        self._timer: Timer | None = None

    def touch(self) -> None:
        """Idle from now on: `expire` runs `timeout` seconds later unless touched again."""
        self.last_touch = self._clock.now()
        self._arm(self.timeout)

    def remaining(self) -> float | None:
        """Seconds until expiry from the last touch (0 when due), or None without a timeout."""
        if self.timeout is None:
            return None
        return max(self.last_touch + self.timeout - self._clock.now(), 0.0)

    def retime(self, timeout: float | None) -> None:
        """Expire `timeout` seconds after the same last touch (the adaptive keep-alive's plan
        changes it after each request): the timer is armed for the new moment (at once when
        it is past), or disarmed for None. The owner ignores an expiry while it is busy."""
        if timeout == self.timeout:
            return
        self.timeout = timeout
        self.cancel()
        self._arm(self.remaining())

    def cancel(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _arm(self, delay: float | None) -> None:
        if delay is None or self._timer is not None:
            return
        self._timer = self._clock.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        remaining = self.remaining()
        if remaining is None:
            return
        if remaining > _DUE:
            self._arm(remaining)
            return
        self._expire()
