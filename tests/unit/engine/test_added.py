"""Models added and removed at run time (engine/added.py) and ModelMesh's runtime status
(engine/modelmesh.py), on a real manager with real ONNX models: the orderings a ModelMesh
cancel-then-unload may produce, driven step by step on one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from onnx_models import write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.added import AddedModels
from snoozeml.engine.lifecycle import State
from snoozeml.engine.modelmesh import MeshRuntime
from snoozeml.engine.registry import ModelManager
from snoozeml.errors import InvalidInput, ModelNotFound

T = TypeVar("T")


def run(tmp_path: Path, scenario: Callable[[ModelManager, AddedModels, Path],
                                           Awaitable[T]]) -> T:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    config = parse_config({}, source=tmp_path / "models.toml")

    async def main() -> T:
        manager = ModelManager(config)
        try:
            return await scenario(manager, AddedModels(manager), path)
        finally:
            await manager.shutdown()

    return asyncio.run(main())


def test_a_forget_while_the_path_is_read_withdraws_the_add(tmp_path: Path) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        adding = asyncio.create_task(added.register("m", path, "modelmesh"))
        await asyncio.sleep(0)  # one turn: the add is reading the path in a thread now
        await added.forget("m")
        with pytest.raises(ModelNotFound, match="unloaded while it was being added"):
            await adding
        return manager.models.get("m"), manager.memory.used("cpu")

    assert run(tmp_path, scenario) == (None, 0)


def test_a_cancelled_load_removes_its_model_once_the_load_ends(tmp_path: Path) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        loading = asyncio.create_task(added.load("m", path, "modelmesh", pinned=True))
        while manager.models.get("m") is None or manager.models["m"].state is not State.LOADING:
            await manager.events.changed().wait()
        loading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loading
        await manager.removed("m")
        return "m" in manager.models, manager.memory.used("cpu"), manager.memory.reserved("cpu")

    assert run(tmp_path, scenario) == (False, 0, 0)


def test_a_pinned_model_never_idles_and_a_second_add_from_the_same_path_is_the_same(
    tmp_path: Path,
) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        model = await added.load("m", path, "modelmesh", pinned=True)
        again = await added.load("m", path, "modelmesh", pinned=True)
        with pytest.raises(InvalidInput, match="added from"):
            await added.register("m", path, "repository")
        return again is model, model.pinned, model.expires_in(), model.state

    assert run(tmp_path, scenario) == (True, True, None, State.READY)


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

    before, after = run(tmp_path, scenario)
    assert before == (False, ["mesh", "repo"])  # STARTING purges nothing
    assert after == (True, ["repo"])  # READY: only what ModelMesh loaded is purged


def test_a_second_add_waiting_on_a_withdrawn_one_registers_nothing_either(
    tmp_path: Path,
) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        first = asyncio.create_task(added.register("m", path, "modelmesh"))
        await asyncio.sleep(0)  # one turn: the first add is reading the path
        second = asyncio.create_task(added.register("m", path, "modelmesh"))
        await asyncio.sleep(0)  # the second waits on the first
        await added.forget("m")
        outcomes = await asyncio.gather(first, second, return_exceptions=True)
        return [type(outcome).__name__ for outcome in outcomes], "m" in manager.models

    assert run(tmp_path, scenario) == (["ModelNotFound", "ModelNotFound"], False)


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

    assert run(tmp_path, scenario) == (False, 0)


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

    assert run(tmp_path, scenario) == (State.READY, "repository")
