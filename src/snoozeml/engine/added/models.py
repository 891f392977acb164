"""Models added and removed at run time: by ModelMesh's model-runtime SPI (api/grpc/modelmesh.py)
and
by the repository extension's load with a `path` parameter.

Adding reads the path's metadata off the loop (hub/by_path.py), then registers the model with
the manager; removing unloads it and forgets it (engine/registry.py). The order of the two is
what ModelMesh relies on: once `forget(name)` returns, the model is not loaded and will not be,
whatever an add of the same name was doing:

- an add still reading its path is withdrawn: it registers nothing;
- a registered model is removed, its load (if one runs) finished and unloaded;
- an add cancelled by its caller while its model loads removes the model itself.

A model its caller places (`placed`: ModelMesh's) is pinned, never loaded on demand by a
request, and a load of it that fails for any reason removes it too: the caller places it
elsewhere, and nothing of it stays here (a request for it is answered ModelNotFound).

Invariants: a name is pending (being read) or registered or leaving, never two at once; the
check that an add was not withdrawn and its registration happen without an await between them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from snoozeml.engine.model import Model
from snoozeml.engine.registry import ModelManager
from snoozeml.errors import InvalidInput, ModelNotFound

CONFIG = "config"


@dataclass(slots=True)
class _Pending:
    done: asyncio.Future[None]
    path: Path
    origin: str
    withdrawn: bool = False


class AddedModels:
    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager
        self._pending: dict[str, _Pending] = {}

    def origin(self, name: str) -> str | None:
        return self._manager.origins.get(name)

    def added(self, origin: str) -> list[str]:
        """The names registered by `origin`, now."""
        return [name for name, o in self._manager.origins.items() if o == origin]

    async def register(
        self, name: str, path: Path, origin: str, kind: str | None = None, placed: bool = False
    ) -> Model:
        """The model `name` at `path`, registered (not loaded): the one `origin` added from the
        same path before, or a new one. InvalidInput when the path holds nothing servable or
        the name is taken by another model; ModelNotFound when `forget(name)` came first.
        `placed`: pinned, and loaded only by `load` (never by a request)."""
        manager = self._manager
        while True:
            await manager.removed(name)  # a removal under way finishes first
            model = manager.models.get(name)
            if model is not None:
                self._check_same(model, path, origin)
                return model
            pending = self._pending.get(name)
            if pending is None:
                break
            if pending.path != path:
                raise InvalidInput(f"model {name!r} is being added from {pending.path}; unload "
                                   "it before adding another model under that name")
            await asyncio.shield(pending.done)
            if pending.withdrawn:  # forget(name) came after this add, too
                raise ModelNotFound(f"model {name!r} was unloaded while it was being added")
        from snoozeml.hub.by_path import spec_for_path  # the Hub's scanners: first add only

        loop = asyncio.get_running_loop()
        pending = self._pending[name] = _Pending(loop.create_future(), path, origin)
        try:
            spec = await loop.run_in_executor(
                manager.loader, partial(spec_for_path, name, path, manager.config.server, kind,
                                        None if placed else "server"))
        finally:
            del self._pending[name]
            pending.done.set_result(None)
        if pending.withdrawn:
            raise ModelNotFound(f"model {name!r} was unloaded while it was being added")
        return manager.add(spec, origin, on_demand=not placed)

    def _check_same(self, model: Model, path: Path, origin: str) -> None:
        had = self._manager.origins.get(model.name)
        if had == CONFIG:
            raise InvalidInput(f"model {model.name!r} is configured in models.toml; a path "
                               "cannot replace it")
        if had != origin or model.spec.path.resolve() != _found_in(path, model.spec.path):
            raise InvalidInput(f"model {model.name!r} was added from {model.spec.path} (by "
                               f"{had}); unload it before adding another model under that name")

    async def load(
        self, name: str, path: Path, origin: str, kind: str | None = None, placed: bool = False
    ) -> Model:
        """`register`, then load; a caller that goes away while the model loads leaves
        nothing behind (the model is removed once its load ends), nor does a `placed` model
        whose load fails (removed, its memory free, before the error is raised)."""
        model = await self.register(name, path, origin, kind, placed)
        try:
            await model.load()
        except asyncio.CancelledError:
            self._drop(model)
            raise
        except Exception:
            if placed:
                self._drop(model)
                await self._manager.removed(name)
            raise
        if model.retired:  # removed while it loaded (an unload, ModelMesh's purge)
            raise ModelNotFound(f"model {name!r} was unloaded while it was loading")
        return model

    def _drop(self, model: Model) -> None:
        """Remove `model` if it is still the one registered under its name."""
        if self._manager.models.get(model.name) is model:
            self._manager.remove(model.name)

    async def forget(self, name: str, origin: str | None = None) -> None:
        """Unload the model added as `name` (by `origin`, when given) and forget it; return
        once its memory is free and no add of that name can register any more. A no-op for
        an unknown name, a configured model, or one another origin added."""
        pending = self._pending.get(name)
        if pending is not None and origin in (None, pending.origin):
            pending.withdrawn = True
        had = self._manager.origins.get(name)
        if had not in (None, CONFIG) and origin in (None, had):
            self._manager.remove(name)
        await self._manager.removed(name)

    async def forget_all(self, origin: str) -> None:
        for pending in self._pending.values():
            if pending.origin == origin:
                pending.withdrawn = True
        await asyncio.gather(*(self.forget(name, origin) for name in self.added(origin)))


def _found_in(path: Path, model_path: Path) -> Path:
    """`model_path` when it lies at or under `path` (the folder a model was added from, or its
    file), else `path` itself; resolved."""
    path, model_path = path.resolve(), model_path.resolve()
    return model_path if model_path == path or model_path.is_relative_to(path) else path
