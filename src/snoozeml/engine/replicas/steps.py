"""A model's scaling steps: one replica added or removed at a time, and what the last failed add
said.

The autoscaler (engine/replicas/autoscaler.py) and an explicit load ask for the steps; the model
(engine/model.py) says whether they may run (only while it is READY) and holds the lock while it
unloads, so an unload waits for the step in progress; the replica set (engine/replicas/pool.py)
knows how to add and remove one. Each step is published (`ReplicaAdded`, `ReplicaFailed`,
`ReplicaDraining`, `ReplicaRemoved`).

Invariants:
- Steps run one at a time, under `lock`, and each checks after taking it that the model is ready
  and still wants it (the step before may have changed either).
- `blocked` is set by a failed add and cleared by the next good one, or when the episode is over
  (the autoscaler no longer wants a replica, or the model unloads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from snoozeml.engine.events import (
    EventBus,
    ReplicaAdded,
    ReplicaDraining,
    ReplicaFailed,
    ReplicaRemoved,
)
from snoozeml.engine.replicas.pool import ReplicaSet
from snoozeml.engine.replicas.replica import Replica
from snoozeml.errors import MemoryExhausted, ModelTooLarge, SnoozeError, describe_exception


class ReplicaSteps:
    def __init__(
        self, model: str, replicas: ReplicaSet, events: EventBus, ready: Callable[[], bool]
    ) -> None:
        self.model = model
        self.lock = asyncio.Lock()  # held by a step, and by the model's unload
        self.blocked: str | None = None  # why replicas cannot be added, this episode
        self.error: str | None = None  # the last failed add's error
        self._replicas = replicas
        self._events = events
        self._ready = ready  # whether the model is READY

    @property
    def busy(self) -> bool:
        """A replica is being added or removed (or the model is unloading them all)."""
        return self.lock.locked()

    async def add_replica(
        self, colder_than: float | None = None, until: int | None = None
    ) -> Replica | None:
        """One more replica for the READY model, if memory admits it at once (evicting only
        models used before `colder_than`); None when the model is not READY, or already has
        `until` ready replicas (or its most) once the step before has finished. A failure is
        published (ReplicaFailed) and raised: MemoryExhausted, ModelTooLarge or the backend's
        error."""
        replicas = self._replicas
        async with self.lock:
            most = replicas.max_replicas if until is None else min(until, replicas.max_replicas)
            if not self._ready() or len(replicas.ready) >= most:
                return None
            try:
                replica = await replicas.add(wait=False, colder_than=colder_than)
            except Exception as exc:
                error = exc.message if isinstance(exc, SnoozeError) else describe_exception(exc)
                first = self.blocked is None
                self.blocked = self.error = error
                self._events.publish(ReplicaFailed(
                    self.model, error, isinstance(exc, (MemoryExhausted, ModelTooLarge)), first))
                raise
            self.blocked = None
            self._events.publish(ReplicaAdded(self.model, replica.index, replica.device,
                                              len(replicas.ready)))
            return replica

    async def remove_replica(self, until: int = 1) -> bool:
        """Drain the replica with the least work and close it once it has finished; False
        when the model is not READY or has `until` ready replicas or fewer once the step
        before has finished (the last one goes with the model, by the idle timer or an
        unload)."""
        replicas = self._replicas
        async with self.lock:
            if not self._ready() or len(replicas.ready) <= max(until, 1):
                return False
            replica = replicas.start_draining()
            ready = len(replicas.ready)
            self._events.publish(ReplicaDraining(self.model, replica.index, ready))
            freed = await replicas.remove(replica)
            self._events.publish(ReplicaRemoved(self.model, replica.index, replica.device,
                                                freed, ready))
            return True

    async def fill(self, least: int) -> None:
        """Add replicas, one at a time, until `least` are ready (or the most allowed); the first
        that cannot be added ends it (published by `add_replica`; the autoscaler tries again)."""
        if len(self._replicas.ready) >= least:
            return
        # A task of its own, like the first load: a caller that goes away must not cut a
        # replica's load in half (the instance would be built and never closed).
        await asyncio.shield(asyncio.get_running_loop().create_task(self._fill(least)))

    async def _fill(self, least: int) -> None:
        while len(self._replicas.ready) < min(least, self._replicas.max_replicas):
            try:
                if await self.add_replica(until=least) is None:
                    return
            except Exception:  # published by add_replica
                return
