"""The registry of models: building them, finding them, preloading at start (and starting the
autoscaler) and unloading everything at shutdown.

Models come from models.toml, or are added at run time (engine/added/models.py: ModelMesh's
loadModel,
the repository extension's load by path) and removed again, with the same lifecycle, batching,
memory admission, metrics and status. A model being removed leaves `models` at once (no new
request finds it) but its memory is counted until its unload has finished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from snoozeml.config.settings import Config, ModelConfig, default_cache_dir
from snoozeml.engine.clock import Clock, LoopClock, Timer
from snoozeml.engine.events import EventBus, ModelAdded, ModelRemoved
from snoozeml.engine.keepalive.keeper import PrewarmBudget
from snoozeml.engine.keepalive.store import (
    FILE_NAME,
    SAVE_EVERY_S,
    histories_json,
    read_histories,
    write_histories,
)
from snoozeml.engine.memory.budgets import MemoryManager
from snoozeml.engine.memory.probes import MemoryProbe, SystemProbe
from snoozeml.engine.model import Model
from snoozeml.engine.replicas.autoscaler import Autoscaler
from snoozeml.engine.replicas.pool import Placement, ReplicaSet
from snoozeml.errors import ModelNotFound, SnoozeError, describe_exception
from snoozeml.logs import log_event
from snoozeml.runtime.base import Backend
from snoozeml.runtime.registry import backend_for


class ModelManager:
    def __init__(
        self,
        config: Config,
        events: EventBus | None = None,
        backend_factory: Callable[[ModelConfig], Backend] | None = None,
        clock: Clock | None = None,
        probe: MemoryProbe | None = None,
    ) -> None:
        self.config = config
        self.events = events or EventBus()
        self.clock = clock or LoopClock()
        # Loads and unloads run here, off the event loop; inference has its own threads.
        self.loader = ThreadPoolExecutor(4, thread_name_prefix="snooze-load")
        cache_dir = config.server.cache_dir or default_cache_dir()
        if backend_factory is None:
            backend_factory = partial(backend_for, cache_dir=cache_dir)
        probe = probe or SystemProbe()
        # Any adaptive keep-alive: eviction by cost (eviction = "auto"). Either: the histories
        # that they read, kept across restarts.
        adaptive = "adaptive" in (config.server.keep_alive,
                                  *(spec.keep_alive for spec in config.models))
        eviction = config.server.memory.eviction
        cost_aware = eviction == "cost" or (eviction == "auto" and adaptive)
        self.memory = MemoryManager(config.server, probe, self._tenants, self.events,
                                    self.clock.now, cost_aware=cost_aware)
        self.prewarms = PrewarmBudget(self.clock)  # every model's, together
        self.history_path = cache_dir / FILE_NAME if adaptive or cost_aware else None
        self._histories = read_histories(self.history_path) if self.history_path else {}
        self._save_timer: Timer | None = None
        self.saving: asyncio.Future[None] | None = None  # the last periodic write
        self._backend_factory = backend_factory
        self._gpus = probe.gpus()
        self.models: dict[str, Model] = {}
        self.origins: dict[str, str] = {}  # name -> "config", "repository" or "modelmesh"
        self.leaving: dict[str, asyncio.Task[None]] = {}  # name -> its removal, until done
        self._leaving_models: dict[str, Model] = {}
        for spec in config.models:
            self.models[spec.name] = self.build(spec)
            self.origins[spec.name] = "config"
        self.autoscaler = Autoscaler(self.models.values(), self.events, self.clock)
        self._preloads: list[asyncio.Task[None]] = []
        self._sizes: asyncio.Task[None] | None = None  # every model's, read once at start

    def build(self, spec: ModelConfig, on_demand: bool = True) -> Model:
        """A model for `spec`, not registered (see `add`); `on_demand` False: only an explicit
        load loads it (engine/model.py)."""
        backend = self._backend_factory(spec)
        placements = [
            Placement(device, self.memory.device_key(
                backend.memory_device(spec.model_copy(update={"device": device}), self._gpus)))
            for device in spec.replicas.devices or [spec.device]
        ]
        replicas = ReplicaSet(spec, backend, placements, self.loader, self.memory,
                              self.events, self.clock)
        return Model(spec, replicas, self.events, self.clock, on_demand, self.prewarms,
                     self._histories.get(spec.name))

    def _tenants(self) -> list[Model]:
        return [*self.models.values(), *self._leaving_models.values()]

    def add(self, spec: ModelConfig, origin: str, on_demand: bool = True) -> Model:
        """Register a model at run time (not loaded); the name must be free, and no removal
        of that name may be under way (`await removed(name)` first)."""
        assert spec.name not in self.models
        assert spec.name not in self.leaving
        model = self.build(spec, on_demand)
        self.models[spec.name] = model
        self.origins[spec.name] = origin
        self.autoscaler.watch(model)
        self.events.publish(ModelAdded(spec.name, origin, str(spec.path)))
        return model

    def remove(self, name: str) -> asyncio.Task[None]:
        """Unload a model added at run time and forget it; the name is unknown at once, and
        the returned task ends once its memory is free. Shared by concurrent callers."""
        task = self.leaving.get(name)
        if task is not None:
            return task
        model = self.models.pop(name)
        origin = self.origins.pop(name)
        model.retired = True
        model.keep.retire()
        self._histories[name] = model.keep.history  # a model added again goes on from it
        self._leaving_models[name] = model
        task = self.leaving[name] = asyncio.get_running_loop().create_task(
            self._remove(model, origin))
        return task

    async def _remove(self, model: Model, origin: str) -> None:
        try:
            await self.autoscaler.unwatch(model.name)
            await model.unload("removed")
            # Work a load left for later (writing the weights cache) holds memory too: the
            # removal ends once the budget is whole again.
            await model.replicas.finish_background()
        except Exception as exc:  # boundary of a background task: the name goes either way
            log_event("unload_failed", logging.ERROR, model=model.name,
                      error=describe_exception(exc))
        finally:
            del self._leaving_models[model.name]
            del self.leaving[model.name]
            self.events.publish(ModelRemoved(model.name, origin))

    async def removed(self, name: str) -> None:
        """Return once no removal of `name` is under way (however it ended)."""
        task = self.leaving.get(name)
        if task is not None:
            await asyncio.wait({task})

    def get(self, name: str, version: str | None = None) -> Model:
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(f"unknown model {name!r}")
        if version not in (None, "") and version not in model.versions:
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        return model

    def start_preloads(self) -> None:
        """Load the `preload = true` models and those kept loaded (`replicas.min` > 0), read
        every model's predicted size, in the background; start the autoscaler."""
        self.autoscaler.start()
        self._save_later()
        for model in self.models.values():
            if model.spec.preload or model.spec.replicas.min > 0:
                self._preloads.append(asyncio.create_task(self._preload(model)))
        self._sizes = asyncio.create_task(self._predict_sizes())

    async def _predict_sizes(self) -> None:
        for model in self.models.values():
            try:
                await model.predict_size()
            except Exception as exc:  # a missing file fails its load with its own message
                log_event("size_unknown", logging.DEBUG, model=model.name,
                          error=describe_exception(exc))

    async def _preload(self, model: Model) -> None:
        try:
            await model.load("preload")
        except SnoozeError as exc:
            log_event("preload_failed", logging.WARNING, model=model.name, error=exc.message)
        except Exception as exc:  # boundary of a background task
            log_event("preload_failed", logging.ERROR, model=model.name,
                      error=describe_exception(exc))

    # --- the keep-alive's histories ----------------------------------------------------------

    def histories_text(self) -> str:
        """Every model's idle-gap history (those removed at run time too) as the file's text."""
        histories = dict(self._histories)
        histories.update((name, model.keep.history) for name, model in self.models.items())
        return histories_json(histories)

    def _save_later(self) -> None:
        if self.history_path is not None:
            self._save_timer = self.clock.call_later(SAVE_EVERY_S, self._save_now)

    def _save_now(self) -> None:
        assert self.history_path is not None
        self.saving = asyncio.get_running_loop().run_in_executor(
            self.loader, write_histories, self.history_path, self.histories_text())
        self._save_later()

    async def shutdown(self) -> None:
        """Stop scaling, unload every model (reason `shutdown`) and stop the loader threads;
        write the keep-alive's histories."""
        if self._save_timer is not None:
            self._save_timer.cancel()
        for model in self.models.values():
            model.keep.retire()
        await self.autoscaler.stop()
        # The listeners have stopped, so nobody waits for a load any more: a load still
        # running (one that hangs, say) must not hold the exit up to its load_timeout.
        await asyncio.gather(*(model.abandon_load() for model in self._tenants()))
        if self.leaving:  # removals finish first: their memory and threads are the loader's
            await asyncio.wait(set(self.leaving.values()))
        if self._sizes is not None:  # only for show; a file that hangs must not hold the exit
            self._sizes.cancel()
            await asyncio.wait({self._sizes})
        for task in self._preloads:
            if not task.done():
                await asyncio.wait({task})
        results = await asyncio.gather(
            *(model.unload("shutdown") for model in self.models.values()), return_exceptions=True
        )
        for model, result in zip(self.models.values(), results, strict=True):
            if isinstance(result, BaseException):
                log_event("unload_failed", logging.ERROR, model=model.name,
                          error=describe_exception(result))
        await asyncio.gather(*(model.replicas.finish_background()
                               for model in self.models.values()))
        self.loader.shutdown(wait=True)
        if self.history_path is not None:
            write_histories(self.history_path, self.histories_text())
