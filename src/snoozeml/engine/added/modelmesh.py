"""KServe ModelMesh's model-runtime SPI, in the engine's terms (api/grpc/modelmesh.py speaks the
gRPC).

ModelMesh is the cluster-wide LRU cache of models: it decides which pod holds which model. So
the models it loads here are pinned (no idle unload, no local eviction), never loaded by a
request (ModelMesh reads only NOT_FOUND as "not here"), and, when this daemon's memory cannot
hold one, its load fails with a clear error, leaves nothing registered, and ModelMesh places it
elsewhere. They are served like any other model, with batching, replicas, metrics and status.

`status` is what ModelMesh polls at its start: STARTING until the listeners are up, then READY
once every model it loaded before is purged (its view of what is loaded starts empty).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from snoozeml import __version__
from snoozeml.engine.added.models import AddedModels
from snoozeml.engine.lifecycle import State
from snoozeml.engine.registry import ModelManager
from snoozeml.errors import InvalidInput, ModelNotFound
from snoozeml.hub.by_path import check_name, file_bytes, kind_of

ORIGIN = "modelmesh"
_UINT32 = 2**32 - 1


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    ready: bool
    capacity_bytes: int
    loading_concurrency: int
    load_timeout_ms: int
    default_model_bytes: int
    version: str


class MeshRuntime:
    def __init__(self, manager: ModelManager, added: AddedModels, started: asyncio.Event) -> None:
        self._manager = manager
        self._added = added
        self._started = started

    async def status(self) -> RuntimeInfo:
        ready = self._started.is_set()
        if ready:
            await self._added.forget_all(ORIGIN)
        server = self._manager.config.server
        return RuntimeInfo(
            ready=ready,
            capacity_bytes=self.capacity(),
            loading_concurrency=server.modelmesh_loading_concurrency,
            load_timeout_ms=min(round(server.load_timeout * 1000), _UINT32),
            default_model_bytes=server.modelmesh_default_model_size,
            version=__version__,
        )

    def capacity(self) -> int:
        """The budget ModelMesh's models count against: the first GPU's when there is one
        (a model on `device = "auto"` goes there), else the host's."""
        budgets = self._manager.memory.budgets
        gpus = [device for device in budgets if device != "cpu"]
        return budgets[gpus[0]] if gpus else budgets["cpu"]

    async def load(self, model_id: str, path: str, model_type: str, model_key: str) -> int:
        """Load the model; its measured size. InvalidInput when nothing was attempted; any
        other error leaves nothing registered under `model_id` (engine/added/models.py)."""
        check_name(model_id)
        kind = kind_of(model_type, model_key)
        _check_path(path)
        model = await self._added.load(model_id, Path(path), ORIGIN, kind, placed=True)
        return model.resident_bytes() or 0

    async def unload(self, model_id: str) -> None:
        """Unload a model ModelMesh loaded (a model models.toml or the repository API added
        is not ModelMesh's to unload: OK, and it stays)."""
        await self._added.forget(model_id, ORIGIN)

    def size(self, model_id: str) -> int:
        model = self._manager.models.get(model_id)
        if model is None or self._added.origin(model_id) != ORIGIN:
            raise ModelNotFound(f"model {model_id!r} is not loaded here")
        if model.state is not State.READY:
            raise ModelNotFound(f"model {model_id!r} is {model.state.value}, not loaded")
        return model.resident_bytes() or 0

    async def predict_size(self, model_id: str, path: str, model_type: str,
                           model_key: str) -> int:
        """From the files alone (their bytes times the memory factor): fast, and at least what
        the model will measure in practice, as ModelMesh asks."""
        check_name(model_id)
        kind_of(model_type, model_key)
        _check_path(path)
        folder = Path(path)
        found = await asyncio.get_running_loop().run_in_executor(  # not behind the loads
            None, partial(file_bytes, folder))
        factor = self._manager.config.server.memory.memory_factor
        return int(found * factor)


def _check_path(path: str) -> None:
    if not path.strip():
        raise InvalidInput("modelPath is empty: ModelMesh gives the path of the model's files")
