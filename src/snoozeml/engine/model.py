"""One configured model: its lifecycle, leases, idle timer, memory admission and replica.

Invariants:
- `_state` changes only through `_move`, i.e. through the pure table in lifecycle.py.
- At most one load task and one unload task exist at a time (single-flight).
- A model has a replica exactly when it is READY or UNLOADING.
- A model with `_in_flight > 0` is never unloaded; the unload waits for the last lease.
- The idle timer measures from the release of the last lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from snoozeml.config import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.batching import BatchPolicy, BatchStats, batching_blocker
from snoozeml.engine.lifecycle import Event, State, load_backoff, transition
from snoozeml.engine.memory import FileSizes, MemoryManager, Resident, file_sizes_blocking
from snoozeml.engine.replica import (
    Replica,
    close_replica_blocking,
    describe_exception,
    load_instance_blocking,
    start_replica,
    stop_replica,
)
from snoozeml.errors import (
    BackendError,
    InvalidInput,
    LoadTimeout,
    MemoryExhausted,
    ModelLoadFailed,
    SnoozeError,
)
from snoozeml.logs import log_event
from snoozeml.runtime.base import Backend, Instance, is_out_of_memory, prepare_blocking

Clock = Callable[[], float]

__all__ = ["Model", "ModelStats", "Replica", "describe_exception"]


@dataclass(slots=True)
class ModelStats:
    requests: int = 0
    errors: int = 0
    loads: int = 0
    load_failures: int = 0
    last_load_ms: float | None = None
    predicted_bytes: int | None = None
    measured_bytes: int | None = None
    freed_bytes: int | None = None
    batching: BatchStats = field(default_factory=BatchStats)


def _is_invalid_argument(exc: BaseException) -> bool:
    # onnxruntime raises pybind classes named InvalidArgument for inputs it rejects.
    return type(exc).__name__ in ("InvalidArgument", "InvalidArgumentError")


class Model:
    def __init__(
        self,
        spec: ModelConfig,
        backend: Backend,
        loader: Executor,
        memory: MemoryManager,
        device: str = "cpu",
        clock: Clock = time.monotonic,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.device = device
        self.stats = ModelStats()
        self._backend = backend
        self._loader = loader
        self._memory = memory
        self._clock = clock
        self._on_change = on_change
        self._state = State.UNLOADED
        self._reason = ""
        self._error: str | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._sizes: FileSizes | None = None
        self._replica: Replica | None = None
        self._policy: BatchPolicy | None = None
        self._metadata: ModelMetadata | None = None
        self._load_task: asyncio.Task[SnoozeError | None] | None = None
        self._unload_task: asyncio.Task[None] | None = None
        self._in_flight = 0
        # Requests waiting on a load: the model they load is not idle before they take their
        # lease, or a load waiting for memory could evict it first (and be evicted in turn).
        self._awaiting_load = 0
        self._drained: asyncio.Event | None = None
        self._last_release = clock()
        self._loaded_at = clock()
        self._last_used_wall: float | None = None
        self._idle_handle: asyncio.TimerHandle | None = None

    # --- state ------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def reason(self) -> str:
        """Why the model is in its state: the unload reason, or the load error."""
        if self._state is State.FAILED:
            return self._error or ""
        return self._reason

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def last_used(self) -> float | None:
        return self._last_used_wall

    @property
    def queued(self) -> int:
        return self._replica.batcher.queued if self._replica else 0

    @property
    def runs_inline(self) -> bool:
        return self._replica.batcher.runs_inline if self._replica else False

    @property
    def batch_policy(self) -> BatchPolicy | None:
        """The policy in force (None until the first load decides whether batching applies)."""
        return self._replica.batcher.policy if self._replica else self._policy

    @property
    def pinned(self) -> bool:
        return self.spec.idle_timeout is None

    def expires_in(self) -> float | None:
        """Seconds until the idle timer unloads the model, or None if it will not."""
        timeout = self.spec.idle_timeout
        if timeout is None or self._state is not State.READY or self._in_flight:
            return None
        return max(self._last_release + timeout - self._clock(), 0.0)

    def _move(self, event: Event) -> None:
        self._state = transition(self._state, event)
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    # --- memory (the MemoryManager's view) --------------------------------------------

    def resident_bytes(self) -> int | None:
        """Bytes the model holds now: measured after its last load, else predicted."""
        if self._state not in (State.READY, State.UNLOADING):
            return None
        return self.stats.measured_bytes or self.stats.predicted_bytes or 0

    def resident(self, now: float) -> Resident | None:
        size = self.resident_bytes()
        if size is None:
            return None
        if self._state is State.UNLOADING:
            holds = "unloading"
        elif self._in_flight or self.queued or self._awaiting_load:
            holds = "busy"
        elif self.pinned:
            holds = "pinned"
        else:
            holds = ""
        return Resident(self.name, size, self._last_release, self._loaded_at, holds)

    # --- leases -----------------------------------------------------------------------

    async def acquire(self) -> Replica:
        """Take a lease on a loaded replica, loading the model first if needed."""
        replica = self._replica
        if self._state is State.READY and replica is not None:
            self._in_flight += 1
            return replica
        return await self._acquire_slow()

    async def _acquire_slow(self) -> Replica:
        timeout = self.spec.load_timeout if self.spec.load_timeout is not None else 300.0
        deadline = self._clock() + timeout
        while True:
            state = self._state
            if state is State.READY and self._replica is not None:
                self._in_flight += 1
                return self._replica
            if state is State.UNLOADING and self._unload_task is not None:
                await asyncio.shield(self._unload_task)
                continue
            if state is State.FAILED:
                wait = self._retry_at - self._clock()
                if wait > 0:
                    error = self._error or ""
                    prefix = "" if error.startswith(f"model {self.name!r}") else \
                        f"model {self.name!r} failed to load: "
                    raise ModelLoadFailed(prefix + error, retry_after=wait)
                self._start_load()
            elif state is State.UNLOADED:
                self._start_load()
            assert self._load_task is not None
            remaining = deadline - self._clock()
            try:
                if remaining <= 0:
                    raise TimeoutError
                self._awaiting_load += 1
                try:
                    aborted = await asyncio.wait_for(asyncio.shield(self._load_task), remaining)
                finally:
                    self._awaiting_load -= 1  # the loop takes the lease without awaiting
            except TimeoutError:
                raise LoadTimeout(
                    f"model {self.name!r} is still loading after {timeout:g}s", retry_after=5.0
                ) from None
            if aborted is not None:
                raise aborted

    def release(self) -> None:
        """End a lease. The last one to end starts the idle timer."""
        self._in_flight -= 1
        self._last_used_wall = time.time()
        if self._in_flight == 0:
            self._last_release = self._clock()
            if self._drained is not None:
                self._drained.set()
            self._arm_idle_timer()
            self._memory.notify_freed()

    # --- idle timer -------------------------------------------------------------------

    def _arm_idle_timer(self, delay: float | None = None) -> None:
        timeout = self.spec.idle_timeout
        if timeout is None or self._idle_handle is not None:
            return
        loop = asyncio.get_running_loop()
        self._idle_handle = loop.call_later(
            timeout if delay is None else delay, self._on_idle_timer
        )

    def _on_idle_timer(self) -> None:
        # One timer at a time; a release while it is armed only moves _last_release, and the
        # timer re-arms itself for the remainder instead of being cancelled on every request.
        self._idle_handle = None
        remaining = self.expires_in()
        if remaining is None:
            return  # busy (release re-arms) or not READY
        if remaining > 1e-3:
            self._arm_idle_timer(remaining)
            return
        self._spawn_unload("idle")

    def _spawn_unload(self, reason: str) -> None:
        if self._state is State.READY and self._unload_task is None:
            self._unload_task = asyncio.get_running_loop().create_task(self._unload(reason))

    # --- running ----------------------------------------------------------------------

    async def run(
        self,
        replica: Replica,
        inputs: dict[str, np.ndarray],
        outputs: Sequence[str] | None,
        queue_timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one validated request through the replica's batch queue. Caller holds a lease."""
        try:
            return await replica.batcher.submit(inputs, outputs, queue_timeout)
        except SnoozeError:
            raise
        except Exception as exc:
            if _is_invalid_argument(exc):
                raise InvalidInput(f"model {self.name!r} rejected the input: {exc}") from exc
            # The transport's boundary logs the failed request.
            raise BackendError(
                f"model {self.name!r} failed to run: {describe_exception(exc)}"
            ) from exc

    async def predict_size(self) -> None:
        """Read the model's file sizes (off the loop) so its predicted size shows before the
        first load; a no-op once known."""
        if self._sizes is None:
            sizes = await asyncio.get_running_loop().run_in_executor(
                self._loader, file_sizes_blocking, self.spec
            )
            if self._sizes is None:
                self._sizes = sizes
                self.stats.predicted_bytes = self._memory.predicted(self.spec, sizes)

    async def _relieve_oom(self) -> None:
        await self._memory.relieve_oom(self)

    # --- loading ----------------------------------------------------------------------

    def _start_load(self) -> None:
        self._reason = ""
        self._move(Event.LOAD)
        self._load_task = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> SnoozeError | None:
        """The load task. Returns the error for a load aborted for lack of memory (the model
        goes back to UNLOADED); any other failure leaves the model FAILED."""
        loop = asyncio.get_running_loop()
        try:
            await self.predict_size()
            assert self._sizes is not None
            await loop.run_in_executor(self._loader, prepare_blocking, self._backend, self.spec)
            resident = self.stats.measured_bytes or self.stats.predicted_bytes or 0
            async with self._memory.admission(self, resident, self._sizes.transient):
                # Timed and logged from here: waiting for the device is not loading.
                started = self._clock()
                log_event("model_loading", model=self.name, path=self.spec.path,
                          device=self.device)
                instance, measured = await self._load_instance()
        except MemoryExhausted as exc:
            self._reason = "memory"
            self._move(Event.LOAD_ABORTED)
            log_event("model_load_deferred", logging.WARNING, model=self.name,
                      error=exc.message)
            return exc
        except Exception as exc:
            self._fail_load(exc)
            return None
        self._loaded(instance, measured, (self._clock() - started) * 1000.0)
        return None

    async def _load_instance(self) -> tuple[Instance, int]:
        """The instance and the memory it added on its device (the memory manager's lock on
        the device keeps other loads and measured unloads out of the way meanwhile)."""
        loop = asyncio.get_running_loop()
        probe = self._memory.probe
        before = probe.used(self.device)
        try:
            instance = await loop.run_in_executor(
                self._loader, load_instance_blocking, self._backend, self.spec
            )
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            log_event("model_load_oom", logging.WARNING, model=self.name,
                      error=describe_exception(exc))
            await self._memory.relieve_oom(self)
            before = probe.used(self.device)  # after the evictions, not before them
            instance = await loop.run_in_executor(
                self._loader, load_instance_blocking, self._backend, self.spec
            )
        return instance, max(probe.used(self.device) - before, 0)

    def _fail_load(self, exc: Exception) -> None:
        self._failures += 1
        self.stats.load_failures += 1
        backoff = load_backoff(self._failures)
        self._retry_at = self._clock() + backoff
        self._error = exc.message if isinstance(exc, SnoozeError) else describe_exception(exc)
        self._move(Event.LOAD_FAILED)
        log_event("model_load_failed", logging.WARNING, model=self.name, error=self._error,
                  retry_in_s=backoff)

    def _loaded(self, instance: Instance, measured: int, ms: float) -> None:
        self._metadata = instance.metadata
        policy = self._policy = self._policy_for(instance.metadata)
        self._replica = start_replica(
            self.name, instance, policy, self.stats.batching, self._relieve_oom
        )
        self._failures = 0
        self._error = None
        self._reason = ""
        self.stats.loads += 1
        self.stats.last_load_ms = ms
        self.stats.measured_bytes = measured
        self._loaded_at = self._last_release = self._clock()
        self._move(Event.LOADED)
        self._arm_idle_timer()
        log_event("model_loaded", model=self.name, ms=round(ms, 1), bytes=measured,
                  device=self.device)

    def _policy_for(self, metadata: ModelMetadata) -> BatchPolicy:
        conf = self.spec.batching
        policy = BatchPolicy(conf.max_batch_size, conf.max_delay, conf.max_queue)
        if policy.enabled and (blocker := batching_blocker(metadata)) is not None:
            if self._policy is None or self._policy.enabled:
                log_event("batching_disabled", logging.WARNING, model=self.name, reason=blocker)
            policy = BatchPolicy(0, conf.max_delay, conf.max_queue)
        return policy

    async def load(self) -> None:
        """Load now (an explicit request): a FAILED model is retried without its backoff."""
        if self._state is State.FAILED:
            self._retry_at = 0.0
        await self.acquire()
        self.release()

    async def metadata(self) -> ModelMetadata:
        """The model's metadata; loads the model once if it has never been loaded (a FAILED
        model keeps its backoff: only an explicit load skips it)."""
        if self._metadata is None:
            await self.acquire()
            self.release()
        assert self._metadata is not None
        return self._metadata

    # --- unloading --------------------------------------------------------------------

    async def unload(self, reason: str) -> None:
        """Unload (waiting for in-flight requests to finish); a no-op when not loaded."""
        while True:
            state = self._state
            if state is State.LOADING and self._load_task is not None:
                await asyncio.shield(self._load_task)
                continue
            if state is State.FAILED:
                # An explicit unload clears the failure: the next load starts a fresh backoff.
                self._failures = 0
                self._retry_at = 0.0
                self._move(Event.UNLOAD)
                self._reason = reason
                return
            if state is State.READY:
                self._spawn_unload(reason)
            if self._unload_task is not None:
                await asyncio.shield(self._unload_task)
            return

    async def _unload(self, reason: str) -> None:
        try:
            self._move(Event.UNLOAD)
            if self._in_flight:
                self._drained = asyncio.Event()
                await self._drained.wait()
                self._drained = None
            replica, self._replica = self._replica, None
            probe = self._memory.probe
            # One measured unload per device at a time, so each frees only its own bytes.
            async with self._memory.measuring(self.device):
                before = probe.used(self.device)
                if replica is not None:
                    try:
                        await stop_replica(replica)
                        await asyncio.get_running_loop().run_in_executor(
                            self._loader, close_replica_blocking, replica
                        )
                    except Exception as exc:  # the replica is dropped either way
                        log_event("unload_failed", logging.ERROR, model=self.name,
                                  error=describe_exception(exc))
                del replica
                freed = max(before - probe.used(self.device), 0)
            self.stats.freed_bytes = freed
            self._reason = reason
            self._move(Event.UNLOADED)
            self._memory.notify_freed()
            log_event("model_unloaded", model=self.name, reason=reason, freed_bytes=freed)
        finally:
            self._unload_task = None
