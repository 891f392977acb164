"""One configured model: its lifecycle, its leases and its idle timer.

The model decides *when* replicas come and go; its `ReplicaSet` (engine/replicas/pool.py) knows
*how* (memory admission, loading, measuring, unloading), and its `ReplicaSteps`
(engine/replicas/steps.py) add and remove them one at a time. A request takes a lease on one
replica:

    async with model.lease() as replica:
        ...  # the model stays loaded, and the replica running, until the block ends

Invariants:
- `_state` changes only through `_move`, i.e. through the pure table in lifecycle.py, and every
  change is published (`StateChanged`).
- At most one load task and one unload task exist at a time (single-flight).
- The model has replicas exactly when it is READY or UNLOADING.
- A model with leases (counted in engine/leases.py) is never unloaded; the unload waits for the
  last one. The idle timer measures from the end of the last lease.
- A model that does not load on demand (`on_demand` False: ModelMesh's, which it places) loads
  only by `load()`; a request that finds it unloaded or failed gets ModelNotFound.
- Replicas are added and removed one at a time (`steps`), and only while READY; an unload
  waits for the one in progress. While one is added the model is never evicted (the add may be
  waiting for the memory an eviction would be freeing).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from types import TracebackType

from snoozeml.config.settings import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.clock import Clock
from snoozeml.engine.events import (
    EventBus,
    LoadDeferred,
    LoadFailed,
    StateChanged,
    Unloaded,
)
from snoozeml.engine.idle import IdleTimer
from snoozeml.engine.keepalive.histogram import IdleHistogram
from snoozeml.engine.keepalive.keeper import KeepAlive, PrewarmBudget
from snoozeml.engine.leases import Leases
from snoozeml.engine.lifecycle import Event, LoadFailures, State, transition
from snoozeml.engine.memory.victims import Prewarming, Resident
from snoozeml.engine.replicas.pool import ReplicaSet
from snoozeml.engine.replicas.replica import Replica
from snoozeml.engine.replicas.steps import ReplicaSteps
from snoozeml.errors import (
    LoadTimeout,
    MemoryExhausted,
    ModelNotFound,
    SnoozeError,
    describe_exception,
)
from snoozeml.logs import log_event

DEFAULT_LOAD_TIMEOUT = 300.0


class Lease:
    """`async with model.lease() as replica`: holds one replica of a loaded model. Taking it
    may load the model first; leaving the block, normally, by an error or by cancellation,
    ends it. A lease that was never taken (its load failed or was cancelled) holds nothing."""

    __slots__ = ("_cause", "_model", "replica")

    def __init__(self, model: Model, cause: str = "") -> None:
        self._model = model
        # "": a request. Else an explicit load's cause (keepalive/events.py), which loads
        # even a model that is not on_demand, and is no arrival of the keep-alive's.
        self._cause = cause
        self.replica: Replica | None = None

    async def __aenter__(self) -> Replica:
        model = self._model
        if not self._cause:
            model.keep.arrived()
        if model._state is State.READY:  # the hot path: no coroutine more
            self.replica = model._leases.take()
        else:
            self.replica = await model._acquire_slow(self._cause)
        return self.replica

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        replica, self.replica = self.replica, None
        if replica is not None:
            self._model._leases.release(replica)


class Model:
    versions: tuple[str, ...] = ("1",)

    def __init__(
        self, spec: ModelConfig, replicas: ReplicaSet, events: EventBus, clock: Clock,
        on_demand: bool = True, prewarms: PrewarmBudget | None = None,
        history: IdleHistogram | None = None,
    ) -> None:
        self.spec = spec
        # False: loaded only when its owner asks (`load()`), never by a request (ModelMesh's
        # models: it places them, and routes a request only where it loaded the model).
        self.on_demand = on_demand
        self.name = spec.name
        self.replicas = replicas
        self._events = events
        self._clock = clock
        self._state = State.UNLOADED
        self._reason = ""
        self._failures = LoadFailures()  # while FAILED: the error and the backoff
        self._metadata: ModelMetadata | None = None
        self._load_task: asyncio.Task[SnoozeError | None] | None = None
        self._unload_task: asyncio.Task[None] | None = None
        self._loaded_at = clock.now()
        self._idle = IdleTimer(clock, spec.idle_timeout if spec.replicas.min == 0 else None,
                               self._on_idle)
        self._load_cause = "request"  # the running (or last) load's
        self.keep = KeepAlive(spec, clock, events, self._idle, prewarms or PrewarmBudget(clock),
                              self, history)
        self._leases = Leases(self.name, replicas, events, clock, self.keep)
        self.steps = ReplicaSteps(self.name, replicas, events,
                                  lambda: self._state is State.READY)
        # Removed from the manager (a model added at run time, unloaded for good): no load
        # starts any more, whoever still holds the object.
        self.retired = False

    # --- state -----------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def reason(self) -> str:
        """Why the model is in its state: the unload reason, or the load error."""
        if self._state is State.FAILED:
            return self._failures.error
        return self._reason

    @property
    def device(self) -> str:
        return self.replicas.device

    @property
    def in_flight(self) -> int:
        return self._leases.held

    @property
    def last_used(self) -> float | None:
        """Epoch seconds at which the last lease ended."""
        return self._leases.last_used

    @property
    def pinned(self) -> bool:
        """Never unloaded for being idle, nor evicted: `idle_timeout = "never"`, or
        `replicas.min` at least 1."""
        return self.spec.idle_timeout is None or self.spec.replicas.min > 0

    @property
    def scaling(self) -> bool:
        """A replica is being added or removed."""
        return self.steps.busy

    def check_present(self) -> None:
        """ModelNotFound when the model is not here as far as requests go: it does not load
        on demand, and is neither loaded nor being loaded."""
        if not self.on_demand and self._state in (State.UNLOADED, State.FAILED):
            raise ModelNotFound(f"model {self.name!r} is not loaded here, and a request does "
                                "not load it (its owner places it: ModelMesh's loadModel)")

    def expires_in(self) -> float | None:
        """Seconds until the idle timer unloads the model, or None if it will not."""
        if self._state is not State.READY or self._leases.held:
            return None
        return self._idle.remaining()

    def _move(self, event: Event) -> None:
        self._state = transition(self._state, event)
        self._events.publish(StateChanged(self.name, self._state, self.reason))

    # --- memory (the MemoryManager's view) -------------------------------------------------

    def resident_bytes(self) -> int | None:
        """Bytes the model holds now on all its devices: each replica's measured size (the
        predicted one until measured); None when not loaded."""
        if self._state not in (State.READY, State.UNLOADING):
            return None
        return self.replicas.resident_bytes()

    def resident_on(self, device: str) -> int:
        return self.replicas.resident_bytes(device)

    def resident(self, now: float, device: str) -> Resident | None:
        size = self.replicas.resident_bytes(device)
        if not size or self._state not in (State.READY, State.UNLOADING):
            return None
        if self._state is State.UNLOADING:
            holds = "unloading"
        elif self._leases.held or self.replicas.queued or self._leases.awaiting_load:
            holds = "busy"
        elif self.steps.busy:
            holds = "scaling"
        elif self.pinned:
            holds = "pinned"
        else:
            holds = ""
        keep = self.keep
        return Resident(self.name, size, self._idle.last_touch, self._loaded_at, holds,
                        keep.load_s, keep.uses, keep.next_use_s(now))

    # --- leases ----------------------------------------------------------------------------

    def lease(self) -> Lease:
        return Lease(self)

    async def _acquire_slow(self, cause: str = "") -> Replica:
        load = bool(cause)
        timeout = self.spec.load_timeout
        if timeout is None:
            timeout = DEFAULT_LOAD_TIMEOUT
        deadline = self._clock.now() + timeout
        while True:
            state = self._state
            if state is State.READY:
                return self._leases.take()
            if state is State.UNLOADING and self._unload_task is not None:
                await asyncio.shield(self._unload_task)
                continue
            if self.retired and state in (State.FAILED, State.UNLOADED):
                raise ModelNotFound(f"model {self.name!r} was unloaded and removed")
            if not load:
                self.check_present()
            if state is State.FAILED:
                refusal = self._failures.refusal(self.name, self._clock.now())
                if refusal is not None:
                    raise refusal
                self._start_load(cause or "request")
            elif state is State.UNLOADED:
                self._start_load(cause or "request")
            assert self._load_task is not None
            remaining = deadline - self._clock.now()
            try:
                if remaining <= 0:
                    raise TimeoutError
                self._leases.awaiting_load += 1
                try:
                    aborted = await asyncio.wait_for(asyncio.shield(self._load_task), remaining)
                finally:
                    self._leases.awaiting_load -= 1  # the loop takes the lease without awaiting
            except TimeoutError:
                raise LoadTimeout(
                    f"model {self.name!r} is still loading after {timeout:g}s (its load_timeout)",
                    retry_after=5.0
                ) from None
            if aborted is not None and self._load_cause == "prewarm" and self._load_cause != cause:
                continue  # a pre-warm gives way at once; this load may wait for memory
            if aborted is not None and (load or self.on_demand):
                raise aborted  # else the loop finds the model not present: not found

    # --- idle timer ------------------------------------------------------------------------

    def _on_idle(self) -> None:
        # Requests still waking from the load they waited on are about to take their leases:
        # unloading under them (with idle_timeout = 0) would load and unload for ever.
        if self._leases.held == 0 and self._leases.awaiting_load == 0:
            self._spawn_unload("idle")

    def _spawn_unload(self, reason: str) -> None:
        if self._state is State.READY and self._unload_task is None:
            self._unload_task = asyncio.get_running_loop().create_task(self._unload(reason))

    # --- loading ---------------------------------------------------------------------------

    async def predict_size(self) -> None:
        await self.replicas.predict_size()

    def _start_load(self, cause: str, prewarm: Prewarming | None = None) -> None:
        self._reason = ""
        self._load_cause = cause
        self._move(Event.LOAD)
        self._load_task = asyncio.get_running_loop().create_task(self._load(prewarm))

    def start_prewarm(self, spare_within: float | None) -> None:
        """The keep-alive's pre-warm: a load that takes only room it can have at once, never
        from a busy model nor from one expected back within `spare_within` seconds (its
        window), nor, with cost-aware eviction, from one worth keeping as much as it is."""
        self._start_load("prewarm", Prewarming(spare_within, self.keep.load_s))

    async def _load(self, prewarm: Prewarming | None = None) -> SnoozeError | None:
        """The load task. Returns the error for a load aborted for lack of memory (the model
        goes back to UNLOADED); any other failure leaves the model FAILED."""
        started = self._clock.now()
        try:
            replica = await (self.replicas.add(wait=False, prewarm=prewarm)
                             if prewarm is not None else self.replicas.add())
        except MemoryExhausted as exc:
            self._reason = "memory"
            self._move(Event.LOAD_ABORTED)
            self.keep.load_failed("memory")
            if prewarm is None:  # a pre-warm's is a Prewarm skipped
                self._events.publish(LoadDeferred(self.name, exc.message))
            return exc
        except Exception as exc:
            self._fail_load(exc, self._clock.now() - started)
            self.keep.load_failed("load_failed")
            return None
        except asyncio.CancelledError:  # abandon_load, at shutdown
            self._fail_load(LoadTimeout("the load was abandoned: the daemon is stopping"),
                            self._clock.now() - started)
            raise
        self._metadata = replace(replica.metadata, versions=self.versions)
        self._failures.clear()
        self._reason = ""
        self._loaded_at = self._clock.now()
        self._move(Event.LOADED)
        self.keep.loaded(self._load_cause, self._loaded_at - started)  # touches the idle timer
        return None

    def _fail_load(self, exc: Exception, seconds: float) -> None:
        backoff = self._failures.record(exc, self._clock.now())
        self._move(Event.LOAD_FAILED)
        self._events.publish(LoadFailed(self.name, self._failures.error, backoff, seconds))

    async def abandon_load(self) -> None:
        """At shutdown: a load still running is abandoned (its thread is left to finish and
        close what it built, engine/deadline.py) rather than waited for up to load_timeout."""
        task = self._load_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})

    async def load(self, cause: str = "explicit") -> None:
        """Load now (an explicit request; `cause` as keepalive/events.py says): a FAILED model
        is retried without its backoff. Brings up `replicas.min` replicas (at least one); a
        replica beyond the first that cannot be added leaves the model serving on the ones
        it has."""
        if self._state is State.FAILED:
            self._failures.skip_backoff()
        async with Lease(self, cause if self.on_demand else "modelmesh"):
            pass
        await self.steps.fill(self.spec.replicas.min)

    async def metadata(self) -> ModelMetadata:
        """The model's metadata; loads the model once if it has never been loaded (a FAILED
        model keeps its backoff: only an explicit load skips it). ModelNotFound when the model
        is not present (`check_present`)."""
        self.check_present()
        if self._metadata is None:
            async with self.lease():
                pass
        assert self._metadata is not None
        return self._metadata

    # --- unloading -------------------------------------------------------------------------

    async def unload(self, reason: str) -> None:
        """Unload (waiting for in-flight requests to finish); a no-op when not loaded."""
        while True:
            state = self._state
            if state is State.LOADING and self._load_task is not None:
                await asyncio.shield(self._load_task)
                continue
            if state is State.FAILED:
                # An explicit unload clears the failure: the next load starts a fresh backoff.
                self._failures.clear()
                self._reason = reason
                self._move(Event.UNLOAD)
                return
            if state is State.READY:
                self._spawn_unload(reason)
            if self._unload_task is not None:
                await asyncio.shield(self._unload_task)
            return

    async def _unload(self, reason: str) -> None:
        try:
            self._move(Event.UNLOAD)
            self._idle.cancel()
            self.keep.unloading(reason)
            await self._leases.drained()
            try:
                async with self.steps.lock:  # a replica being added or drained finishes first
                    freed = await self.replicas.remove_all()
            except Exception as exc:  # the replicas are gone either way; so is the model
                log_event("unload_failed", logging.ERROR, model=self.name,
                          error=describe_exception(exc))
                freed = 0
            self._reason = reason
            self.steps.blocked = None
            self._move(Event.UNLOADED)
            self._events.publish(Unloaded(self.name, reason, freed))
        finally:
            self._unload_task = None
