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
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from snoozeml.config import ModelConfig, ServerConfig
from snoozeml.engine.probes import MemoryProbe
from snoozeml.errors import MemoryExhausted, ModelTooLarge
from snoozeml.logs import log_event
from snoozeml.units import format_bytes

# --- pure policies ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resident:
    """What eviction needs to know about one model holding memory on a device."""

    name: str
    bytes: int
    last_used: float  # monotonic seconds
    loaded_at: float  # monotonic seconds
    holds: str  # "" when evictable, else why not: "busy", "pinned", "loading", "unloading"


def pick_victims(
    residents: Iterable[Resident], needed: int, now: float, min_residency: float
) -> list[str] | None:
    """Names to unload, least recently used first, freeing at least `needed` bytes; None when
    even every evictable model would not free enough (then nothing should be evicted).

    Churn guard: a model loaded less than `min_residency` ago goes only after every older one.
    """
    if needed <= 0:
        return []
    evictable = [r for r in residents if not r.holds]
    evictable.sort(key=lambda r: (now - r.loaded_at < min_residency, r.last_used))
    chosen: list[str] = []
    freed = 0
    for resident in evictable:
        chosen.append(resident.name)
        freed += resident.bytes
        if freed >= needed:
            return chosen
    return None


def budget_bytes(budget: float | int, total: int) -> int:
    """A budget as bytes: a float is a share of `total`, an int is absolute."""
    return int(total * budget) if isinstance(budget, float) else int(budget)


def shortfall(used: int, needed: int, budget: int) -> int:
    """Bytes that must be freed before `needed` more fits beside `used` (0 if it fits)."""
    return max(used + needed - budget, 0)


# --- sizes --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileSizes:
    weights: int  # every file the model loads
    transient: int  # extra bytes held only while loading (onnx: the .onnx protobuf itself)


def file_sizes_blocking(spec: ModelConfig) -> FileSizes:
    """Sizes from the model's files, without loading weights."""
    path = spec.path
    if spec.format == "onnx":
        size = path.stat().st_size
        return FileSizes(size + _onnx_external_bytes(path, size), size)
    files = [path] if path.is_file() else [
        p for p in path.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt", ".pth")
    ]
    return FileSizes(sum(p.stat().st_size for p in files if p.is_file()), 0)


_EXTERNAL_SCAN_LIMIT = 64 * 1024 * 1024


def _onnx_external_bytes(path: Path, size: int) -> int:
    """Bytes in external data files the model references. Large .onnx files hold their own
    weights (reading their structure would cost as much as loading), so only small ones are
    scanned."""
    if size > _EXTERNAL_SCAN_LIMIT:
        return 0
    try:
        import onnx
        from onnx.external_data_helper import _get_all_tensors, uses_external_data

        proto = onnx.load(str(path), load_external_data=False)
        names = {
            entry.value
            for tensor in _get_all_tensors(proto) if uses_external_data(tensor)
            for entry in tensor.external_data if entry.key == "location"
        }
    except Exception:  # an unreadable file fails at load with its own message
        return 0
    return sum((path.parent / n).stat().st_size for n in names if (path.parent / n).is_file())


# --- the manager --------------------------------------------------------------------------


class Tenant(Protocol):
    """What the memory manager sees of a model (engine/model.py's Model)."""

    name: str
    spec: ModelConfig
    device: str

    def resident_bytes(self) -> int | None: ...

    def resident(self, now: float) -> Resident | None: ...

    async def unload(self, reason: str) -> None: ...


