"""The loaded replicas of one model, how each comes and goes, and which one a request goes to.

A `ReplicaSet` owns what is per instance or shared by a model's instances: the backend, the
predicted and measured sizes, where a replica may go (`Placement`s) and how many may share the
CPU, the routing strategy, the one batching policy all its replicas follow (kept across
reloads when the model turned out not to batch), and every replica's load (memory admission,
the backend load with one retry after an out-of-memory error, measuring), drain and unload.
The model (engine/model.py) decides *when*: its lifecycle, leases, idle timer, scaling lock.

Invariants:
- A replica is in `replicas` from the moment it runs until it is closed; while it is there
  its memory counts as used on its device. `ready` is the part of it requests are routed to.
- A draining replica gets no new lease; it is closed once its last one has ended.
- Every replica of one model has the same policy object, written only here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from snoozeml.config.settings import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.batching.hooks import BatcherHooks, RunTimes
from snoozeml.engine.batching.loop import Batcher
from snoozeml.engine.batching.policy import BatchPolicy, batching_blocker
from snoozeml.engine.clock import Clock
from snoozeml.engine.deadline import ModelFiles
from snoozeml.engine.events import BatchingDisabled, EventBus, LoadFinished, LoadStarted
from snoozeml.engine.memory.budgets import MemoryManager
from snoozeml.engine.memory.victims import Prewarming
from snoozeml.engine.replicas.replica import (
    Replica,
    ReplicaState,
    close_abandoned_blocking,
    close_replica_blocking,
    cpu_replica_cap,
    load_instance_blocking,
    usable_cores,
)
from snoozeml.engine.upgrades import Upgrades
from snoozeml.errors import MemoryExhausted, describe_exception
from snoozeml.logs import log_event
from snoozeml.runtime.base import Backend, FileSizes, Instance


@dataclass(frozen=True, slots=True)
class Placement:
    """A device a replica may go to: what the backend is told, and whose budget it uses."""

    device: str  # the model's `device`, or one of `replicas.devices` ("auto", "cuda:1", ...)
    memory: str  # the budget it counts against ("cpu", "cuda:1")


class ReplicaSet:
    def __init__(
        self,
        spec: ModelConfig,
        backend: Backend,
        placements: Sequence[Placement],
        loader: Executor,
        memory: MemoryManager,
        events: EventBus,
        clock: Clock,
        cores: int | None = None,
    ) -> None:
        assert placements, "a model needs somewhere to run"
        self.spec = spec
        self.name = spec.name
        self.placements = tuple(placements)
        self.device = placements[0].memory  # where the model counts when it has no replica
        self.threads = spec.intra_op_threads  # per replica: 1 unless the file says
        self.cpu_cap = cpu_replica_cap(spec, cores or usable_cores())
        self.replicas: list[Replica] = []  # running: ready or draining
        self.ready: list[Replica] = []  # what requests are routed to
        self.loading: dict[int, str] = {}  # replica index -> budget, while it loads
        self.policy: BatchPolicy | None = None  # None until the first load decides
        self.predicted_bytes: int | None = None
        self.measured_bytes: int | None = None  # the last replica's, after its load
        self._round_robin = spec.replicas.strategy == "round-robin"
        self._turn = 0
        self._sizes: FileSizes | None = None
        self._unsplittable: str | None = None  # why batching stopped for good, if it did
        self._next_index = 0
        self._backend = backend
        self._loader = loader
        self._memory = memory
        self._events = events
        self._clock = clock
        self._run_times = RunTimes()  # the model's, shared by its replicas' batchers
        self.upgrades = Upgrades(spec.name, loader, memory, events, clock)
        # Per load path: the bytes the last load on it held at its peak beyond its size.
        self._held_beyond: dict[str, int] = {}
        self._background: asyncio.Task[None] | None = None
        # Every blocking call on the model's files is cut at load_timeout (engine/deadline.py).
        self._files = ModelFiles(spec.name, spec.load_timeout if spec.load_timeout is not None
                                 else 300.0, clock.now)
        self._sizing: asyncio.Task[None] | None = None

    # --- routing -------------------------------------------------------------------------------

    def pick(self) -> Replica:
        """The replica a new request goes to. `least-queue`: the fewest queued + running
        requests, ties taken in turn; `round-robin`: each in turn. Needs a ready replica."""
        ready = self.ready
        count = len(ready)
        if count == 1:
            return ready[0]
        turn = self._turn = self._turn + 1
        best = ready[turn % count]
        if self._round_robin:
            return best
        fewest = best.load
        for step in range(1, count):
            replica = ready[(turn + step) % count]
            if replica.load < fewest:
                best, fewest = replica, replica.load
        return best

    # --- reading -------------------------------------------------------------------------------

    @property
    def load(self) -> int:
        """Queued and running requests on the ready replicas."""
        return sum(replica.load for replica in self.ready)

    @property
    def queued(self) -> int:
        return sum(replica.batcher.queued for replica in self.replicas)

    @property
    def draining(self) -> int:
        return len(self.replicas) - len(self.ready)

    @property
    def runs_inline(self) -> bool:
        return any(replica.batcher.runs_inline for replica in self.replicas)

    def resident_bytes(self, device: str | None = None) -> int:
        """What the replicas hold (on `device`, or everywhere): each one's measured size,
        else the predicted one."""
        fallback = self.predicted_bytes or 0
        return sum(replica.measured_bytes or fallback for replica in self.replicas
                   if device is None or replica.device == device)

    # --- sizes ---------------------------------------------------------------------------------

    async def predict_size(self) -> None:
        """Read the model's file sizes (off the loop) so its predicted size shows before the
        first load; a no-op once known."""
        if self._sizes is not None:
            return
        if self._sizing is None or self._sizing.done():  # one read at a time, shared
            self._sizing = asyncio.get_running_loop().create_task(self._read_sizes())
        await asyncio.shield(self._sizing)

    async def _read_sizes(self) -> None:
        sizes = await self._files.run("reading the model's files",
                                      partial(self._backend.file_sizes_blocking, self.spec))
        self._sizes = sizes
        self.predicted_bytes = self._memory.predicted(self.spec, sizes)

    # --- loading -------------------------------------------------------------------------------

    async def add(self, *, wait: bool = True, colder_than: float | None = None,
                  prewarm: Prewarming | None = None) -> Replica:
        """Load one more replica on the placement with the most free memory: admitted by the
        memory manager (`wait`, `colder_than`, `prewarm` as in `admission`), measured,
        running.
        Raises ModelTooLarge or MemoryExhausted when it cannot fit, or the backend's error."""
        loop = asyncio.get_running_loop()
        await self.predict_size()
        assert self._sizes is not None
        placement = self._place()
        spec = self.spec.model_copy(update={"device": placement.device})
        await self._files.run("importing the model's code",
                              partial(self._backend.prepare_blocking, spec))
        # The path this load takes decides its peak (runtime/onnx/backend.py: a mapped load holds
        # only the graph beside the weights): the backend's prediction for it, or what the
        # last load on that path really held beyond its size, whichever is more.
        plan = await self._files.run("planning the load", partial(
            self._backend.load_plan_blocking, spec, self._sizes))
        resident = max(self.measured_bytes or self.predicted_bytes or 0, plan.least)
        transient = max(plan.transient, self._held_beyond.get(plan.path, 0))
        index = self._next_index
        self._next_index += 1
        try:
            async with self._memory.admission(self.name, placement.memory, resident,
                                              transient, wait=wait, colder_than=colder_than,
                                              prewarm=prewarm):
                # Timed from here: waiting for the device is not loading.
                self.loading[index] = placement.memory
                started = self._clock.now()
                self._events.publish(LoadStarted(self.name, index, placement.memory,
                                                 str(self.spec.path)))
                instance, measured, peak = await self._load_instance(spec, placement.memory)
                if peak is not None:
                    self._held_beyond[plan.path] = max(peak - measured, 0)
                replica = self._start(index, placement.memory, instance, measured)
        finally:
            self.loading.pop(index, None)
        self._events.publish(LoadFinished(self.name, index, placement.memory,
                                          self._clock.now() - started, measured,
                                          resident + transient, peak))
        if plan.background and self._background is None:
            self._background = loop.create_task(
                self._run_background(spec, placement.memory, plan.background_bytes))
        return replica

    async def _run_background(self, spec: ModelConfig, device: str, needs: int) -> None:
        """The work the load left for later, off the request path (one at a time), in free
        room only (when there is none, it waits for a later load), without holding up the
        loads of other models."""
        try:
            async with self._memory.side_room(self.name, device, needs):
                await asyncio.get_running_loop().run_in_executor(
                    self._loader, self._backend.background_blocking, spec)
        except MemoryExhausted as exc:
            log_event("background_deferred", logging.INFO, model=self.name, reason=exc.message)
        except Exception as exc:  # boundary of a background task
            log_event("background_failed", logging.ERROR, model=self.name,
                      error=describe_exception(exc))
        finally:
            self._background = None

    async def finish_background(self) -> None:
        """Wait for the work a load left for later (at shutdown: nothing is left running)."""
        if self._background is not None:
            await asyncio.gather(self._background, return_exceptions=True)

    @property
    def max_replicas(self) -> int:
        """`replicas.max`, but no more CPU replicas than `cpu_cap` when every placement is
        the CPU."""
        top = self.spec.replicas.max
        if self.cpu_cap is not None and all(p.memory == "cpu" for p in self.placements):
            return min(top, self.cpu_cap)
        return top

    def _place(self) -> Placement:
        """The placement whose budget has the most room (then the one with fewer of this
        model's replicas, then the first listed); the CPU only below `cpu_cap`."""
        placements = self.placements
        if self.cpu_cap is not None and \
                sum(1 for r in self.replicas if r.device == "cpu") >= self.cpu_cap:
            placements = tuple(p for p in placements if p.memory != "cpu") or placements
        if len(placements) == 1:
            return placements[0]

        def room(ranked: tuple[int, Placement]) -> tuple[int, int, int]:
            order, placement = ranked
            mine = sum(1 for r in self.replicas if r.device == placement.memory)
            return (-self._memory.free(placement.memory), mine, order)

        return min(enumerate(placements), key=room)[1]

    async def _load_instance(
        self, spec: ModelConfig, device: str
    ) -> tuple[Instance, int, int | None]:
        """The instance, the memory it added on its device (admission holds the device
        against other loads meanwhile) and the host's peak during the load, when known."""
        probe = self._memory.probe
        before = probe.used(device)
        deadline = self._clock.now() + self._files.load_timeout
        load = partial(load_instance_blocking, self._backend, spec, probe, device)
        try:
            instance, peak = await self._files.run("the load", load, deadline,
                                                   close_abandoned_blocking)
        except Exception as exc:
            if not self._backend.is_out_of_memory(exc):
                raise
            await self._memory.relieve_oom(self.name, device, "load", describe_exception(exc))
            before = probe.used(device)  # after the evictions, not before them
            instance, peak = await self._files.run("the load", load, deadline,
                                                   close_abandoned_blocking)
        return instance, max(probe.used(device) - before, 0), peak

    def _start(self, index: int, device: str, instance: Instance, measured: int) -> Replica:
        policy = self._policy_for(instance.metadata)
        worker = ThreadPoolExecutor(1, thread_name_prefix=f"snooze-run-{self.name}")
        hooks = BatcherHooks(self._backend.is_out_of_memory,
                             partial(self._relieve_oom_after_run, device),
                             self.disable_batching, self._run_times, self._batch_ran)
        batcher = Batcher(self.name, index, instance, worker, policy, self._events, hooks,
                          self._clock)
        batcher.start()
        replica = Replica(index, device, instance, worker, batcher, measured,
                          self._clock.wall())
        self.replicas.append(replica)
        self.ready.append(replica)
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

    def _batch_ran(self, index: int, rows: int) -> None:
        for replica in self.ready:
            if replica.index == index:
                self.upgrades.batch_ran(replica, rows)
                return

    async def _relieve_oom_after_run(self, device: str, exc: BaseException) -> None:
        await self._memory.relieve_oom(self.name, device, "run", describe_exception(exc))

    # --- unloading -----------------------------------------------------------------------------

    def start_draining(self) -> Replica:
        """Take the replica with the least work (the newest among equals) out of routing; it
        keeps what it holds. Needs two ready replicas: the model keeps serving on the rest."""
        assert len(self.ready) > 1, "the last ready replica goes with the model"
        replica = min(reversed(self.ready), key=lambda r: r.load)
        self.ready.remove(replica)
        replica.state = ReplicaState.DRAINING
        if replica.in_flight:
            replica.drained = asyncio.Event()
        return replica

    async def remove(self, replica: Replica) -> int:
        """Close a draining replica once its last lease has ended; returns the bytes this
        freed on its device."""
        if replica.drained is not None:
            await replica.drained.wait()
        return await self._close([replica], replica.device)

    async def remove_all(self) -> int:
        """Stop and close every replica (their leases must have ended); returns the bytes this
        freed on the model's devices."""
        freed = 0
        for device in dict.fromkeys(replica.device for replica in self.replicas):
            freed += await self._close([r for r in self.replicas if r.device == device], device)
        return freed

    async def _close(self, replicas: list[Replica], device: str) -> int:
        loop = asyncio.get_running_loop()
        probe = self._memory.probe
        await self.upgrades.cancel(replicas)
        # One measured unload per device at a time, so each frees only its own bytes.
        async with self._memory.measuring(device):
            try:
                before = probe.used(device)
                for replica in replicas:
                    try:
                        await replica.batcher.stop()
                        await loop.run_in_executor(self._loader, close_replica_blocking,
                                                   replica)
                    except Exception as exc:  # the replica is dropped either way
                        log_event("unload_failed", logging.ERROR, model=self.name,
                                  replica=replica.index, error=describe_exception(exc))
            finally:
                for replica in replicas:
                    self.replicas.remove(replica)
                    if replica in self.ready:
                        self.ready.remove(replica)
            return max(before - probe.used(device), 0)
