"""A model's replica set, in process on real onnxruntime: a model that holds more than one
replica routes each lease to the least loaded one and unloads them all, and the one batching
policy of a model outlives its reloads."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from fake_clock import FakeClock
from fake_probe import FakeProbe
from onnx_models import write_flatten_model, write_mlp

from snoozeml.config.settings import ModelConfig, parse_config
from snoozeml.engine.events import (
    BatchingDisabled,
    BatchRun,
    EngineEvent,
    ReplicaDraining,
    ReplicaFailed,
    ReplicaRemoved,
    ReplicaUpgraded,
    Unloaded,
    UpgradeDeferred,
)
from snoozeml.engine.lifecycle import State
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.requests.request import InferInput, InferRequest
from snoozeml.engine.service import InferenceService
from snoozeml.errors import MemoryExhausted
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.onnx.instance import OnnxInstance

T = TypeVar("T")


def with_service(
    tmp_path: Path, model: dict[str, Any] | list[dict[str, Any]],
    scenario: Callable[[InferenceService, list[EngineEvent]], Awaitable[T]],
    server: dict[str, Any] | None = None, **manager: Any,
) -> T:
    models = model if isinstance(model, list) else [model]
    config = parse_config({"server": server or {}, "models": models},
                          source=tmp_path / "models.toml")

    async def main() -> T:
        service = InferenceService(ModelManager(config, **manager))
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
    assert sorted(picked) == [0, 1]  # the second lease went to the idle replica
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


# --- routing, failures and memory for replicas beyond the first ------------------------------

X = np.ones((1, 4), np.float32)


async def infer_once(service: InferenceService, name: str = "mlp") -> np.ndarray:
    answer = await service.infer(name, None, InferRequest([InferInput("x", "FP32", X.shape, X)]))
    return answer.outputs[0].data


def per_replica_requests(service: InferenceService, name: str = "mlp") -> dict[int, int]:
    (model,) = [m for m in service.snapshot().models if m.name == name]
    return {r.index: r.requests for r in model.replicas}


@pytest.mark.parametrize(("strategy", "expected"), [
    ("least-queue", {"busy": 0, "free": 4}),  # every request avoids the replica held busy
    ("round-robin", {"busy": 2, "free": 2}),  # each in turn, busy or not
])
def test_routing_with_one_replica_held_busy(tmp_path: Path, strategy: str,
                                            expected: dict[str, int]) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> dict[str, int]:
        model = service.manager.models["mlp"]
        await model.load()  # min = 2: brings both
        assert [r.state.value for r in model.replicas.replicas] == ["ready", "ready"]
        async with model.lease() as held:  # a request that stays queued or running
            for _ in range(4):
                await infer_once(service)
            counts = per_replica_requests(service)
        (free,) = [i for i in counts if i != held.index]
        return {"busy": counts[held.index], "free": counts[free]}

    got = with_service(tmp_path, {"name": "mlp", "path": "mlp.onnx", "replicas": {
        "min": 2, "max": 2, "strategy": strategy}}, scenario)
    assert got == expected


def test_least_queue_breaks_ties_in_turn(tmp_path: Path) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> dict[int, int]:
        await service.manager.models["mlp"].load()
        for _ in range(6):  # one at a time: both replicas are always equally idle
            await infer_once(service)
        return per_replica_requests(service)

    counts = with_service(tmp_path, {"name": "mlp", "path": "mlp.onnx",
                                     "replicas": {"min": 2, "max": 2}}, scenario)
    assert counts == {0: 3, 1: 3}


class FailingSecondLoad(OnnxBackend):
    """onnxruntime, except that every load after the first fails (what a broken driver or a
    file replaced by garbage does to a replica)."""

    loads = 0

    def load_blocking(self, spec: ModelConfig) -> OnnxInstance:
        self.loads += 1
        if self.loads > 1:
            raise RuntimeError("the device said no")
        return super().load_blocking(spec)


def test_a_replica_that_fails_to_load_leaves_the_model_serving_and_says_so(
    tmp_path: Path,
) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> list[object]:
        model = service.manager.models["mlp"]
        await model.load()  # min = 2: the second replica fails, the load itself does not
        errors = []
        with pytest.raises(RuntimeError, match="the device said no"):
            await model.steps.add_replica()
        errors.append(model.steps.blocked)
        y = await infer_once(service)
        status = service.snapshot().models[0]
        failed = [e for e in seen if isinstance(e, ReplicaFailed)]
        return [model.state, len(model.replicas.ready), y.shape, status.scaling, failed,
                errors]

    state, ready, shape, scaling, failed, errors = with_service(
        tmp_path, {"name": "mlp", "path": "mlp.onnx", "replicas": {"min": 2, "max": 3}},
        scenario, backend_factory=lambda spec: FailingSecondLoad())
    assert (state, ready, shape) == (State.READY, 1, (1, 2))
    assert scaling.failures == 2
    assert scaling.blocked is not None
    assert "the device said no" in scaling.blocked
    assert scaling.last_error == scaling.blocked
    assert [(e.memory, e.first) for e in failed] == [(False, True), (False, False)]  # one episode
    assert errors == [scaling.blocked]


def test_a_replica_memory_does_not_admit_is_refused_at_once_and_the_model_keeps_serving(
    tmp_path: Path,
) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 512, 64))
    probe = FakeProbe(host_total=10**9)  # nothing measured: each replica counts as predicted

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> list[object]:
        model = service.manager.models["mlp"]
        await model.load()
        with pytest.raises(MemoryExhausted) as refused:
            await model.steps.add_replica()
        y = await infer_once(service)
        status = service.snapshot().models[0]
        return [model.state, len(model.replicas.ready), y.shape, refused.value.message,
                status.scaling.failures, [e.memory for e in seen if isinstance(e, ReplicaFailed)]]

    predicted = int((tmp_path / "mlp.onnx").stat().st_size * 1.1)
    budget = int(predicted * 2.6)  # one replica and its load's peak; not two replicas' worth
    state, ready, shape, message, failures, kinds = with_service(
        tmp_path, {"name": "mlp", "path": "mlp.onnx", "replicas": {"max": 2},
                   "weights_cache": False},  # the default load: its peak is the file twice
        scenario,
        server={"memory": {"host_budget": budget}}, probe=probe)
    assert (state, ready, shape) == (State.READY, 1, (1, 64))
    assert "not enough memory on cpu for model 'mlp'" in message
    assert "an added replica does not wait for memory" in message
    assert (failures, kinds) == (1, [True])


def test_an_added_replica_evicts_only_models_colder_than_the_spike(tmp_path: Path) -> None:
    for name in ("hot", "cold", "warm"):
        write_mlp(tmp_path / f"{name}.onnx", dims=(64, 256, 64))
    clock = FakeClock(start=1000.0)
    probe = FakeProbe(host_total=10**9)

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> list[object]:
        models = service.manager.models
        await models["cold"].load()
        clock.advance(60.0)
        await models["warm"].load()
        await models["hot"].load()
        spike_started = clock.now() - 1.0  # warm was used within the spike; cold was not
        await models["hot"].steps.add_replica(colder_than=spike_started)
        with pytest.raises(MemoryExhausted):  # only warm is left, and it is spared
            await models["hot"].steps.add_replica(colder_than=spike_started)
        return [{name: m.state for name, m in models.items()},
                len(models["hot"].replicas.ready),
                [(e.reason, e.model) for e in seen if isinstance(e, Unloaded)]]

    predicted = int((tmp_path / "hot.onnx").stat().st_size * 1.1)
    states, ready, unloaded = with_service(
        # intra_op_threads set: no cap of one CPU replica per core (this machine may have 2).
        tmp_path, [{"name": n, "path": f"{n}.onnx", "intra_op_threads": 1,
                    "replicas": {"max": 3}, "weights_cache": False}
                   for n in ("hot", "cold", "warm")], scenario,
        # Three replicas and one load's peak (the default load's: the file twice) fit; a
        # fourth replica does not.
        server={"memory": {"host_budget": int(predicted * 4.6), "min_residency": "0s"}},
        probe=probe, clock=clock)
    assert states == {"hot": State.READY, "cold": State.UNLOADED, "warm": State.READY}
    assert ready == 2
    assert unloaded == [("memory_pressure", "cold")]


def test_scaling_down_drains_a_replica_without_losing_its_requests(tmp_path: Path) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> list[object]:
        model = service.manager.models["mlp"]
        await model.load()
        async with model.lease() as held:  # a request still on the replica that drains
            other = next(r for r in model.replicas.ready if r is not held)
            async with model.lease():
                pass
            # The least loaded replica is the other one; make the held one the only choice.
            model.replicas.ready.remove(other)
            model.replicas.ready.append(other)
            other.in_flight += 5
            removing = asyncio.create_task(model.steps.remove_replica())
            await asyncio.sleep(0)
            other.in_flight -= 5
            states = [r.state.value for r in model.replicas.replicas]
            y = await held.batcher.submit({"x": X}, None, None)  # it still answers
            done_early = removing.done()
        removed = await removing
        kinds = [type(e).__name__ for e in seen
                 if isinstance(e, ReplicaDraining | ReplicaRemoved)]
        return [states, y["y"].shape, done_early, removed, len(model.replicas.replicas),
                model.replicas.ready[0] is other, kinds]

    states, shape, done_early, removed, left, kept, kinds = with_service(
        tmp_path, {"name": "mlp", "path": "mlp.onnx", "replicas": {"min": 2, "max": 2}},
        scenario)
    assert sorted(states) == ["draining", "ready"]
    assert shape == (1, 2)
    assert done_early is False  # it waited for the lease
    assert removed is True
    assert left == 1
    assert kept
    assert kinds == ["ReplicaDraining", "ReplicaRemoved"]


class EveryDeviceIsThere(OnnxBackend):
    """onnxruntime on the CPU whose memory counts on the GPU it is given, as it would with the
    CUDA provider (no GPU here: onnxruntime falls back to its CPU provider and says so)."""

    def memory_device(self, spec: ModelConfig, gpus: Sequence[str]) -> str:
        return spec.device if spec.device in gpus else "cpu"


def test_replicas_spread_over_their_devices_by_free_budget(tmp_path: Path) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    probe = FakeProbe(host_total=10**9, gpu_totals={"cuda:0": 10**8, "cuda:1": 10**8})

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> list[object]:
        model = service.manager.models["mlp"]
        await model.load()  # min = 2: the first where there is most room, then the other
        y = await infer_once(service)
        status = service.snapshot()
        used = {d.name: d.used_bytes for d in status.devices}
        return [[r.device for r in status.models[0].replicas], used, y.shape,
                status.models[0].scaling.devices]

    devices, used, shape, listed = with_service(
        tmp_path, {"name": "mlp", "path": "mlp.onnx",
                   "replicas": {"min": 2, "max": 2, "devices": ["cuda:0", "cuda:1"]}},
        scenario, server={"memory": {"gpu_budget": "50%"}}, probe=probe,
        backend_factory=lambda spec: EveryDeviceIsThere())
    assert sorted(devices) == ["cuda:0", "cuda:1"]
    assert used["cuda:0"] == used["cuda:1"] > 0  # each replica counts on its own device
    assert used["cpu"] == 0
    assert shape == (1, 2)
    assert listed == ("cuda:0", "cuda:1")


def test_an_upgrade_memory_does_not_admit_is_deferred_and_the_model_keeps_serving(
    tmp_path: Path,
) -> None:
    from snoozeml.runtime.onnx.cache import build_blocking

    path = write_mlp(tmp_path / "mlp.onnx", dims=(64, 1024, 1024, 64))
    build_blocking(tmp_path / "cache" / "onnx", path)  # mapped from the first load on
    probe = FakeProbe(host_total=10**9)  # nothing measured: the model counts as predicted
    predicted = int(path.stat().st_size * 1.1)

    async def scenario(service: InferenceService, seen: list[EngineEvent]) -> list[object]:
        rows = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32)
        told = asyncio.Event()
        service.events.subscribe(lambda event: told.set(), [UpgradeDeferred, ReplicaUpgraded])
        answer = await service.infer("mlp", None,
                                     InferRequest([InferInput("x", "FP32", (8, 64), rows)]))
        await asyncio.wait_for(told.wait(), 30)  # the upgrade tried after that 8-row batch
        model = service.manager.models["mlp"]
        return [answer.outputs[0].data.shape, model.state, model.replicas.upgrades.under_way,
                [(e.retry, "free room" in e.reason) for e in seen
                 if isinstance(e, UpgradeDeferred)],
                [e for e in seen if isinstance(e, ReplicaUpgraded)]]

    # Room for the mapped load (its size, the graph twice and 1 MiB), not for the packed copy.
    shape, state, under_way, deferred, upgraded = with_service(
        tmp_path, {"name": "mlp", "path": "mlp.onnx"}, scenario,
        server={"cache_dir": str(tmp_path / "cache"),
                "memory": {"host_budget": predicted + 2 * 2**20}}, probe=probe)
    assert (shape, state, under_way) == ((8, 64), State.READY, 0)
    assert deferred == [(True, True)]
    assert upgraded == []
