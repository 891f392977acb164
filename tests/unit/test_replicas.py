"""A model's replica set, in process on real onnxruntime: a model that holds more than one
replica routes each lease to the least loaded one and unloads them all, and the one batching
policy of a model outlives its reloads."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from onnx_models import write_flatten_model, write_mlp

from snoozeml.config import parse_config
from snoozeml.engine.events import BatchingDisabled, BatchRun, EngineEvent, Unloaded
from snoozeml.engine.lifecycle import State
from snoozeml.engine.manager import ModelManager
from snoozeml.engine.request import InferInput, InferRequest
from snoozeml.engine.service import InferenceService

T = TypeVar("T")


def with_service(
    tmp_path: Path, model: dict[str, Any],
    scenario: Callable[[InferenceService, list[EngineEvent]], Awaitable[T]],
) -> T:
    config = parse_config({"models": [model]}, source=tmp_path / "models.toml")

    async def main() -> T:
        service = InferenceService(ModelManager(config))
        seen: list[EngineEvent] = []
        service.events.subscribe(seen.append)
        try:
            return await scenario(service, seen)
        finally:
            await service.manager.shutdown()

    return asyncio.run(main())


def test_a_model_with_two_replicas_leases_the_least_loaded_and_unloads_both(
    tmp_path: Path,
) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> list[object]:
        model = service.manager.models["mlp"]
        await model.load()
        alone = service.snapshot().models[0].resident_bytes
        second = await model.replicas.add()  # what the autoscaler will do
        first = model.replicas.replicas[0]
        async with model.lease() as a:
            async with model.lease() as b:
                picked = [a.index, b.index]
                loads = [first.in_flight, second.in_flight]
            x = np.ones((1, 4), np.float32)
            answer = await service.infer("mlp", None, InferRequest([InferInput("x", "FP32",
                                                                              x.shape, x)]))
        snapshot = service.snapshot().models[0]
        await model.unload("admin")
        unloaded = [e for e in seen if isinstance(e, Unloaded)]
        return [picked, loads, answer.outputs[0].data.shape, len(snapshot.replicas),
                snapshot.resident_bytes > alone,  # each replica counts against the budget
                model.state, model.replicas.replicas, [e.reason for e in unloaded]]

    picked, loads, shape, replicas, summed, state, left, reasons = with_service(
        tmp_path, {"name": "mlp", "path": "mlp.onnx"}, scenario)
    assert picked == [0, 1]  # the second lease went to the idle replica
    assert loads == [1, 1]
    assert shape == (1, 2)
    assert replicas == 2
    assert summed
    assert (state, left, reasons) == (State.UNLOADED, [], ["admin"])


def test_a_model_found_not_to_batch_keeps_running_requests_alone_after_a_reload(
    tmp_path: Path,
) -> None:
    # y = x flattened: its one dimension is dynamic, but two requests' rows stacked cannot be
    # split back from it.
    write_flatten_model(tmp_path / "reshape.onnx")
    model_config = {"name": "reshape", "path": "reshape.onnx",
                    "batching": {"max_batch_size": 32, "max_delay": "200ms"}}

    async def two_at_once(service: InferenceService) -> list[np.ndarray]:
        xs = [np.full((3, 4), i, np.float32) for i in range(2)]
        answers = await asyncio.gather(*(
            service.infer("reshape", None, InferRequest([InferInput("x", "FP32", x.shape, x)]))
            for x in xs
        ))
        return [a.outputs[0].data for a in answers]

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> list[object]:
        first = await two_at_once(service)
        assert [e.reason for e in seen if isinstance(e, BatchingDisabled)] == [
            "an output's first dimension does not follow the batch's rows; running requests "
            "alone"]
        model = service.manager.models["reshape"]
        await model.unload("admin")
        seen.clear()
        again = await two_at_once(service)
        runs = [len(e.queue_seconds) for e in seen if isinstance(e, BatchRun)]
        disabled = [e for e in seen if isinstance(e, BatchingDisabled)]
        policy = model.replicas.policy
        return [first, again, runs, disabled, policy is not None and policy.enabled]

    first, again, runs, disabled, enabled = with_service(tmp_path, model_config, scenario)
    for answers in (first, again):
        for i, y in enumerate(answers):
            np.testing.assert_array_equal(y, np.full(12, i, np.float32))
    assert runs == [1, 1]  # after the reload: each alone, no batched run tried first
    assert disabled == []
    assert enabled is False
