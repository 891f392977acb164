"""Leases on a real model (real onnxruntime): a lease holds one replica, and ends however the
block it guards ends — normally, with an error, or cancelled — while a lease that was never
taken (its load was cancelled) holds nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from onnx_models import write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.events import InferenceStarted
from snoozeml.engine.lifecycle import State
from snoozeml.engine.model import Model
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.request import InferInput, InferRequest
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
