"""ModelMesh's runtime (engine/added/modelmesh.py) on a real manager with real ONNX models: its
status
is STARTING until the listeners are up and then purges what ModelMesh loaded, a load a purge
removed fails, it unloads only what it loaded, a load that fails leaves nothing under its id,
and no request loads a model of ModelMesh's (it places them)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from added_models import run_with_added
from broken_models import external_missing
from onnx_models import write_mlp

from snoozeml.engine.added.modelmesh import MeshRuntime
from snoozeml.engine.added.models import AddedModels
from snoozeml.engine.lifecycle import State
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.requests.request import InferInput, InferRequest
from snoozeml.engine.service import InferenceService
from snoozeml.errors import InvalidInput, MemoryExhausted, ModelLoadFailed, ModelNotFound

X = np.ones((2, 4), np.float32)


def test_runtime_status_is_starting_until_the_listeners_are_up_then_purges(
    tmp_path: Path,
) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        started = asyncio.Event()
        runtime = MeshRuntime(manager, added, started)
        await runtime.load("mesh", str(path), "onnx", "")
        await added.load("repo", path, "repository")
        before = (await runtime.status()).ready, sorted(manager.models)
        started.set()
        after = (await runtime.status()).ready, sorted(manager.models)
        return before, after

    before, after = run_with_added(tmp_path, scenario)
    assert before == (False, ["mesh", "repo"])  # STARTING purges nothing
    assert after == (True, ["repo"])  # READY: only what ModelMesh loaded is purged


def test_a_load_that_a_purge_removed_meanwhile_fails_instead_of_answering_ok(
    tmp_path: Path,
) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        started = asyncio.Event()
        started.set()
        runtime = MeshRuntime(manager, added, started)
        loading = asyncio.create_task(runtime.load("m", str(path), "onnx", ""))
        while manager.models.get("m") is None or manager.models["m"].state is not State.LOADING:
            await manager.events.changed().wait()
        await runtime.status()  # ModelMesh restarted: purge
        with pytest.raises(ModelNotFound, match="unloaded while it was loading"):
            await loading
        return "m" in manager.models, manager.memory.used("cpu")

    assert run_with_added(tmp_path, scenario) == (False, 0)


def test_modelmesh_unloads_only_what_it_loaded(tmp_path: Path) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        runtime = MeshRuntime(manager, added, asyncio.Event())
        await added.load("repo", path, "repository")
        await runtime.unload("repo")  # not ModelMesh's: OK, and it stays
        with pytest.raises(InvalidInput, match="modelPath is empty"):
            await runtime.load("x", "", "onnx", "")
        with pytest.raises(InvalidInput, match="modelPath is empty"):
            await runtime.predict_size("x", " ", "onnx", "")
        return manager.models["repo"].state, manager.origins["repo"]

    assert run_with_added(tmp_path, scenario) == (State.READY, "repository")



async def answer(service: InferenceService, name: str) -> object:
    """What the service answers a request for `name`: its output's shape, or the error's
    class."""
    try:
        response = await service.infer(name, None, InferRequest([InferInput("x", "FP32",
                                                                             X.shape, X)]))
    except Exception as exc:
        return type(exc).__name__
    return response.outputs[0].shape


def mesh(manager: ModelManager) -> tuple[InferenceService, MeshRuntime]:
    """The service over `manager`, and ModelMesh's runtime over the service's added models,
    READY."""
    service = InferenceService(manager)
    started = asyncio.Event()
    started.set()
    return service, MeshRuntime(manager, service.added, started)


def test_a_load_refused_for_memory_leaves_nothing_and_loads_once_there_is_room(
    tmp_path: Path,
) -> None:
    wide = write_mlp(tmp_path / "wide.onnx", dims=(4, 65536, 2))  # a 3.7 MiB peak: one fits
    other = write_mlp(tmp_path / "other.onnx", dims=(4, 65536, 2), seed=1)

    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        service, runtime = mesh(manager)
        await runtime.load("first", str(wide), "onnx", "")
        with pytest.raises(MemoryExhausted, match="not enough memory"):
            await runtime.load("m", str(other), "onnx", "")
        refused = ("m" in manager.models, await answer(service, "m"),
                   manager.memory.used("cpu") == manager.models["first"].resident_bytes(),
                   manager.memory.reserved("cpu"))
        await runtime.unload("first")  # ModelMesh makes room, and asks again
        await runtime.load("m", str(other), "onnx", "")
        return refused, await answer(service, "m"), manager.models["m"].state

    assert run_with_added(tmp_path, scenario, {"memory": {
        "host_budget": "4MiB", "memory_wait": "0.05s"}}) == (
        (False, "ModelNotFound", True, 0), (2, 2), State.READY)


def test_a_load_that_fails_on_a_bad_file_leaves_nothing_under_its_id(tmp_path: Path) -> None:
    broken = external_missing(tmp_path)  # scanned as ONNX, fails to load

    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        service, runtime = mesh(manager)
        with pytest.raises(ModelLoadFailed, match=r"no-data\.data"):
            await runtime.load("m", str(broken), "onnx", "")
        failed = "m" in manager.models, await answer(service, "m")
        with pytest.raises(ModelLoadFailed):  # the repository API's model stays, FAILED
            await service.added.load("repo", broken, "repository")
        await runtime.load("m", str(path), "onnx", "")  # the same id, from good files
        return failed, manager.models["repo"].state, await answer(service, "m")

    assert run_with_added(tmp_path, scenario) == (
        (False, "ModelNotFound"), State.FAILED, (2, 2))


def test_no_request_loads_a_modelmesh_model_that_was_unloaded_here(tmp_path: Path) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        service, runtime = mesh(manager)
        await runtime.load("m", str(path), "onnx", "")
        model = manager.models["m"]
        loaded = await answer(service, "m")
        await model.unload("memory_pressure")  # as an eviction would, were it not pinned
        with pytest.raises(ModelNotFound):
            service.model_ready("m")
        with pytest.raises(ModelNotFound):
            await service.model_metadata("m")
        unloaded = await answer(service, "m"), model.state
        await runtime.load("m", str(path), "onnx", "")  # ModelMesh places it here again
        return loaded, unloaded, await answer(service, "m"), service.model_ready("m")

    assert run_with_added(tmp_path, scenario) == (
        (2, 2), ("ModelNotFound", State.UNLOADED), (2, 2), True)
