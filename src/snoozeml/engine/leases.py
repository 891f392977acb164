"""A model's leases, counted: how many requests hold one of its replicas, how many wait for its
load, and the end of the last one, which starts the idle timer and wakes an unload waiting for it.

The model (engine/model.py) takes and ends leases only through its `Lease` context manager, and
its unload waits here (`drained`) for the last one to end.

Invariants:
- Each lease counts once on the model (`held`) and once on its replica (`Replica.in_flight`).
- The keep-alive (engine/keepalive/keeper.py) hears when the last lease ends: it touches the
  idle timer, which measures from the end of the last lease (the model touches it after a
  load too).
"""

from __future__ import annotations

import asyncio

from snoozeml.engine.clock import Clock
from snoozeml.engine.events import EventBus, ModelIdle
from snoozeml.engine.keepalive.keeper import KeepAlive
from snoozeml.engine.replicas.pool import ReplicaSet
from snoozeml.engine.replicas.replica import Replica


class Leases:
    __slots__ = ("_clock", "_drained", "_events", "_keep", "_model", "_replicas",
                 "awaiting_load", "held", "last_used")

    def __init__(
        self, model: str, replicas: ReplicaSet, events: EventBus, clock: Clock, keep: KeepAlive
    ) -> None:
        self.held = 0  # leases held now, on all the model's replicas
        # Requests waiting on a load: the model they load is not idle before they take their
        # lease, or a load waiting for memory could evict it first (and be evicted in turn).
        self.awaiting_load = 0
        self.last_used: float | None = None  # epoch seconds at which the last lease ended
        self._model = model
        self._replicas = replicas
        self._events = events
        self._clock = clock
        self._keep = keep
        self._drained: asyncio.Event | None = None

    def take(self) -> Replica:
        """A lease on a replica of the READY model (`ReplicaSet.pick` chooses which)."""
        replica = self._replicas.pick()
        replica.in_flight += 1
        self.held += 1
        return replica

    def release(self, replica: Replica) -> None:
        """End a lease. The last one to end starts the idle timer (through the keep-alive)."""
        replica.in_flight -= 1
        if replica.drained is not None and not replica.in_flight:
            replica.drained.set()
        self.held -= 1
        self.last_used = self._clock.wall()
        if self.held == 0:
            self._keep.ended()
            if self._drained is not None:
                self._drained.set()
            self._events.publish(ModelIdle(self._model))

    async def drained(self) -> None:
        """Until the last lease held now has ended (at once when none is)."""
        if self.held:
            self._drained = asyncio.Event()
            await self._drained.wait()
            self._drained = None
