"""ModelMesh's runtime (engine/modelmesh.py) on a real manager with real ONNX models: its status
is STARTING until the listeners are up and then purges what ModelMesh loaded, a load a purge
removed fails, and it unloads only what it loaded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from added_models import run_with_added

from snoozeml.engine.added import AddedModels
from snoozeml.engine.lifecycle import State
from snoozeml.engine.modelmesh import MeshRuntime
from snoozeml.engine.registry import ModelManager
from snoozeml.errors import InvalidInput, ModelNotFound


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
