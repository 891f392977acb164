"""One configured model: its lifecycle, leases, idle timer and the worker that runs it.

Invariants:
- `_state` changes only through `_move`, i.e. through the pure table in lifecycle.py.
- At most one load task and one unload task exist at a time (single-flight).
- A model with `_in_flight > 0` is never unloaded; the unload waits for the last lease.
- The idle timer measures from the release of the last lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from snoozeml.config import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.batching import Batcher, BatchPolicy, BatchStats, batching_blocker
from snoozeml.engine.lifecycle import Event, State, load_backoff, transition
from snoozeml.engine.memory import process_rss, release_memory_blocking
from snoozeml.errors import (
    BackendError,
    InvalidInput,
    LoadTimeout,
    ModelLoadFailed,
    SnoozeError,
)
from snoozeml.logs import log_event
from snoozeml.runtime.base import Backend, Instance

Clock = Callable[[], float]


@dataclass(slots=True)
class ModelStats:
    requests: int = 0
    errors: int = 0
    loads: int = 0
    load_failures: int = 0
    last_load_ms: float | None = None
    measured_bytes: int | None = None
    freed_bytes: int | None = None
    batching: BatchStats = field(default_factory=BatchStats)


@dataclass(eq=False, slots=True)
class Replica:
    """A loaded instance with its worker thread and batch queue; what a lease hands out."""

    instance: Instance
    worker: ThreadPoolExecutor
    batcher: Batcher

    @property
    def metadata(self) -> ModelMetadata:
        return self.instance.metadata


def describe_exception(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_invalid_argument(exc: BaseException) -> bool:
    # onnxruntime raises pybind classes named InvalidArgument for inputs it rejects.
    return type(exc).__name__ in ("InvalidArgument", "InvalidArgumentError")


class Model:
    def __init__(
        self,
        spec: ModelConfig,
        backend: Backend,
        loader: Executor,
        clock: Clock = time.monotonic,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self._on_change = on_change
        self.name = spec.name
        self.stats = ModelStats()
        self._backend = backend
        self._loader = loader
        self._clock = clock
        self._state = State.UNLOADED
        self._reason = ""
        self._error: str | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._replica: Replica | None = None
        self._policy: BatchPolicy | None = None
        self._metadata: ModelMetadata | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._unload_task: asyncio.Task[None] | None = None
        self._in_flight = 0
        self._drained: asyncio.Event | None = None
        self._last_release = clock()
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
    def cached_metadata(self) -> ModelMetadata | None:
        return self._metadata

    @property
    def queued(self) -> int:
        return self._replica.batcher.queued if self._replica else 0

    @property
    def batch_policy(self) -> BatchPolicy | None:
        """The policy in force (None until the first load decides whether batching applies)."""
        return self._replica.batcher.policy if self._replica else self._policy

    def expires_in(self) -> float | None:
        """Seconds until the idle timer unloads the model, or None if it will not."""
        timeout = self.spec.idle_timeout
        if timeout is None or self._state is not State.READY or self._in_flight:
            return None
        return max(self._last_release + timeout - self._clock(), 0.0)

    def _move(self, event: Event) -> None:
        self._state = transition(self._state, event)
        if self._on_change is not None:
            self._on_change()

    # --- leases -----------------------------------------------------------------------

    async def acquire(self) -> Replica:
        """Take a lease on a loaded replica, loading the model first if needed."""
        replica = self._replica
        if self._state is State.READY and replica is not None:
            self._in_flight += 1
            return replica
        return await self._acquire_slow()

    async def _acquire_slow(self) -> Replica:
        timeout = self.spec.load_timeout or 300.0
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
                    raise ModelLoadFailed(
                        f"model {self.name!r} failed to load: {self._error}", retry_after=wait
                    )
                self._start_load()
            elif state is State.UNLOADED:
                self._start_load()
            assert self._load_task is not None
            remaining = deadline - self._clock()
            try:
                if remaining <= 0:
                    raise TimeoutError
                await asyncio.wait_for(asyncio.shield(self._load_task), remaining)
            except TimeoutError:
                raise LoadTimeout(
                    f"model {self.name!r} is still loading after {timeout:g}s", retry_after=5.0
                ) from None

    def release(self) -> None:
        """End a lease. The last one to end starts the idle timer."""
        self._in_flight -= 1
        self._last_used_wall = time.time()
        if self._in_flight == 0:
            self._last_release = self._clock()
            if self._drained is not None:
                self._drained.set()
            self._arm_idle_timer()

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
            log_event("request_failed", logging.ERROR, model=self.name,
                      error=describe_exception(exc))
            raise BackendError(
                f"model {self.name!r} failed to run: {describe_exception(exc)}"
            ) from exc

    # --- loading ----------------------------------------------------------------------

    def _start_load(self) -> None:
        self._move(Event.LOAD)
        self._load_task = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        started = self._clock()
        rss_before = process_rss()
        log_event("model_loading", model=self.name, path=self.spec.path)
        try:
            instance = await loop.run_in_executor(
                self._loader, self._backend.load_blocking, self.spec
            )
        except Exception as exc:
            self._failures += 1
            self.stats.load_failures += 1
            backoff = load_backoff(self._failures)
            self._retry_at = self._clock() + backoff
            self._error = describe_exception(exc)
            self._move(Event.LOAD_FAILED)
            log_event("model_load_failed", logging.WARNING, model=self.name, error=self._error,
                      retry_in_s=backoff)
            return
        ms = (self._clock() - started) * 1000.0
        measured = max(process_rss() - rss_before, 0)
        self._metadata = instance.metadata
        worker = ThreadPoolExecutor(1, thread_name_prefix=f"snooze-run-{self.name}")
        policy = self._policy = self._policy_for(instance.metadata)
        batcher = Batcher(
            self.name, instance.run_blocking, worker, policy, self.stats.batching, self._clock
        )
        batcher.start()
        self._replica = Replica(instance, worker, batcher)
        self._failures = 0
        self._error = None
        self._reason = ""
        self.stats.loads += 1
        self.stats.last_load_ms = ms
        self.stats.measured_bytes = measured
        self._move(Event.LOADED)
        self._last_release = self._clock()
        self._arm_idle_timer()
        log_event("model_loaded", model=self.name, ms=round(ms, 1), bytes=measured)

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
        """The model's metadata; loads the model once if it has never been loaded."""
        if self._metadata is None:
            await self.load()
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
            rss_before = process_rss()
            if replica is not None:
                await replica.batcher.stop()
                await asyncio.get_running_loop().run_in_executor(
                    self._loader, _close_blocking, replica.instance, replica.worker
                )
            del replica
            freed = max(rss_before - process_rss(), 0)
            self.stats.freed_bytes = freed
            self._reason = reason
            self._move(Event.UNLOADED)
            log_event("model_unloaded", model=self.name, reason=reason, freed_bytes=freed)
        finally:
            self._unload_task = None


def _close_blocking(instance: Instance | None, worker: ThreadPoolExecutor | None) -> None:
    if worker is not None:
        worker.shutdown(wait=True)
    if instance is not None:
        try:
            instance.close()
        except Exception as exc:  # a failing close must not keep the model half-unloaded
            log_event("model_close_failed", logging.WARNING, error=describe_exception(exc))
    del instance
    release_memory_blocking()