class MemoryManager:
    def __init__(
        self,
        server: ServerConfig,
        probe: MemoryProbe,
        tenants: Callable[[], Iterable[Tenant]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        memory = server.memory
        self.probe = probe
        self.memory_wait = memory.memory_wait
        self.min_residency = memory.min_residency
        self.default_factor = memory.memory_factor
        self.budgets: dict[str, int] = {"cpu": budget_bytes(memory.host_budget,
                                                            probe.total("cpu"))}
        for gpu in probe.gpus():
            self.budgets[gpu] = budget_bytes(memory.gpu_budget, probe.total(gpu))
        self._tenants = tenants
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._measure_locks: dict[str, asyncio.Lock] = {}
        self._reserved: dict[str, tuple[str, int]] = {}  # device -> (model, bytes)
        self._freed = asyncio.Event()
        self.evictions: dict[str, int] = {}

    # --- accounting -----------------------------------------------------------------------

    def notify_freed(self) -> None:
        """A lease ended or an unload finished: admissions waiting for memory look again."""
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()

    def device_of(self, tenant: Tenant) -> str:
        return self.device_key(tenant.device)

    def used(self, device: str, exclude: str | None = None) -> int:
        """Bytes held by models on `device` (loaded or still unloading)."""
        total = 0
        for tenant in self._tenants():
            if tenant.name != exclude and self.device_of(tenant) == device:
                total += tenant.resident_bytes() or 0
        return total

    def measuring(self, device: str) -> asyncio.Lock:
        """Held around an unload's before/after reading, so unloads running together (at
        shutdown, or evicting two victims) each report only what they freed."""
        return self._measure_locks.setdefault(self.device_key(device), asyncio.Lock())

    def device_key(self, device: str) -> str:
        return device if device in self.budgets else "cpu"

    def reserved(self, device: str) -> int:
        entry = self._reserved.get(device)
        return entry[1] if entry else 0

    def predicted(self, spec: ModelConfig, sizes: FileSizes) -> int:
        factor = spec.memory_factor if spec.memory_factor is not None else self.default_factor
        return int(sizes.weights * factor)

    # --- admission ------------------------------------------------------------------------

    @asynccontextmanager
    async def admission(
        self, tenant: Tenant, resident: int, transient: int
    ) -> AsyncIterator[None]:
        """Hold room for a load of `tenant` (peak = resident + transient) while it runs.

        Evicts least-recently-used idle models as needed and waits up to `memory_wait` for
        busy ones; raises ModelTooLarge or MemoryExhausted when the load cannot fit.
        """
        device = self.device_of(tenant)
        budget = self.budgets[device]
        peak = resident + transient
        if peak > budget:
            what = "while loading" if transient else "resident"
            raise ModelTooLarge(
                f"model {tenant.name!r} is larger than the {device} budget: it needs "
                f"{format_bytes(peak)} {what} ({format_bytes(resident)} resident) and the "
                f"budget is {format_bytes(budget)}"
            )
        lock = self._locks.setdefault(device, asyncio.Lock())
        async with lock:
            await self._make_room(tenant, device, budget, peak)
            self._reserved[device] = (tenant.name, peak)
            try:
                yield
            finally:
                del self._reserved[device]

    async def _make_room(self, tenant: Tenant, device: str, budget: int, peak: int) -> None:
        deadline = self._clock() + self.memory_wait
        while True:
            freed = self._freed  # taken before looking, so no release is missed
            used = self.used(device, exclude=tenant.name)
            missing = shortfall(used, peak, budget)
            if missing == 0:
                return
            residents = self._residents(device, exclude=tenant.name)
            victims = pick_victims(residents, missing, self._clock(), self.min_residency)
            if victims:
                log_event("memory_evicting", model=tenant.name, device=device,
                          needed_bytes=missing, victims=",".join(victims))
                await self._unload(victims, "memory_pressure")
                continue
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise MemoryExhausted(self._explain(tenant, device, budget, peak, used,
                                                    residents), retry_after=5.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), remaining)

    def _residents(self, device: str, exclude: str | None) -> list[Resident]:
        now = self._clock()
        found = []
        for tenant in self._tenants():
            if tenant.name == exclude or self.device_of(tenant) != device:
                continue
            resident = tenant.resident(now)
            if resident is not None:
                found.append(resident)
        return found

    def _explain(
        self, tenant: Tenant, device: str, budget: int, peak: int, used: int,
        residents: Sequence[Resident],
    ) -> str:
        holders = ", ".join(
            f"{r.name} ({format_bytes(r.bytes)}, {r.holds or 'idle'})"
            for r in sorted(residents, key=lambda r: -r.bytes)
        ) or "nothing"
        return (
            f"not enough memory on {device} for model {tenant.name!r}: it needs "
            f"{format_bytes(peak)}, the budget is {format_bytes(budget)} and "
            f"{format_bytes(used)} is held by {holders}; waited {self.memory_wait:g}s for "
            "memory to be released"
        )

    async def _unload(self, names: Iterable[str], reason: str) -> None:
        wanted = set(names)
        victims = [t for t in self._tenants() if t.name in wanted]
        if victims:
            self.evictions[reason] = self.evictions.get(reason, 0) + len(victims)
        await asyncio.gather(*(victim.unload(reason) for victim in victims))

    # --- reactive protection --------------------------------------------------------------

    async def relieve_oom(self, tenant: Tenant) -> int:
        """After an out-of-memory error: unload every idle model on the tenant's device but
        the tenant itself. Returns how many were unloaded."""
        device = self.device_of(tenant)
        idle = [r.name for r in self._residents(device, exclude=tenant.name) if not r.holds]
        log_event("memory_oom", logging.WARNING, model=tenant.name, device=device,
                  evicting=",".join(idle) or "nothing")
        await self._unload(idle, "oom")
        return len(idle)

    def status(self) -> list[dict[str, object]]:
        devices = []
        for device, budget in self.budgets.items():
            devices.append({
                "name": device,
                "total_bytes": self.probe.total(device),
                "budget_bytes": budget,
                "used_bytes": self.used(device),
                "reserved_bytes": self.reserved(device),
                "process_bytes": self.probe.used(device),
            })
        return devices
