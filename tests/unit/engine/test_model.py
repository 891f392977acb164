"""One model (engine/model.py) on real onnxruntime: a lease holds one replica, and ends however
the block it guards ends — normally, with an error, or cancelled — while a lease that was
never taken (its load was cancelled) holds nothing; and the idle timer inside the model, on a
clock the test moves (loads and unloads run on the loader threads; only time is fake)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from fake_clock import EPOCH, FakeClock
from onnx_models import write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.events import EngineEvent, EventBus, InferenceStarted, Unloaded
from snoozeml.engine.lifecycle import State
from snoozeml.engine.model import Model
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.requests.request import InferInput, InferRequest
from snoozeml.engine.service import InferenceService
from snoozeml.errors import InvalidInput

T = TypeVar("T")


class Boom(Exception):
    pass


def with_service(tmp_path: Path, scenario: Callable[[InferenceService, Model], Awaitable[T]]) -> T:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    config = parse_config({"models": [{"name": "mlp", "path": "mlp.onnx"}]},
                          source=tmp_path / "models.toml")

    async def main() -> T:
        service = InferenceService(ModelManager(config))
        try:
            return await scenario(service, service.manager.models["mlp"])
        finally:
            await service.manager.shutdown()

    return asyncio.run(main())


def holds(model: Model) -> tuple[int, list[int]]:
    """Leases on the model, and on each of its replicas."""
    return model.in_flight, [replica.in_flight for replica in model.replicas.replicas]


def test_a_lease_holds_one_replica_of_the_loaded_model(tmp_path: Path) -> None:
    async def scenario(service: InferenceService, model: Model) -> list[object]:
        async with model.lease() as replica:
            inside = [model.state, holds(model), replica in model.replicas.replicas]
        return [*inside, holds(model), model.expires_in() is not None]

    state, inside, known, after, idle = with_service(tmp_path, scenario)
    assert (state, inside, known) == (State.READY, (1, [1]), True)
    assert (after, idle) == ((0, [0]), True)  # ended: the idle timer runs


def test_a_lease_ends_when_its_block_raises(tmp_path: Path) -> None:
    async def scenario(service: InferenceService, model: Model) -> tuple[int, list[int]]:
        with pytest.raises(Boom):
            async with model.lease():
                raise Boom
        return holds(model)

    assert with_service(tmp_path, scenario) == (0, [0])


def test_a_lease_ends_when_its_task_is_cancelled_inside_the_block(tmp_path: Path) -> None:
    async def scenario(service: InferenceService, model: Model) -> list[object]:
        inside = asyncio.Event()

        async def hold() -> None:
            async with model.lease():
                inside.set()
                await asyncio.Event().wait()  # until cancelled

        task = asyncio.create_task(hold())
        await inside.wait()
        during = holds(model)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return [during, holds(model)]

    assert with_service(tmp_path, scenario) == [(1, [1]), (0, [0])]


def test_a_lease_cancelled_while_its_model_loads_holds_nothing_and_the_load_goes_on(
    tmp_path: Path,
) -> None:
    async def scenario(service: InferenceService, model: Model) -> list[object]:
        entered: list[bool] = []

        async def take() -> None:
            async with model.lease():
                entered.append(True)

        changed = service.changed()  # set when the load starts (UNLOADED -> LOADING)
        task = asyncio.create_task(take())
        await changed.wait()
        loading = model.state
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while model.state is State.LOADING:  # the load is not the cancelled request's own
            await service.changed().wait()
        return [loading, entered, model.state, holds(model)]

    assert with_service(tmp_path, scenario) == [State.LOADING, [], State.READY, (0, [0])]


def test_an_inference_refused_inside_its_lease_ends_the_lease(tmp_path: Path) -> None:
    async def scenario(service: InferenceService, model: Model) -> tuple[int, list[int]]:
        wrong = np.zeros((1, 3), np.float32)  # the model takes 4 features
        request = InferRequest([InferInput("x", "FP32", wrong.shape, wrong)])
        with pytest.raises(InvalidInput, match="shape"):
            await service.infer("mlp", None, request)
        return holds(model)

    assert with_service(tmp_path, scenario) == (0, [0])


def test_a_request_counts_when_it_arrives_and_a_client_that_leaves_is_not_an_error(
    tmp_path: Path,
) -> None:
    async def scenario(service: InferenceService, model: Model) -> list[object]:
        arrived = asyncio.Event()
        service.events.subscribe(lambda event: arrived.set(), [InferenceStarted])
        x = np.ones((1, 4), np.float32)
        request = InferRequest([InferInput("x", "FP32", x.shape, x)])
        task = asyncio.create_task(service.infer("mlp", None, request))
        await arrived.wait()
        during = service.snapshot().models[0]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = service.snapshot().models[0]
        return [(during.requests, during.errors), (after.requests, after.errors),
                model.in_flight]

    assert with_service(tmp_path, scenario) == [(1, 0), (1, 0), 0]


# --- the idle timer in a model --------------------------------------------------------------------


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
