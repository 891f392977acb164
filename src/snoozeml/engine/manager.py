"""The registry of configured models and the InferenceService facade the transports call."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from snoozeml import SERVER_NAME, __version__
from snoozeml.config import Config, ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.lifecycle import State
from snoozeml.engine.memory import MemoryManager
from snoozeml.engine.model import Model, describe_exception
from snoozeml.engine.probes import MemoryProbe, SystemProbe
from snoozeml.engine.request import InferOutput, InferRequest, InferResponse
from snoozeml.engine.validate import check_request
from snoozeml.errors import InvalidInput, ModelNotFound, SnoozeError
from snoozeml.logs import log_event
from snoozeml.runtime.base import Backend, backend_for, memory_device

MODEL_VERSION = "1"
EXTENSIONS = ("binary_tensor_data", "model_repository")


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


class ModelManager:
    """Owns every Model: lookup, preloading at start, unloading everything at shutdown."""

    def __init__(
        self,
        config: Config,
        backend_factory: Callable[[ModelConfig], Backend] = backend_for,
        clock: Callable[[], float] = time.monotonic,
        probe: MemoryProbe | None = None,
    ) -> None:
        self.config = config
        # Loads and unloads run here, off the event loop; inference has its own threads.
        self.loader = ThreadPoolExecutor(4, thread_name_prefix="snooze-load")
        probe = probe or SystemProbe()
        self.memory = MemoryManager(config.server, probe, lambda: self.models.values(), clock)
        gpus = probe.gpus()
        self.models: dict[str, Model] = {
            spec.name: Model(
                spec, backend_factory(spec), self.loader, self.memory,
                memory_device(spec, gpus), clock, self.notify,
            )
            for spec in config.models
        }
        self._preloads: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()

    def notify(self) -> None:
        """Wake everyone waiting on `changes()`: a model changed state or the server drains."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        self.memory.notify_freed()

    def changes(self) -> asyncio.Event:
        """An event set at the next state change (take it before reading the state)."""
        return self._changed

    def get(self, name: str, version: str | None = None) -> Model:
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(f"unknown model {name!r}")
        if version not in (None, "", MODEL_VERSION):
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        return model

    def start_preloads(self) -> None:
        """Load the `preload = true` models, and read every model's predicted size, in the
        background."""
        for model in self.models.values():
            if model.spec.preload:
                self._preloads.append(asyncio.create_task(self._preload(model)))
        self._preloads.append(asyncio.create_task(self._predict_sizes()))

    async def _predict_sizes(self) -> None:
        for model in self.models.values():
            try:
                await model.predict_size()
            except Exception as exc:  # a missing file fails its load with its own message
                log_event("size_unknown", logging.DEBUG, model=model.name,
                          error=describe_exception(exc))

    async def _preload(self, model: Model) -> None:
        try:
            await model.load()
        except SnoozeError as exc:
            log_event("preload_failed", logging.WARNING, model=model.name, error=exc.message)
        except Exception as exc:  # boundary of a background task
            log_event("preload_failed", logging.ERROR, model=model.name,
                      error=describe_exception(exc))

    async def shutdown(self) -> None:
        """Unload every model (reason `shutdown`) and stop the loader threads."""
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
        self.loader.shutdown(wait=True)


