"""Models added and removed at run time (engine/added/models.py), on a real manager with real ONNX
models: the orderings a ModelMesh cancel-then-unload may produce, driven step by step on one
event loop. (ModelMesh's runtime itself: test_modelmesh.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from added_models import run_with_added

from snoozeml.engine.added.models import AddedModels
from snoozeml.engine.lifecycle import State
from snoozeml.engine.registry import ModelManager
from snoozeml.errors import InvalidInput, ModelNotFound


def test_a_forget_while_the_path_is_read_withdraws_the_add(tmp_path: Path) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        adding = asyncio.create_task(added.register("m", path, "modelmesh"))
        await asyncio.sleep(0)  # one turn: the add is reading the path in a thread now
        await added.forget("m")
        with pytest.raises(ModelNotFound, match="unloaded while it was being added"):
            await adding
        return manager.models.get("m"), manager.memory.used("cpu")

    assert run_with_added(tmp_path, scenario) == (None, 0)


def test_a_cancelled_load_removes_its_model_once_the_load_ends(tmp_path: Path) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        loading = asyncio.create_task(added.load("m", path, "modelmesh", placed=True))
        while manager.models.get("m") is None or manager.models["m"].state is not State.LOADING:
            await manager.events.changed().wait()
        loading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loading
        await manager.removed("m")
        return "m" in manager.models, manager.memory.used("cpu"), manager.memory.reserved("cpu")

    assert run_with_added(tmp_path, scenario) == (False, 0, 0)


def test_a_placed_model_never_idles_and_a_second_add_from_the_same_path_is_the_same(
    tmp_path: Path,
) -> None:
    async def scenario(manager: ModelManager, added: AddedModels, path: Path) -> object:
        model = await added.load("m", path, "modelmesh", placed=True)
        again = await added.load("m", path, "modelmesh", placed=True)
        with pytest.raises(InvalidInput, match="added from"):
            await added.register("m", path, "repository")
        return again is model, model.pinned, model.expires_in(), model.state

    assert run_with_added(tmp_path, scenario) == (True, True, None, State.READY)


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

    assert run_with_added(tmp_path, scenario) == (["ModelNotFound", "ModelNotFound"], False)
