"""InferenceService: everything a transport may ask of the engine, and nothing about HTTP or
gRPC. Both transports call it through the one request boundary (api/boundary.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snoozeml import SERVER_NAME, __version__
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.added.models import CONFIG, AddedModels
from snoozeml.engine.capabilities import Capabilities, CapabilityReader, EmbeddingSettings
from snoozeml.engine.events import Draining, EventBus, InferenceFailed, InferenceStarted
from snoozeml.engine.lifecycle import State
from snoozeml.engine.model import Model
from snoozeml.engine.observe.counters import Counters
from snoozeml.engine.observe.recent import RecentEvents
from snoozeml.engine.observe.snapshots import (
    BatchingSnapshot,
    KeepAliveSnapshot,
    ModelSnapshot,
    ReplicaSnapshot,
    ScalingSnapshot,
    ServerSnapshot,
    StatusSnapshot,
)
from snoozeml.engine.observe.triton_statistics import ModelStatistics, Statistics
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.replicas.replica import ReplicaState
from snoozeml.engine.requests.classification import classified
from snoozeml.engine.requests.preparation import Preparation
from snoozeml.engine.requests.request import InferOutput, InferRequest, InferResponse
from snoozeml.engine.requests.validate import check_request
from snoozeml.errors import InvalidInput, ShuttingDown

EXTENSIONS = ("binary_tensor_data", "classification", "model_repository", "statistics")


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


class InferenceService:
    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self.events: EventBus = manager.events
        self.counters = Counters(manager.models)
        self.counters.subscribe(self.events)
        self.inference_statistics = Statistics(manager.models, wall=manager.clock.wall)
        self.inference_statistics.subscribe(self.events)
        self.recent = RecentEvents(wall=manager.clock.wall)
        self.recent.subscribe(self.events)
        self.draining = False
        self.started_at = manager.clock.wall()
        self.added = AddedModels(manager)
        self._capabilities = CapabilityReader()
        self.preparation = Preparation()  # requests' blocking steps before queueing (images)

    def start_draining(self) -> None:
        """Not ready from now on (in-flight requests still finish)."""
        self.draining = True
        self.events.publish(Draining())

    def changed(self) -> asyncio.Event:
        """Set at the next change of what readiness or health report (take it before
        reading them)."""
        return self.events.changed()

    # --- server ----------------------------------------------------------------------------

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(SERVER_NAME, __version__, EXTENSIONS)

    def server_ready(self) -> bool:
        return not self.draining

    # --- models ----------------------------------------------------------------------------

    async def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        """The model's inputs, outputs and versions (the first request loads it)."""
        return await self.manager.get(name, version).metadata()

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """Ready unless FAILED: a cold model loads on its next request by design (one that
        does not load on demand, ModelMesh's, is not found unless loaded or loading)."""
        model = self.manager.get(name, version)
        model.check_present()
        return model.state is not State.FAILED

    async def infer(
        self, name: str, version: str | None, request: InferRequest
    ) -> InferResponse:
        model = self.manager.get(name, version)
        if self.draining:
            raise ShuttingDown(f"the server is shutting down: model {name!r} takes no new "
                               "request here", retry_after=1.0)
        self.events.publish(InferenceStarted(name))
        try:
            timeout = _timeout_seconds(request.parameters)
            async with model.lease() as replica:
                metadata = replica.metadata
                check_request(request, metadata)
                inputs = {tensor.name: tensor.data for tensor in request.inputs}
                parameters = {tensor.name: tensor.parameters for tensor in request.inputs
                              if tensor.parameters}
                # The backend's checks, before queueing; its blocking step (images, documents
                # cut to `max_tokens`) on the pool.
                prepare = replica.instance.validate_inputs(inputs, parameters)
                if prepare is not None:
                    await self.preparation.run(prepare)
                wanted = [out.name for out in request.outputs] if request.outputs else None
                results = await replica.batcher.submit(inputs, wanted, timeout)
        except Exception:  # not CancelledError: a client that left is not an error
            self.events.publish(InferenceFailed(name))
            raise
        specs = {spec.name: spec for spec in metadata.outputs}
        outputs = [
            InferOutput(out_name, specs[out_name].datatype, tuple(array.shape), array)
            for out_name, array in results.items()
        ]
        outputs = classified(request.outputs, outputs, metadata)  # per request, after the run
        return InferResponse(name, version or model.versions[-1], outputs, id=request.id)

    # --- what a model can do (the OpenAI-compatible routes) --------------------------------

    def model_names(self) -> list[str]:
        """Every model the server has now, configured or added at run time, loaded or not."""
        return list(self.manager.models)

    def capabilities(self, name: str) -> Capabilities:
        """What the model can do besides OIP inference; ModelNotFound for an unknown name."""
        return self._capabilities.capabilities(self.manager.get(name))

    def embedding_settings(self, name: str) -> EmbeddingSettings:
        """How the text embedding model shapes its answers; ModelNotFound for an unknown
        name, BackendError when its files name a layout SnoozeML does not run."""
        return self._capabilities.embedding_settings(self.manager.get(name))

    # --- repository ------------------------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries = [
            IndexEntry(model.name, model.versions[-1], model.state.value, model.reason)
            for model in self.manager.models.values()
        ]
        return [e for e in entries if e.state == State.READY.value] if ready_only else entries

    async def load(
        self, name: str, version: str | None = None, path: str | None = None,
        kind: str | None = None,
    ) -> None:
        """Load the model now. With a `path`, a model not in models.toml is added from it first
        (or the one added from that path before is loaded)."""
        if path is None:
            model = self.manager.get(name, version)  # unknown: 404, draining or not
            self._refuse_loads(name)
            await model.load()
            return
        self._refuse_loads(name)
        if version not in (None, "", "1"):
            raise InvalidInput(f"a model added by path has only version '1', not {version!r}")
        from snoozeml.hub.by_path import kind_of  # the Hub package only for a load by path

        await self.added.load(name, Path(path), "repository", kind_of(kind or ""))

    def _refuse_loads(self, name: str) -> None:
        if self.draining:
            raise ShuttingDown(f"the server is shutting down: model {name!r} is not loaded now",
                               retry_after=1.0)

    async def unload(self, name: str, version: str | None = None) -> None:
        """Unload the model; one added at run time is forgotten too."""
        self.manager.get(name, version)  # ModelNotFound for a name never heard of
        if self.added.origin(name) == CONFIG:
            await self.manager.get(name, version).unload("admin")
        else:
            await self.added.forget(name)

    # --- statistics (Triton's extension) ---------------------------------------------------

    def statistics(
        self, name: str | None = None, version: str | None = None
    ) -> tuple[ModelStatistics, ...]:
        """One model's statistics (ModelNotFound for a name or version it lacks), or every
        configured model's, loaded or not, when `name` is empty."""
        tally = self.inference_statistics
        if name:
            model = self.manager.get(name, version)
            return (tally.model(model.name, version or model.versions[-1]),)
        return tuple(tally.model(model.name, model.versions[-1])
                     for model in self.manager.models.values())

    # --- status ----------------------------------------------------------------------------

    def snapshot(self) -> StatusSnapshot:
        now = self.manager.clock.wall()
        server = ServerSnapshot(SERVER_NAME, __version__, self.started_at,
                                now - self.started_at, self.draining)
        models = tuple(self._model_snapshot(model, now)
                       for model in self.manager.models.values())
        return StatusSnapshot(server, self.manager.memory.snapshot(),
                              dict(self.counters.evictions), models,
                              dict(self.counters.auth_refusals), self.recent.events())

    def _model_snapshot(self, model: Model, now: float) -> ModelSnapshot:
        counters = self.counters.model(model.name)
        replicas = model.replicas
        policy = replicas.policy
        conf = model.spec.batching
        expires_in = model.expires_in()
        runs_inline = replicas.runs_inline
        return ModelSnapshot(
            name=model.name,
            origin=self.manager.origins.get(model.name, CONFIG),
            format=model.spec.format,
            device=model.device,
            pinned=model.pinned,
            state=model.state.value,
            reason=model.reason,
            replicas=self._replica_snapshots(model),
            scaling=self._scaling_snapshot(model),
            in_flight=model.in_flight,
            queued=replicas.queued,
            last_used=model.last_used,
            expires_at=now + expires_in if expires_in is not None else None,
            idle_timeout_s=model.spec.idle_timeout,
            predicted_bytes=replicas.predicted_bytes,
            measured_bytes=replicas.measured_bytes,
            resident_bytes=model.resident_bytes() or 0,
            last_load_ms=counters.last_load_ms,
            loads=counters.loads,
            load_failures=counters.load_failures,
            requests=counters.requests,
            errors=counters.errors,
            batching=BatchingSnapshot(
                enabled=policy.enabled if policy else conf.max_batch_size > 1,
                max_batch_size=conf.max_batch_size,
                max_delay_s=conf.max_delay,
                max_queue=conf.max_queue,
                inline=runs_inline,
                batches=counters.batches,
                requests=counters.batched_requests,
                rows=counters.rows,
                largest_batch=counters.largest_batch,
                queue_wait_s=counters.queue_wait_s,
                run_s=counters.run_s,
                queue_timeouts=counters.queue_timeouts,
                queue_full=counters.queue_full,
                dropped=counters.dropped,
            ),
            keep_alive=self._keep_alive_snapshot(model, now),
        )

    def _keep_alive_snapshot(self, model: Model, now: float) -> KeepAliveSnapshot:
        keep = model.keep
        mono = self.manager.clock.now()
        chosen = keep.plan if keep.adaptive else None
        next_use = keep.next_use_s(mono)
        return KeepAliveSnapshot(
            mode="adaptive" if keep.adaptive else "fixed",
            reason=chosen.reason if chosen else None,
            unload_after_s=chosen.unload_after_s if chosen else None,
            prewarm_after_s=chosen.prewarm_after_s if chosen else None,
            keep_until_s=chosen.keep_until_s if chosen else None,
            prewarm_at=now + keep.prewarm_at - mono if keep.prewarm_at is not None else None,
            next_arrival_at=now + next_use if next_use is not None else None,
            history=keep.history.count,
            loaded_by=keep.loaded_by or None,
            prewarms_used=keep.prewarms["used"],
            prewarms_wasted=keep.prewarms["wasted"],
            prewarms_skipped=keep.prewarms["skipped"],
            idle_memory_byte_seconds=keep.idle_memory(mono),
        )


    def _replica_snapshots(self, model: Model) -> tuple[ReplicaSnapshot, ...]:
        counters = self.counters.model(model.name)
        running = tuple(
            ReplicaSnapshot(r.index, r.device, r.state.value, r.in_flight, r.batcher.queued,
                            r.batcher.runs_inline, counters.replica_batches.get(r.index, 0),
                            counters.replica_requests.get(r.index, 0), r.measured_bytes,
                            r.loaded_at)
            for r in model.replicas.replicas
        )
        loading = tuple(
            ReplicaSnapshot(index, device, ReplicaState.LOADING.value, 0, 0, False, 0, 0, None,
                            None)
            for index, device in model.replicas.loading.items()
        )
        return running + loading

    def _scaling_snapshot(self, model: Model) -> ScalingSnapshot:
        conf = model.spec.replicas
        counters = self.counters.model(model.name)
        return ScalingSnapshot(
            min=min(conf.min, model.replicas.max_replicas),
            max=model.replicas.max_replicas,
            strategy=conf.strategy,
            target_queue=float(conf.target_queue),
            scale_up_after_s=conf.scale_up_after,
            scale_down_after_s=conf.scale_down_after,
            devices=tuple(dict.fromkeys(p.memory for p in model.replicas.placements)),
            intra_op_threads=model.replicas.threads,
            desired=self.manager.autoscaler.desired(model.name),
            blocked=model.steps.blocked,
            last_error=model.steps.error,
            added=counters.replicas_added,
            removed=counters.replicas_removed,
            failures=counters.replica_failures,
        )


def _timeout_seconds(parameters: dict[str, Any]) -> float | None:
    """The OIP `timeout` request parameter (microseconds) in seconds; 0 means none, as in
    Triton."""
    value = parameters.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput("parameter 'timeout' must be a non-negative integer of microseconds")
    return value / 1e6 if value else None
