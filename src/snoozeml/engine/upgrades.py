"""Upgrades: the faster form of a model that a quick load left for later (onnx: its pre-packed
weights, see runtime/onnx/backend.py), built in the background once a batch shows it is worth it and
swapped in between two runs, so no request fails or waits for it.

Invariants:
- At most one upgrade per replica is under way, and a replica upgrades at most once per load.
- An upgrade holds its device's admission while it builds, so its peak is reserved and its
  measurement is its own; it takes only free room and never evicts another model for it.
- Closing a replica first cancels its upgrade (one waiting for the device gives up at once;
  one building finishes before the instance closes, which the instance guarantees itself).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from concurrent.futures import Executor

from snoozeml.engine.clock import Clock
from snoozeml.engine.events import EventBus, ReplicaUpgraded, UpgradeDeferred
from snoozeml.engine.memory.budgets import MemoryManager
from snoozeml.engine.replicas.replica import Replica, ReplicaState
from snoozeml.errors import MemoryExhausted, ModelTooLarge, describe_exception
from snoozeml.logs import log_event

RETRY_AFTER = 10.0  # seconds before a batch may try again an upgrade that memory refused


class Upgrades:
    """The upgrades of one model's replicas."""

    def __init__(
        self, name: str, loader: Executor, memory: MemoryManager, events: EventBus,
        clock: Clock,
    ) -> None:
        self.name = name
        self._loader = loader
        self._memory = memory
        self._events = events
        self._clock = clock
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._settled: set[int] = set()  # replicas with nothing (more) to upgrade
        self._retry_at = 0.0

    def batch_ran(self, replica: Replica, rows: int) -> None:
        """After a run of `rows` (> 1) on `replica`: start its upgrade if the instance wants
        one now."""
        index = replica.index
        if index in self._settled or index in self._tasks or \
                replica.state is not ReplicaState.READY or self._clock.now() < self._retry_at:
            return
        need = replica.instance.upgrade_bytes(rows)
        if need <= 0:
            self._settled.add(index)
            return
        self._tasks[index] = asyncio.get_running_loop().create_task(self._upgrade(replica, need))

    async def _upgrade(self, replica: Replica, need: int) -> None:
        loop = asyncio.get_running_loop()
        probe = self._memory.probe
        device = replica.device
        try:
            async with self._memory.admission(self.name, device, 0, need, wait=False,
                                              evict=False), self._memory.measuring(device):
                started = self._clock.now()
                before = probe.used(device)
                done = await loop.run_in_executor(self._loader, replica.instance.upgrade_blocking)
                grown = probe.used(device) - before
            self._settled.add(replica.index)
            if done:
                replica.measured_bytes = max(replica.measured_bytes + grown, 0)
                self._events.publish(ReplicaUpgraded(self.name, replica.index, device,
                                                     self._clock.now() - started,
                                                     replica.measured_bytes))
        except (MemoryExhausted, ModelTooLarge) as exc:
            self._retry_at = self._clock.now() + RETRY_AFTER
            self._events.publish(UpgradeDeferred(self.name, replica.index, exc.message, True))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # boundary of a background task: the replica serves as it was
            self._settled.add(replica.index)
            self._events.publish(UpgradeDeferred(self.name, replica.index,
                                                 describe_exception(exc), False))
            log_event("upgrade_failed", logging.ERROR, model=self.name, replica=replica.index,
                      error=describe_exception(exc))
        finally:
            self._tasks.pop(replica.index, None)

    async def cancel(self, replicas: Iterable[Replica]) -> None:
        """Before `replicas` close: stop their upgrades, and forget them."""
        tasks = []
        for replica in replicas:
            self._settled.discard(replica.index)
            task = self._tasks.pop(replica.index, None)
            if task is not None:
                task.cancel()
                tasks.append(task)
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def under_way(self) -> int:
        return len(self._tasks)