class InferenceService:
    """Everything a transport may ask of the engine. No HTTP or gRPC here."""

    model_version = MODEL_VERSION

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self.draining = False
        self.started_at = time.time()

    def start_draining(self) -> None:
        """Not ready from now on (in-flight requests still finish)."""
        self.draining = True
        self.manager.notify()

    def changes(self) -> asyncio.Event:
        return self.manager.changes()

    # --- server -----------------------------------------------------------------------

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def server_ready(self) -> bool:
        return not self.draining

    # --- models -----------------------------------------------------------------------

    async def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        return await self.manager.get(name, version).metadata()

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """Ready unless FAILED: a cold model loads on its next request by design."""
        return self.manager.get(name, version).state is not State.FAILED

    async def infer(
        self, name: str, version: str | None, request: InferRequest
    ) -> InferResponse:
        model = self.manager.get(name, version)
        model.stats.requests += 1
        try:
            timeout = _timeout_seconds(request.parameters)
            replica = await model.acquire()
            try:
                metadata = replica.metadata
                check_request(request, metadata)
                inputs = {tensor.name: tensor.data for tensor in request.inputs}
                validate = getattr(replica.instance, "validate_inputs", None)
                if validate is not None:  # a backend's own checks, still before queueing
                    validate(inputs)
                wanted = [out.name for out in request.outputs] if request.outputs else None
                results = await model.run(replica, inputs, wanted, timeout)
            finally:
                model.release()
        except Exception:  # not CancelledError: a client that left is not a model error
            model.stats.errors += 1
            raise
        specs = {spec.name: spec for spec in metadata.outputs}
        outputs = [
            InferOutput(out_name, specs[out_name].datatype, tuple(array.shape), array)
            for out_name, array in results.items()
        ]
        return InferResponse(name, MODEL_VERSION, outputs, id=request.id)

    # --- repository -------------------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries = [
            IndexEntry(model.name, MODEL_VERSION, model.state.value, model.reason)
            for model in self.manager.models.values()
        ]
        return [e for e in entries if e.state == State.READY.value] if ready_only else entries

    async def load(self, name: str, version: str | None = None) -> None:
        await self.manager.get(name, version).load()

    async def unload(self, name: str, version: str | None = None) -> None:
        await self.manager.get(name, version).unload("admin")

    # --- status -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.time()
        models = []
        for model in self.manager.models.values():
            expires_in = model.expires_in()
            stats = model.stats
            models.append({
                "name": model.name,
                "format": model.spec.format,
                "device": model.device,
                "pinned": model.pinned,
                "state": model.state.value,
                "reason": model.reason,
                "replicas": 1 if model.state in (State.READY, State.UNLOADING) else 0,
                "in_flight": model.in_flight,
                "queued": model.queued,
                "last_used": _iso(model.last_used),
                "expires_at": _iso(now + expires_in) if expires_in is not None else None,
                "idle_timeout_s": model.spec.idle_timeout,
                "predicted_bytes": stats.predicted_bytes,
                "measured_bytes": stats.measured_bytes,
                "resident_bytes": model.resident_bytes() or 0,
                "last_load_ms": stats.last_load_ms,
                "loads": stats.loads,
                "load_failures": stats.load_failures,
                "requests": stats.requests,
                "errors": stats.errors,
                "batching": _batching_status(model),
            })
        return {
            "server": {
                "name": SERVER_NAME,
                "version": __version__,
                "started_at": _iso(self.started_at),
                "uptime_s": round(now - self.started_at, 3),
                "draining": self.draining,
            },
            "devices": self.manager.memory.status(),
            "evictions": dict(self.manager.memory.evictions),
            "models": models,
        }


def _timeout_seconds(parameters: dict[str, Any]) -> float | None:
    """The OIP `timeout` request parameter (microseconds) in seconds; 0 means none, as in
    Triton."""
    value = parameters.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput("parameter 'timeout' must be a non-negative integer of microseconds")
    return value / 1e6 if value else None


def _batching_status(model: Model) -> dict[str, Any]:
    policy = model.batch_policy
    conf = model.spec.batching
    return {
        "enabled": policy.enabled if policy else conf.max_batch_size > 1,
        "max_batch_size": conf.max_batch_size,
        "max_delay_s": conf.max_delay,
        "max_queue": conf.max_queue,
        "inline": model.runs_inline,
        **model.stats.batching.snapshot(),
    }


def _iso(stamp: float | None) -> str | None:
    if stamp is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp % 1 * 1000):03d}Z"
