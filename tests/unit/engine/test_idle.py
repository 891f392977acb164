"""The idle timer on a clock the test moves: alone, and inside a real model (real onnxruntime
loads and unloads on the loader threads; only time is fake)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from fake_clock import EPOCH, FakeClock
from onnx_models import write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.events import EngineEvent, EventBus, Unloaded
from snoozeml.engine.idle import IdleTimer
from snoozeml.engine.lifecycle import State
from snoozeml.engine.model import Model
from snoozeml.engine.registry import ModelManager

T = TypeVar("T")


# --- the timer alone --------------------------------------------------------------------------


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


# --- the timer in a model ------------------------------------------------------------------------


def served(tmp_path: Path, idle_timeout: str = "30s") -> tuple[ModelManager, FakeClock]:
    write_mlp(tmp_path / "mlp.onnx")
    config = parse_config(
        {"models": [{"name": "mlp", "path": "mlp.onnx", "idle_timeout": idle_timeout}]},
        source=tmp_path / "models.toml",
    )
    clock = FakeClock()
    return ModelManager(config, clock=clock), clock


def run_with(manager: ModelManager, scenario: Callable[[Model], Awaitable[T]]) -> T:
    async def main() -> T:
        try:
            return await scenario(manager.models["mlp"])
        finally:
            await manager.shutdown()

    return asyncio.run(main())


async def until_unloaded(bus: EventBus, events: list[EngineEvent]) -> None:
    """Wait (on the engine's own change signal) for an unload to finish."""
    async def settled() -> None:
        while not any(isinstance(e, Unloaded) for e in events):
            await bus.changed().wait()

    await asyncio.wait_for(settled(), 60)  # a guard against a hang, not a measurement


async def use(model: Model) -> None:
    async with model.lease():
        pass


def test_an_idle_model_unloads_idle_timeout_after_its_last_lease(tmp_path: Path) -> None:
    manager, clock = served(tmp_path)
    seen: list[EngineEvent] = []
    manager.events.subscribe(seen.append)

    async def scenario(model: Model) -> tuple[State, float | None, State, str]:
        await use(model)  # loads it; the lease ends at t=0
        clock.advance(29.5)
        before = (model.state, model.expires_in())
        clock.advance(0.5)
        await until_unloaded(manager.events, seen)
        return (*before, model.state, model.reason)

    state_before, expires_in, state_after, reason = run_with(manager, scenario)
    assert (state_before, expires_in) == (State.READY, pytest.approx(0.5))
    assert (state_after, reason) == (State.UNLOADED, "idle")
    assert [e.reason for e in seen if isinstance(e, Unloaded)] == ["idle"]


def test_a_later_lease_moves_the_unload_and_the_reported_expiry(tmp_path: Path) -> None:
    manager, clock = served(tmp_path)
    seen: list[EngineEvent] = []
    manager.events.subscribe(seen.append)

    async def scenario(model: Model) -> list[object]:
        await use(model)
        clock.advance(20.0)
        await use(model)  # t=20: idle until 50 now
        last_used = model.last_used
        clock.advance(10.0)  # t=30: the first timer fires, early
        at_30 = (model.state, model.expires_in())
        clock.advance(20.0)  # t=50
        await until_unloaded(manager.events, seen)
        return [last_used, *at_30, model.state]

    last_used, state_30, expires_30, state_50 = run_with(manager, scenario)
    assert last_used == EPOCH + 20.0
    assert (state_30, expires_30) == (State.READY, pytest.approx(20.0))
    assert state_50 is State.UNLOADED


def test_a_model_with_a_lease_outlives_its_timer_and_idles_from_the_lease_end(
    tmp_path: Path,
) -> None:
    manager, clock = served(tmp_path)
    seen: list[EngineEvent] = []
    manager.events.subscribe(seen.append)

    async def scenario(model: Model) -> list[object]:
        await use(model)
        async with model.lease():
            clock.advance(60.0)  # the timer fires while a request holds the model
            held = (model.state, model.expires_in())
        clock.advance(29.0)
        after_29 = model.state
        clock.advance(1.0)
        await until_unloaded(manager.events, seen)
        return [*held, after_29, model.state]

    held_state, held_expiry, after_29, after_30 = run_with(manager, scenario)
    assert (held_state, held_expiry) == (State.READY, None)  # busy: no expiry to report
    assert after_29 is State.READY
    assert after_30 is State.UNLOADED


def test_a_pinned_model_arms_no_timer_and_stays(tmp_path: Path) -> None:
    manager, clock = served(tmp_path, idle_timeout="never")

    async def scenario(model: Model) -> tuple[State, float | None, int]:
        await use(model)
        clock.advance(10**6)
        return model.state, model.expires_in(), len(clock.armed)

    assert run_with(manager, scenario) == (State.READY, None, 0)
