"""The idle timer (engine/idle.py) on a clock the test moves. (The timer inside a real model:
tests/unit/engine/test_model.py.)"""

from __future__ import annotations

import pytest
from fake_clock import FakeClock

from snoozeml.engine.idle import IdleTimer


class Expiries:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.at: list[float] = []

    def __call__(self) -> None:
        self.at.append(self.clock.now())


def timer_on(clock: FakeClock, timeout: float | None) -> tuple[IdleTimer, Expiries]:
    expiries = Expiries(clock)
    return IdleTimer(clock, timeout, expiries), expiries


def test_the_timer_expires_timeout_seconds_after_the_touch() -> None:
    clock = FakeClock()
    timer, expiries = timer_on(clock, 30.0)
    timer.touch()
    clock.advance(29.99)
    assert expiries.at == []
    assert timer.remaining() == pytest.approx(0.01)
    clock.advance(0.01)
    assert expiries.at == [30.0]
    assert timer.remaining() == 0.0


def test_a_touch_while_armed_moves_the_mark_without_a_second_timer() -> None:
    clock = FakeClock()
    timer, expiries = timer_on(clock, 30.0)
    timer.touch()
    clock.advance(20.0)
    timer.touch()  # the mark moves to 20; the timer armed for 30 stays the only one
    assert len(clock.armed) == 1
    clock.advance(10.0)  # it fires at 30, early for the new mark, and re-arms for 20 more
    assert expiries.at == []
    assert [t.due for t in clock.armed] == [50.0]
    clock.advance(20.0)
    assert expiries.at == [50.0]
    assert clock.armed == []


def test_many_touches_cost_one_timer() -> None:
    clock = FakeClock()
    timer, expiries = timer_on(clock, 5.0)
    for _ in range(1000):
        timer.touch()
        clock.advance(0.001)
    assert len(clock.armed) == 1
    clock.advance(5.0)
    assert expiries.at == [pytest.approx(5.999)]  # 5 s after the last touch, at 0.999


def test_a_cancelled_timer_does_not_expire_until_touched_again() -> None:
    clock = FakeClock()
    timer, expiries = timer_on(clock, 1.0)
    timer.touch()
    timer.cancel()
    clock.advance(10.0)
    assert expiries.at == []
    timer.touch()
    clock.advance(1.0)
    assert expiries.at == [11.0]


def test_without_a_timeout_nothing_is_armed_and_nothing_expires() -> None:
    clock = FakeClock()
    timer, expiries = timer_on(clock, None)
    timer.touch()
    clock.advance(10**9)
    assert clock.armed == []
    assert expiries.at == []
    assert timer.remaining() is None


def test_a_shorter_timeout_moves_the_armed_timer_earlier_and_a_longer_one_later() -> None:
    clock = FakeClock()
    timer, expiries = timer_on(clock, 30.0)
    timer.touch()
    clock.advance(5.0)
    timer.retime(10.0)  # from the same touch: due at 10, not 30
    assert len(clock.armed) == 1
    clock.advance(5.0)
    assert expiries.at == [10.0]
    timer.touch()  # t=10
    timer.retime(60.0)
    clock.advance(59.0)
    assert expiries.at == [10.0]
    clock.advance(1.0)
    assert expiries.at == [10.0, 70.0]


def test_retiming_to_never_disarms_and_back_arms_from_the_last_touch() -> None:
    clock = FakeClock()
    timer, expiries = timer_on(clock, 30.0)
    timer.touch()
    timer.retime(None)
    assert clock.armed == []
    assert timer.remaining() is None
    clock.advance(100.0)
    timer.retime(0.0)  # long past due: at once
    clock.advance(0.0)
    assert expiries.at == [100.0]
