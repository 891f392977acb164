"""The loaded replicas of one model, and how each comes and goes.

A `ReplicaSet` owns what is per instance or shared by a model's instances: the backend, the
predicted and measured sizes, the one batching policy all its replicas follow (kept across
reloads when the model turned out not to batch), and every replica's load (memory admission,
the backend load with one retry after an out-of-memory error, measuring) and unload. The model
(engine/model.py) decides *when*: its lifecycle, leases and idle timer.

Invariants:
- A replica is in `replicas` from the moment it runs until it is closed; while it is there
  its memory counts as used on its device.
- Every replica of one model has the same policy object, written only here.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor, ThreadPoolExecutor

from snoozeml.config import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.batcher import Batcher, BatcherHooks, RunTimes
from snoozeml.engine.batching import BatchPolicy, batching_blocker
from snoozeml.engine.clock import Clock
from snoozeml.engine.events import BatchingDisabled, EventBus, LoadFinished, LoadStarted
from snoozeml.engine.memory import MemoryManager
from snoozeml.engine.replica import Replica, close_replica_blocking, load_instance_blocking
from snoozeml.errors import describe_exception
from snoozeml.logs import log_event
from snoozeml.runtime.base import Backend, FileSizes, Instance


class ReplicaSet:
    def __init__(
        self,
        spec: ModelConfig,
        backend: Backend,
        device: str,
        loader: Executor,
        memory: MemoryManager,
        events: EventBus,
        clock: Clock,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.device = device  # whose memory budget the replicas count against
        self.replicas: list[Replica] = []
        self.policy: BatchPolicy | None = None  # None until the first load decides
        self.predicted_bytes: int | None = None
        self.measured_bytes: int | None = None  # the last replica's, after its load
        self._sizes: FileSizes | None = None
        self._unsplittable: str | None = None  # why batching stopped for good, if it did
        self._next_index = 0
        self._backend = backend
        self._loader = loader
        self._memory = memory
        self._events = events
        self._clock = clock
        self._hooks = BatcherHooks(backend.is_out_of_memory, self._relieve_oom_after_run,
                                   self.disable_batching, RunTimes())

    # --- reading -------------------------------------------------------------------------------

    def pick(self) -> Replica:
        """The replica a new request goes to: the least loaded. Needs at least one."""
        replicas = self.replicas
        if len(replicas) == 1:
            return replicas[0]
        return min(replicas, key=lambda replica: replica.load)

    @property
    def queued(self) -> int:
        return sum(replica.batcher.queued for replica in self.replicas)

    @property
    def runs_inline(self) -> bool:
        return any(replica.batcher.runs_inline for replica in self.replicas)

    def resident_bytes(self) -> int:
        """What the replicas hold: each one's measured size (else the predicted one)."""
        fallback = self.predicted_bytes or 0
        return sum(replica.measured_bytes or fallback for replica in self.replicas)

    # --- sizes ---------------------------------------------------------------------------------

    async def predict_size(self) -> None:
        """Read the model's file sizes (off the loop) so its predicted size shows before the
        first load; a no-op once known."""
        if self._sizes is None:
            sizes = await asyncio.get_running_loop().run_in_executor(
                self._loader, self._backend.file_sizes_blocking, self.spec
            )
            if self._sizes is None:
                self._sizes = sizes
                self.predicted_bytes = self._memory.predicted(self.spec, sizes)

    # --- loading -------------------------------------------------------------------------------

    async def add(self) -> Replica:
        """Load one more replica: admitted by the memory manager, measured, running. Raises
        ModelTooLarge or MemoryExhausted when it cannot fit, or the backend's own error."""
        loop = asyncio.get_running_loop()
        await self.predict_size()
        assert self._sizes is not None
        await loop.run_in_executor(self._loader, self._backend.prepare_blocking, self.spec)
        resident = self.measured_bytes or self.predicted_bytes or 0
        index = self._next_index
        self._next_index += 1
        async with self._memory.admission(self.name, self.device, resident,
                                          self._sizes.transient):
            # Timed from here: waiting for the device is not loading.
            started = self._clock.now()
            self._events.publish(LoadStarted(self.name, index, self.device, str(self.spec.path)))
            instance, measured = await self._load_instance()
            replica = self._start(index, instance, measured)
        self._events.publish(LoadFinished(self.name, index, self.device,
                                          self._clock.now() - started, measured))
        return replica

    async def _load_instance(self) -> tuple[Instance, int]:
        """The instance and the memory it added on its device (admission holds the device
        against other loads meanwhile)."""
        loop = asyncio.get_running_loop()
        probe = self._memory.probe
        before = probe.used(self.device)
        try:
            instance = await loop.run_in_executor(
                self._loader, load_instance_blocking, self._backend, self.spec
            )
        except Exception as exc:
            if not self._backend.is_out_of_memory(exc):
                raise
            await self._memory.relieve_oom(self.name, self.device, "load",
                                           describe_exception(exc))
            before = probe.used(self.device)  # after the evictions, not before them
            instance = await loop.run_in_executor(
                self._loader, load_instance_blocking, self._backend, self.spec
            )
        return instance, max(probe.used(self.device) - before, 0)

    def _start(self, index: int, instance: Instance, measured: int) -> Replica:
        policy = self._policy_for(instance.metadata)
        worker = ThreadPoolExecutor(1, thread_name_prefix=f"snooze-run-{self.name}")
        batcher = Batcher(self.name, index, instance, worker, policy, self._events, self._hooks,
                          self._clock.now)
        batcher.start()
        replica = Replica(index, self.device, instance, worker, batcher, measured,
                          self._clock.wall())
        self.replicas.append(replica)
        self.measured_bytes = measured
        return replica

    # --- the batching policy -------------------------------------------------------------------

    def _policy_for(self, metadata: ModelMetadata) -> BatchPolicy:
        """The configured policy, unless the model cannot be batched: its shapes say so (read
        again at every load: the file may have changed), or a batched run showed it."""
        conf = self.spec.batching
        policy = BatchPolicy(conf.max_batch_size, conf.max_delay, conf.max_queue)
        if policy.enabled:
            reason = self._unsplittable or batching_blocker(metadata)
            if reason is not None:
                if self.policy is None or self.policy.enabled:
                    self._events.publish(BatchingDisabled(self.name, reason))
                policy = BatchPolicy(0, conf.max_delay, conf.max_queue)
        self.policy = policy
        return policy

    def disable_batching(self, reason: str) -> None:
        """Run every request alone from now on, on every replica, and after reloads too."""
        if self.policy is None or not self.policy.enabled:
            return
        self._unsplittable = reason
        self.policy = BatchPolicy(0, self.policy.max_delay, self.policy.max_queue)
        for replica in self.replicas:
            replica.batcher.policy = self.policy
        self._events.publish(BatchingDisabled(self.name, reason))

    async def _relieve_oom_after_run(self, exc: BaseException) -> None:
        await self._memory.relieve_oom(self.name, self.device, "run", describe_exception(exc))

    # --- unloading -----------------------------------------------------------------------------

    async def remove_all(self) -> int:
        """Stop and close every replica (their leases must have ended); returns the bytes this
        freed on the device."""
        loop = asyncio.get_running_loop()
        probe = self._memory.probe
        # One measured unload per device at a time, so each frees only its own bytes.
        async with self._memory.measuring(self.device):
            try:
                before = probe.used(self.device)
                for replica in self.replicas:
                    try:
                        await replica.batcher.stop()
                        await loop.run_in_executor(self._loader, close_replica_blocking,
                                                   replica)
                    except Exception as exc:  # the replica is dropped either way
                        log_event("unload_failed", logging.ERROR, model=self.name,
                                  error=describe_exception(exc))
            finally:
                self.replicas.clear()
            return max(before - probe.used(self.device), 0)
