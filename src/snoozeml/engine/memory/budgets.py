"""Memory budgets, admission before a load, least-recently-used eviction, OOM relief.

Every device ("cpu", "cuda:N") has a budget for the models' memory (the daemon's own baseline
is not counted). A model's size is predicted from its files before its first load and measured
after every load. Admission reserves the load's *peak* — onnxruntime briefly holds the protobuf
next to the weights it builds from it — so a budget is not exceeded during the load itself.

Invariants:
- Loads on one device are admitted one at a time (a per-device lock held through the load),
  so two loads never both count on the same free memory, and each measurement is its own.
- Only READY models without a lease or queued request, and not pinned, are ever victims.
- A victim's memory counts as used until its unload has finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Protocol

from snoozeml.config.settings import ModelConfig, ServerConfig
from snoozeml.engine.events import EventBus, Evicting, OomRetry, SideRoomReleased
from snoozeml.engine.memory.probes import MemoryProbe
from snoozeml.engine.memory.victims import (
    Prewarming,
    Resident,
    budget_bytes,
    pick_victims,
    pick_victims_by_cost,
    shortfall,
)
from snoozeml.engine.observe.snapshots import DeviceSnapshot
from snoozeml.errors import MemoryExhausted, ModelTooLarge
from snoozeml.runtime.base import FileSizes
from snoozeml.units import format_bytes


class Tenant(Protocol):
    """What the memory manager sees of a model (engine/model.py's Model), whose replicas may
    sit on several devices."""

    @property
    def name(self) -> str: ...

    def resident_on(self, device: str) -> int:
        """Bytes the model holds on `device` (a budget's key)."""
        ...

    def resident(self, now: float, device: str) -> Resident | None:
        """The model as an eviction candidate for room on `device`; None when it holds none."""
        ...

    async def unload(self, reason: str) -> None: ...


class MemoryManager:
    def __init__(
        self,
        server: ServerConfig,
        probe: MemoryProbe,
        tenants: Callable[[], Iterable[Tenant]],
        events: EventBus,
        clock: Callable[[], float] = time.monotonic,
        cost_aware: bool = False,
    ) -> None:
        memory = server.memory
        # Victims by cost (pick_victims_by_cost) rather than least recently used: with any
        # adaptive keep-alive (engine/registry.py), whose plans say when models are next used.
        self.cost_aware = cost_aware
        self._inflation: dict[str, float] = {}  # device -> Greedy-Dual's clock
        # device -> model -> (last_used, the device's clock then)
        self._clocks: dict[str, dict[str, tuple[float, float]]] = {}
        self.probe = probe
        self.memory_wait = memory.memory_wait
        self.min_residency = memory.min_residency
        self.default_factor = memory.memory_factor
        self.budgets: dict[str, int] = {"cpu": budget_bytes(memory.host_budget,
                                                            probe.total("cpu"))}
        for gpu in probe.gpus():
            self.budgets[gpu] = budget_bytes(memory.gpu_budget, probe.total(gpu))
        self._tenants = tenants
        self._events = events
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._measure_locks: dict[str, asyncio.Lock] = {}
        self._reserved: dict[str, tuple[str, int]] = {}  # device -> (model, bytes)
        self._side: dict[str, int] = {}  # device -> bytes held by background work

    # --- accounting -----------------------------------------------------------------------

    def used(self, device: str) -> int:
        """Bytes held by models on `device` (loaded or still unloading)."""
        return sum(tenant.resident_on(device) for tenant in self._tenants())

    def free(self, device: str) -> int:
        """What the budget of `device` has left beside the models, the load in progress and
        background work."""
        device = self.device_key(device)
        return self.budgets[device] - self.used(device) - self.reserved(device)

    def measuring(self, device: str) -> asyncio.Lock:
        """Held around a load's or an unload's before/after reading, so loads and unloads
        running together (at shutdown, or evicting two victims) each report only their own."""
        return self._measure_locks.setdefault(self.device_key(device), asyncio.Lock())

    def device_key(self, device: str) -> str:
        """The budget a model on `device` counts against: its own, or the host's when the
        device has none (mps, a GPU that is not there)."""
        return device if device in self.budgets else "cpu"

    def reserved(self, device: str) -> int:
        """Bytes held for the load in progress and for background work on `device`."""
        entry = self._reserved.get(device)
        return (entry[1] if entry else 0) + self._side.get(device, 0)

    def predicted(self, spec: ModelConfig, sizes: FileSizes) -> int:
        factor = spec.memory_factor if spec.memory_factor is not None else self.default_factor
        return int(sizes.weights * factor)

    # --- admission ------------------------------------------------------------------------

    @asynccontextmanager
    async def admission(
        self, name: str, device: str, resident: int, transient: int, *, wait: bool = True,
        colder_than: float | None = None, evict: bool = True,
        prewarm: Prewarming | None = None,
    ) -> AsyncIterator[None]:
        """Hold room for a load of model `name` (peak = resident + transient) while it runs.

        Evicts least-recently-used idle models as needed and, with `wait`, waits up to
        `memory_wait` for busy ones; raises ModelTooLarge or MemoryExhausted when the load
        cannot fit. `colder_than` (monotonic seconds) spares every model used since then: a
        replica added for a spike evicts only models colder than the spike. Without `evict`,
        it takes only free room (an optional upgrade must not cost another model its place).
        `prewarm` spares what a pre-warm must not evict (Prewarming).
        """
        device = self.device_key(device)
        budget = self.budgets[device]
        peak = resident + transient
        if peak > budget:
            what = "while loading" if transient else "resident"
            raise ModelTooLarge(
                f"model {name!r} is larger than the {device} budget: it needs "
                f"{format_bytes(peak)} {what} ({format_bytes(resident)} resident) and the "
                f"budget is {format_bytes(budget)}"
            )
        lock = self._locks.setdefault(device, asyncio.Lock())
        async with lock:
            if evict:
                await self._make_room(name, device, budget, peak, wait, colder_than,
                                      prewarm, resident)
            else:
                self._only_free_room(name, device, peak)
            self._reserved[device] = (name, peak)
            try:
                yield
            finally:
                del self._reserved[device]

    @asynccontextmanager
    async def side_room(self, name: str, device: str, needed: int) -> AsyncIterator[None]:
        """Hold `needed` bytes for background work of model `name` that measures nothing
        (writing a cache entry): only free room, at once, and without holding up loads,
        which count it as used while it lasts. Raises MemoryExhausted when there is none."""
        device = self.device_key(device)
        self._only_free_room(name, device, needed)
        self._side[device] = self._side.get(device, 0) + needed
        try:
            yield
        finally:
            self._side[device] -= needed
            self._events.publish(SideRoomReleased(name, device, needed))

    def _only_free_room(self, name: str, device: str, needed: int) -> None:
        """Raise MemoryExhausted unless `needed` fits beside what models hold and what is
        reserved (loads, background work) on `device`."""
        free = self.free(device)
        if needed > free:
            raise MemoryExhausted(
                f"{format_bytes(needed)} for model {name!r} does not fit in the free room on "
                f"{device} ({format_bytes(max(free, 0))})", retry_after=5.0)

    def _held(self, device: str) -> int:
        """What models hold on `device` and background work has in its side room: what a
        load must fit beside."""
        return self.used(device) + self._side.get(device, 0)

    async def _make_room(
        self, name: str, device: str, budget: int, peak: int, wait: bool,
        colder_than: float | None, prewarm: Prewarming | None = None, size: int = 0,
    ) -> None:
        waits = self.memory_wait if wait else 0.0
        deadline = self._clock() + waits
        while True:
            changed = self._events.changed()  # taken before looking, so no release is missed
            used = self._held(device)
            missing = shortfall(used, peak, budget)
            if missing == 0:
                return
            residents = self._residents(device, name, colder_than, prewarm, size)
            victims = self._victims(device, residents, missing)
            if victims:
                self._events.publish(Evicting(name, device, missing, tuple(victims)))
                await self._unload(victims, "memory_pressure")
                continue
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise MemoryExhausted(self._explain(name, device, budget, peak, residents,
                                                    waits if wait else None),
                                      retry_after=5.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    def _victims(self, device: str, residents: list[Resident], missing: int) -> list[str] | None:
        now = self._clock()
        if not self.cost_aware:
            return pick_victims(residents, missing, now, self.min_residency)
        victims, inflation = pick_victims_by_cost(residents, missing, now, self.min_residency,
                                                  self._inflation.get(device, 0.0))
        self._inflation[device] = inflation
        return victims

    def _residents(
        self, device: str, exclude: str | None, colder_than: float | None = None,
        prewarm: Prewarming | None = None, size: int = 0,
    ) -> list[Resident]:
        now = self._clock()
        inflation = self._inflation.get(device, 0.0)
        clocks: dict[str, tuple[float, float]] = {}  # the models still here: no growth
        found = []
        for tenant in self._tenants():
            if tenant.name == exclude:
                continue
            resident = tenant.resident(now, device)
            if resident is None:
                continue
            if colder_than is not None and not resident.holds \
                    and resident.last_used >= colder_than:
                resident = replace(resident, holds="used since the spike")
            if self.cost_aware:  # Greedy-Dual's clock at the model's last use
                seen = self._clocks.get(device, {}).get(tenant.name)
                if seen is None or seen[0] != resident.last_used:
                    seen = (resident.last_used, inflation)
                clocks[tenant.name] = seen
                resident = replace(resident, clock=seen[1])
            found.append(resident)
        if self.cost_aware:
            self._clocks[device] = clocks
        if prewarm is not None:
            found = prewarm.spare(found, size, inflation if self.cost_aware else None)
        return found

    def _explain(
        self, name: str, device: str, budget: int, peak: int,
        residents: Sequence[Resident], waited: float | None,
    ) -> str:
        held = [(r.name, r.bytes, r.holds or "idle")
                for r in sorted(residents, key=lambda r: -r.bytes)]
        used = self.used(device)
        own = used - sum(r.bytes for r in residents)  # the model's own replicas
        if own > 0:
            held.insert(0, (name, own, "its own replicas"))
        side = self._side.get(device, 0)
        if side:
            held.append(("background work", side, "writing a cache entry"))
        holders = ", ".join(f"{who} ({format_bytes(size)}, {why})"
                            for who, size, why in held) or "nothing"
        return (
            f"not enough memory on {device} for model {name!r}: it needs "
            f"{format_bytes(peak)}, the budget is {format_bytes(budget)} and "
            f"{format_bytes(self._held(device))} is held by {holders}"
            + (f"; waited {waited:g}s for memory to be released" if waited is not None
               else "; an added replica does not wait for memory")
        )

    async def _unload(self, names: Iterable[str], reason: str) -> None:
        wanted = set(names)
        victims = [t for t in self._tenants() if t.name in wanted]
        await asyncio.gather(*(victim.unload(reason) for victim in victims))

    # --- reactive protection --------------------------------------------------------------

    async def relieve_oom(self, name: str, device: str, phase: str, error: str) -> int:
        """After an out-of-memory error of model `name` while it loaded or ran (`phase`):
        unload every idle model on its device but itself. Returns how many were unloaded."""
        device = self.device_key(device)
        idle = tuple(r.name for r in self._residents(device, exclude=name) if not r.holds)
        self._events.publish(OomRetry(name, device, phase, error, idle))
        await self._unload(idle, "oom")
        return len(idle)

    def snapshot(self) -> tuple[DeviceSnapshot, ...]:
        return tuple(
            DeviceSnapshot(
                name=device,
                total_bytes=self.probe.total(device),
                budget_bytes=budget,
                used_bytes=self.used(device),
                reserved_bytes=self.reserved(device),
                process_bytes=self.probe.used(device),
            )
            for device, budget in self.budgets.items()
        )
