"""Memory management without a daemon: the pure policies (pick_victims, budget_bytes,
shortfall), the admission arithmetic of MemoryManager against a fake memory probe (the one
injected piece; GPU devices included), and reactive OOM relief. (How backends size a
model's files, pick its device and recognise out of memory: tests/unit/runtime/.)

Tenants here are small fakes of engine/model.py's Model: what the memory manager sees of a
model (name, spec, device, bytes held, lease state) and an `unload` that records its reason.
Every scenario runs in its own event loop (asyncio.run); none waits on a clock.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fake_probe import FakeProbe
from onnx_models import write_mlp

from snoozeml.config.settings import MemoryConfig, ModelConfig, ServerConfig
from snoozeml.engine.events import EventBus, ModelIdle
from snoozeml.engine.memory.budgets import MemoryManager
from snoozeml.engine.memory.victims import Prewarming, Resident
from snoozeml.engine.observe.counters import Counters
from snoozeml.engine.observe.snapshots import DeviceSnapshot
from snoozeml.errors import MemoryExhausted, ModelTooLarge
from snoozeml.runtime.base import FileSizes

GiB = 2**30
T = TypeVar("T")


def run(scenario: Coroutine[Any, Any, T]) -> T:
    """One scenario in a fresh event loop (pytest-asyncio is not used here)."""
    return asyncio.run(scenario)


NOW = 1000.0


# --- fake tenants (the fake probe: tests/support/fake_probe.py) -----------------------------------


@dataclass
class FakeTenant:
    """What MemoryManager sees of a model. `holds` is "" (idle), "busy", "pinned", ..."""

    name: str
    size: int
    device: str = "cpu"
    last_used: float = 0.0
    loaded_at: float = -100.0
    holds: str = ""
    loaded: bool = True
    memory_factor: float | None = None
    unloads: list[str] = field(default_factory=list)
    looked: asyncio.Event | None = None  # set whenever admission looks at this tenant
    load_s: float = 0.0  # what cost-aware eviction reads
    uses: int = 0

    @property
    def spec(self) -> ModelConfig:
        return ModelConfig(name=self.name, path=Path(f"{self.name}.onnx"), format="onnx",
                           device=self.device, memory_factor=self.memory_factor)

    # The budget its device counts against; manager_for sets the manager's own mapping, as
    # ModelManager does for each replica's placement.
    key: Callable[[str], str] = str

    def resident_on(self, device: str) -> int:
        return self.size if self.loaded and self.key(self.device) == device else 0

    def resident(self, now: float, device: str) -> Resident | None:
        if self.looked is not None:
            self.looked.set()
        if not self.resident_on(device):
            return None
        return Resident(self.name, self.size, self.last_used, self.loaded_at, self.holds,
                        load_s=self.load_s, uses=self.uses)

    async def unload(self, reason: str) -> None:
        self.unloads.append(reason)
        self.loaded = False


def manager_for(
    tenants: Iterable[FakeTenant],
    probe: FakeProbe | None = None,
    clock: float = NOW,
    cost_aware: bool = False,
    **memory: Any,
) -> MemoryManager:
    """A MemoryManager over `tenants` (a live list: tenants added later count too), with a
    frozen clock. Budgets default to 1000 bytes of host memory and 90% of each GPU."""
    settings: dict[str, Any] = {"host_budget": 1000, "memory_wait": 0, "min_residency": 2.0}
    settings.update(memory)
    server = ServerConfig(memory=MemoryConfig(**settings))
    roster = tenants if isinstance(tenants, list) else list(tenants)
    bus = EventBus()
    manager = MemoryManager(server, probe or FakeProbe(host_total=10_000), lambda: roster, bus,
                            clock=lambda: clock, cost_aware=cost_aware)
    for tenant in roster:
        tenant.key = manager.device_key
    _watch(manager, bus)
    return manager


class Watched:
    """The bus a manager publishes on, and the evictions it reported there (counted by the
    same subscriber that feeds /admin/status)."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.counters = Counters([])
        self.counters.subscribe(bus)


_WATCHED: weakref.WeakKeyDictionary[MemoryManager, Watched] = weakref.WeakKeyDictionary()


def _watch(manager: MemoryManager, bus: EventBus) -> None:
    _WATCHED[manager] = Watched(bus)


def evictions(manager: MemoryManager) -> dict[str, int]:
    return _WATCHED[manager].counters.evictions


def lease_ended(manager: MemoryManager, tenant: FakeTenant) -> None:
    """What a model publishes when its last lease ends (Model._release)."""
    _WATCHED[manager].bus.publish(ModelIdle(tenant.name))


async def admit(manager: MemoryManager, tenant: FakeTenant, resident: int,
                transient: int = 0) -> None:
    """Pass admission for a load and 'load': the tenant then holds `resident` bytes."""
    async with manager.admission(tenant.name, tenant.device, resident, transient):
        pass
    tenant.size = resident
    tenant.loaded = True


GPU_PROBE = FakeProbe(host_total=10_000, gpu_totals={"cuda:0": 2000, "cuda:1": 4000})


# --- budgets per device ----------------------------------------------------------------------

def test_budgets_cover_the_host_and_every_gpu_the_probe_reports() -> None:
    manager = manager_for([], GPU_PROBE, host_budget=0.5, gpu_budget=0.9)
    assert manager.budgets == {"cpu": 5000, "cuda:0": 1800, "cuda:1": 3600}


def test_absolute_budgets_apply_to_each_device() -> None:
    manager = manager_for([], GPU_PROBE, host_budget="3KiB", gpu_budget="1KiB")
    assert manager.budgets == {"cpu": 3072, "cuda:0": 1024, "cuda:1": 1024}


def test_without_gpus_only_the_host_has_a_budget() -> None:
    manager = manager_for([], FakeProbe(host_total=8 * GiB), host_budget="80%")
    assert manager.budgets == {"cpu": int(8 * GiB * 0.8)}


def test_a_model_on_a_device_without_a_budget_counts_against_the_host() -> None:
    on_missing_gpu = FakeTenant("elsewhere", 300, device="cuda:7")
    on_mps = FakeTenant("mac", 200, device="mps")
    on_gpu = FakeTenant("gpu", 100, device="cuda:0")
    manager = manager_for([on_missing_gpu, on_mps, on_gpu], GPU_PROBE)
    assert manager.device_key(on_missing_gpu.device) == "cpu"
    assert manager.used("cpu") == 500
    assert manager.used("cuda:0") == 100
    assert manager.used("cuda:1") == 0


def test_predicted_size_is_the_files_times_the_memory_factor() -> None:
    manager = manager_for([], memory_factor=1.5)
    sizes = FileSizes(weights=1000, transient=800)
    assert manager.predicted(FakeTenant("default", 0).spec, sizes) == 1500
    assert manager.predicted(FakeTenant("own", 0, memory_factor=2.0).spec, sizes) == 2000


# --- admission ---------------------------------------------------------------------------------

def test_a_load_that_fits_is_admitted_without_evicting_anyone() -> None:
    old = FakeTenant("old", 400)
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([old, new])

    run(admit(manager, new, resident=350, transient=250))  # 400 + 600 = 1000: an exact fit

    assert old.unloads == []
    assert evictions(manager) == {}


def test_admission_reserves_the_load_peak_while_the_load_runs() -> None:
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([new])

    async def scenario() -> list[object]:
        async with manager.admission(new.name, new.device, 300, 200):
            return [manager.reserved("cpu"), manager.snapshot()[0].reserved_bytes]

    assert run(scenario()) == [500, 500]
    assert manager.reserved("cpu") == 0
    assert manager.snapshot()[0].reserved_bytes == 0


def test_the_load_peak_not_only_the_resident_size_must_fit() -> None:
    # 400 held; the new model stays at 300 but peaks at 700 while loading: 1100 > 1000.
    old = FakeTenant("old", 400)
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([old, new])

    run(admit(manager, new, resident=300, transient=400))

    assert old.unloads == ["memory_pressure"]


def test_without_evict_only_free_room_is_taken_and_nobody_is_evicted() -> None:
    idle = FakeTenant("idle", 600, last_used=100.0)
    upgrading = FakeTenant("upgrading", 200)
    manager = manager_for([idle, upgrading])

    async def scenario(needs: int) -> int:
        async with manager.admission(upgrading.name, upgrading.device, 0, needs, wait=False,
                                     evict=False):
            return manager.reserved("cpu")

    assert run(scenario(200)) == 200  # 800 held + 200: fits
    with pytest.raises(MemoryExhausted, match="does not fit in the free room"):
        run(scenario(201))
    assert idle.unloads == []
    assert evictions(manager) == {}
    assert manager.reserved("cpu") == 0


def test_background_side_room_counts_as_used_without_holding_up_loads() -> None:
    idle = FakeTenant("idle", 300, last_used=100.0)
    writer = FakeTenant("writer", 200, last_used=900.0)
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([idle, writer, new])

    async def scenario() -> list[object]:
        async with manager.side_room(writer.name, writer.device, 400):  # 500 + 400 held
            seen: list[object] = [manager.reserved("cpu")]
            with pytest.raises(MemoryExhausted, match="does not fit in the free room"):
                async with manager.side_room(writer.name, writer.device, 101):
                    pass
            # A load goes ahead beside it (no wait for the background work to end), and
            # makes room as if the side room were used: 900 + 200 needs the idle model gone.
            async with manager.admission(new.name, new.device, 150, 50):
                seen.append(manager.reserved("cpu"))
            return seen

    assert run(scenario()) == [400, 600]
    assert idle.unloads == ["memory_pressure"]
    assert manager.reserved("cpu") == 0


def test_a_load_waiting_for_memory_goes_ahead_when_background_side_room_is_released() -> None:
    writer = FakeTenant("writer", 200, holds="pinned")
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([writer, new], memory_wait=3600)

    async def scenario() -> str:
        held, release = asyncio.Event(), asyncio.Event()

        async def background() -> None:
            async with manager.side_room(writer.name, writer.device, 500):
                held.set()
                await release.wait()

        task = asyncio.get_running_loop().create_task(background())
        await held.wait()
        writer.looked = asyncio.Event()
        load = asyncio.get_running_loop().create_task(admit(manager, new, resident=400))
        await writer.looked.wait()  # the load looked: 200 + 500 held, 400 more does not fit
        assert not load.done()
        release.set()
        await task
        await asyncio.wait_for(load, 10)  # woken by the release (memory_wait is an hour)
        return f"{manager.used('cpu')} {manager.reserved('cpu')}"

    assert run(scenario()) == "600 0"


def test_the_least_recently_used_idle_model_on_the_device_is_evicted() -> None:
    recent = FakeTenant("recent", 300, last_used=900.0)
    oldest = FakeTenant("oldest", 300, last_used=100.0)
    middle = FakeTenant("middle", 300, last_used=500.0)
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([recent, oldest, middle, new])

    run(admit(manager, new, resident=200))  # 900 + 200: 100 short

    assert oldest.unloads == ["memory_pressure"]
    assert recent.unloads == middle.unloads == []
    assert evictions(manager) == {"memory_pressure": 1}
    assert manager.used("cpu") == 800


def test_as_many_models_are_evicted_as_the_load_needs_oldest_first() -> None:
    tenants = [FakeTenant(f"m{i}", 250, last_used=float(i)) for i in range(4)]
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([*tenants, new])

    run(admit(manager, new, resident=300, transient=200))  # needs 500 of the 1000 held

    assert [t.name for t in tenants if t.unloads] == ["m0", "m1"]
    assert evictions(manager) == {"memory_pressure": 2}


def test_the_churn_guard_spares_a_just_loaded_model_while_an_older_one_can_go() -> None:
    just_loaded = FakeTenant("just-loaded", 500, last_used=10.0, loaded_at=NOW - 0.5)
    settled = FakeTenant("settled", 500, last_used=NOW - 1.0, loaded_at=NOW - 60.0)
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([just_loaded, settled, new], min_residency=2.0)

    run(admit(manager, new, resident=400))

    assert settled.unloads == ["memory_pressure"]
    assert just_loaded.unloads == []


def test_a_gpu_load_evicts_only_models_on_that_gpu() -> None:
    # The host models are the least recently used of all, and the host is full too: a load on
    # cuda:0 must still take its room from cuda:0 alone.
    host_old = FakeTenant("host-old", 4000, last_used=1.0)
    host_older = FakeTenant("host-older", 4000, last_used=0.5)
    gpu0_old = FakeTenant("gpu0-old", 1000, device="cuda:0", last_used=50.0)
    gpu0_new = FakeTenant("gpu0-new", 700, device="cuda:0", last_used=60.0)
    gpu1_old = FakeTenant("gpu1-old", 3000, device="cuda:1", last_used=2.0)
    new = FakeTenant("new", 0, device="cuda:0", loaded=False)
    tenants = [host_old, host_older, gpu0_old, gpu0_new, gpu1_old, new]
    manager = manager_for(tenants, GPU_PROBE, host_budget=0.8, gpu_budget=0.9)
    # cuda:0 budget 1800, holding 1700: a 500-byte load is 400 short.

    run(admit(manager, new, resident=500))

    assert gpu0_old.unloads == ["memory_pressure"]
    assert [t.name for t in tenants if t.unloads] == ["gpu0-old"]
    assert manager.used("cuda:0") == 1200
    assert manager.used("cpu") == 8000


def test_a_host_load_never_evicts_gpu_models() -> None:
    gpu = FakeTenant("gpu", 1800, device="cuda:1", last_used=0.0)
    host = FakeTenant("host", 600, last_used=10.0)
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([gpu, host, new], GPU_PROBE)

    run(admit(manager, new, resident=500))

    assert host.unloads == ["memory_pressure"]
    assert gpu.unloads == []


def test_a_model_larger_than_the_whole_budget_is_too_large_and_evicts_nobody() -> None:
    idle = FakeTenant("idle", 500)
    new = FakeTenant("huge", 0, loaded=False)
    manager = manager_for([idle, new])

    with pytest.raises(ModelTooLarge) as info:
        run(admit(manager, new, resident=600, transient=500))

    message = info.value.message
    assert "'huge' is larger than the cpu budget" in message
    assert "1.1KiB while loading" in message  # the peak: 600 + 500 = 1100 bytes
    assert "600B resident" in message
    assert "budget is 1000B" in message
    assert idle.unloads == []
    assert evictions(manager) == {}


def test_a_gpu_model_too_large_for_its_gpu_names_that_gpu() -> None:
    new = FakeTenant("big", 0, device="cuda:1", loaded=False)
    manager = manager_for([new], GPU_PROBE, gpu_budget="2KiB")

    with pytest.raises(ModelTooLarge, match=r"larger than the cuda:1 budget.*2\.0KiB"):
        run(admit(manager, new, resident=3000))


def test_when_only_busy_and_pinned_models_hold_memory_admission_is_refused_with_reasons() -> None:
    pinned = FakeTenant("encoder", 500, device="cuda:1", holds="pinned")
    busy = FakeTenant("ranker", 3000, device="cuda:1", holds="busy")
    idle_small = FakeTenant("tiny", 50, device="cuda:1")  # idle, but too small to help
    host_idle = FakeTenant("host", 900)  # idle, but on another device
    new = FakeTenant("new", 0, device="cuda:1", loaded=False)
    tenants = [pinned, busy, idle_small, host_idle, new]
    manager = manager_for(tenants, GPU_PROBE, gpu_budget=1.0, memory_wait=0)
    # cuda:1 budget 4000, holding 3550: a 600-byte load is 150 short, 50 of it evictable.

    with pytest.raises(MemoryExhausted) as info:
        run(admit(manager, new, resident=600))

    error = info.value
    assert error.retry_after > 0
    assert error.message == (
        "not enough memory on cuda:1 for model 'new': it needs 600B, the budget is 3.9KiB "
        "and 3.5KiB is held by ranker (2.9KiB, busy), encoder (500B, pinned), tiny (50B, idle); "
        "waited 0s for memory to be released"
    )
    assert [t.name for t in tenants if t.unloads] == []  # no partial eviction
    assert manager.reserved("cuda:1") == 0


def test_admission_waits_for_a_lease_to_end_and_then_evicts_the_model() -> None:
    busy = FakeTenant("busy", 800, holds="busy")
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([busy, new], memory_wait=3600)  # the clock is frozen: only a release

    async def scenario() -> list[str]:
        busy.looked = asyncio.Event()
        load = asyncio.create_task(admit(manager, new, resident=500))
        await busy.looked.wait()  # admission has seen the busy model and found no victim
        assert not load.done()
        assert busy.unloads == []
        busy.holds = ""  # the lease ends...
        lease_ended(manager, busy)  # ...and the model says so, as Model._release does
        await asyncio.wait_for(load, 60)  # a guard against a hang, not a measurement
        return busy.unloads

    assert run(scenario()) == ["memory_pressure"]
    assert new.loaded


def test_admission_gives_up_after_memory_wait_when_no_lease_ends() -> None:
    busy = FakeTenant("busy", 800, holds="busy")
    new = FakeTenant("new", 0, loaded=False)
    now = [0.0]
    server = ServerConfig(memory=MemoryConfig(host_budget=1000, memory_wait=5))
    bus = EventBus()
    manager = MemoryManager(server, FakeProbe(10_000), lambda: [busy, new], bus,
                            clock=lambda: now[0])
    _watch(manager, bus)

    async def scenario() -> None:
        busy.looked = asyncio.Event()
        load = asyncio.create_task(admit(manager, new, resident=500))
        await busy.looked.wait()
        # Something unrelated freed memory once memory_wait had passed: admission looks
        # again, finds the model still busy, and gives up.
        now[0] = 5.0
        bus.publish(ModelIdle("elsewhere"))
        await load

    with pytest.raises(MemoryExhausted, match=r"busy \(800B, busy\); waited 5s"):
        run(scenario())
    assert busy.unloads == []


def test_two_loads_on_one_device_are_admitted_one_at_a_time() -> None:
    # Both need 600 of a 1000-byte budget: the second is admitted only after the first has
    # loaded, and must then make room by evicting it.
    first = FakeTenant("first", 0, loaded=False)
    second = FakeTenant("second", 0, loaded=False)
    manager = manager_for([first, second])
    order: list[str] = []

    async def load(tenant: FakeTenant, admitted: asyncio.Event, finish: asyncio.Event) -> None:
        async with manager.admission(tenant.name, tenant.device, 600, 0):
            order.append(f"{tenant.name} admitted")
            admitted.set()
            await finish.wait()
            tenant.size, tenant.loaded = 600, True
        order.append(f"{tenant.name} loaded")

    async def scenario() -> None:
        first_admitted, first_finish = asyncio.Event(), asyncio.Event()
        second_admitted, second_finish = asyncio.Event(), asyncio.Event()
        loads = [
            asyncio.create_task(load(first, first_admitted, first_finish)),
            asyncio.create_task(load(second, second_admitted, second_finish)),
        ]
        await first_admitted.wait()
        for _ in range(10):  # chances for the second load to overtake, which it must not take
            await asyncio.sleep(0)
        assert order == ["first admitted"]
        assert manager.reserved("cpu") == 600
        first_finish.set()
        await second_admitted.wait()
        second_finish.set()
        await asyncio.gather(*loads)

    run(scenario())
    assert order == ["first admitted", "first loaded", "second admitted", "second loaded"]
    assert first.unloads == ["memory_pressure"]
    assert manager.used("cpu") == 600


def test_loads_on_different_devices_do_not_wait_for_each_other() -> None:
    host = FakeTenant("host", 0, loaded=False)
    gpu = FakeTenant("gpu", 0, device="cuda:0", loaded=False)
    manager = manager_for([host, gpu], GPU_PROBE)

    async def scenario() -> tuple[int, int]:
        async with manager.admission(host.name, host.device, 900, 0), \
                manager.admission(gpu.name, gpu.device, 1000, 0):
            return manager.reserved("cpu"), manager.reserved("cuda:0")

    assert run(scenario()) == (900, 1000)


def test_a_models_loaded_replicas_count_against_its_next_load_and_it_never_evicts_itself(
) -> None:
    # A model holding 700 bytes asks for another 900 (a second replica): 1600 > 1000, and its
    # own replicas are not its victims. (A model reloading from scratch holds nothing: it reports
    # no resident bytes while it is not loaded.)
    itself = FakeTenant("itself", 700)
    manager = manager_for([itself])

    with pytest.raises(MemoryExhausted, match="'itself'"):
        run(admit(manager, itself, resident=900))

    assert itself.unloads == []


# --- reactive OOM relief ---------------------------------------------------------------------

def test_relieve_oom_unloads_only_idle_models_on_the_device_with_reason_oom() -> None:
    failing = FakeTenant("failing", 300, holds="busy")
    idle_a = FakeTenant("idle-a", 100)
    idle_b = FakeTenant("idle-b", 100, loaded_at=NOW - 0.1)  # young models go too: this is OOM
    busy = FakeTenant("busy", 100, holds="busy")
    pinned = FakeTenant("pinned", 100, holds="pinned")
    unloading = FakeTenant("unloading", 100, holds="unloading")
    cold = FakeTenant("cold", 100, loaded=False)
    gpu_idle = FakeTenant("gpu-idle", 100, device="cuda:0")
    tenants = [failing, idle_a, idle_b, busy, pinned, unloading, cold, gpu_idle]
    manager = manager_for(tenants, GPU_PROBE)

    freed = run(manager.relieve_oom(failing.name, failing.device, "run", "out of memory"))

    assert freed == 2
    assert {t.name: t.unloads for t in tenants if t.unloads} == {
        "idle-a": ["oom"], "idle-b": ["oom"],
    }
    assert evictions(manager) == {"oom": 2}


def test_relieve_oom_on_a_gpu_leaves_the_host_alone() -> None:
    failing = FakeTenant("failing", 300, device="cuda:1", holds="busy")
    gpu_idle = FakeTenant("gpu1-idle", 100, device="cuda:1")
    other_gpu_idle = FakeTenant("gpu0-idle", 100, device="cuda:0")
    host_idle = FakeTenant("host-idle", 100)
    tenants = [failing, gpu_idle, other_gpu_idle, host_idle]
    manager = manager_for(tenants, GPU_PROBE)

    assert run(manager.relieve_oom(failing.name, failing.device, "run", "out of memory")) == 1
    assert [t.name for t in tenants if t.unloads] == ["gpu1-idle"]


def test_relieve_oom_with_nothing_idle_unloads_nothing() -> None:
    failing = FakeTenant("failing", 300, holds="busy")
    pinned = FakeTenant("pinned", 100, holds="pinned")
    manager = manager_for([failing, pinned])

    assert run(manager.relieve_oom(failing.name, failing.device, "run", "out of memory")) == 0
    assert pinned.unloads == []
    assert evictions(manager).get("oom", 0) == 0


def test_the_snapshot_lists_every_device_with_budget_use_and_process_memory() -> None:
    probe = FakeProbe(host_total=10_000, gpu_totals={"cuda:0": 2000, "cuda:1": 4000})
    probe.process.update({"cpu": 7000, "cuda:0": 300})
    tenants = [FakeTenant("host", 400), FakeTenant("gpu", 250, device="cuda:0")]
    manager = manager_for(tenants, probe, gpu_budget=0.5)

    assert manager.snapshot() == (
        DeviceSnapshot("cpu", total_bytes=10_000, budget_bytes=1000, used_bytes=400,
                       reserved_bytes=0, process_bytes=7000),
        DeviceSnapshot("cuda:0", total_bytes=2000, budget_bytes=1000, used_bytes=250,
                       reserved_bytes=0, process_bytes=300),
        DeviceSnapshot("cuda:1", total_bytes=4000, budget_bytes=2000, used_bytes=0,
                       reserved_bytes=0, process_bytes=0),
    )


# --- admission with real models ------------------------------------------------------------------

def test_a_freshly_loaded_model_is_not_evicted_before_the_request_that_loaded_it(
    tmp_path: Path,
) -> None:
    # Two cold models requested at once under a budget for one: the second load waits for the
    # first (one admission per device). When the first finishes, its request has not yet taken
    # its lease; the second must not evict it then, or the first request reloads it, evicting
    # the second before *its* request takes a lease, and so on for ever.
    from snoozeml.config.settings import parse_config
    from snoozeml.engine.model import Model
    from snoozeml.engine.registry import ModelManager
    from snoozeml.engine.service import InferenceService

    for i, name in enumerate(("first", "second")):
        write_mlp(tmp_path / f"{name}.onnx", seed=i)
    size = (tmp_path / "first.onnx").stat().st_size
    # Each resident model is predicted at 1.1 x its file and peaks at 2.1 x while loading:
    # one resident beside a load needs 3.2 x, and the budget is 2.5 x.
    config = parse_config({
        "server": {"memory": {"host_budget": int(size * 2.5), "memory_wait": 3600}},
        # The default load (no weights cache, whose entry would be written beside it).
        "models": [{"name": name, "path": f"{name}.onnx", "device": "cpu",
                    "idle_timeout": 300, "weights_cache": False}  # None would pin
                   for name in ("first", "second")],
    }, source=tmp_path / "models.toml")

    async def hold(model: Model, taken: asyncio.Event, end: asyncio.Event) -> None:
        async with model.lease():
            taken.set()
            await end.wait()

    async def scenario() -> InferenceService:
        service = InferenceService(ModelManager(config, probe=FakeProbe(host_total=10 * GiB)))
        models = list(service.manager.models.values())
        taken = {model.name: asyncio.Event() for model in models}
        end = {model.name: asyncio.Event() for model in models}
        holders = [asyncio.create_task(hold(m, taken[m.name], end[m.name])) for m in models]
        # Either load may reach the device first (each reads its files on the loader threads
        # before asking for memory); the other waits for the winner's lease to end.
        # The timeouts guard against the ping-pong, not timing.
        waits = {asyncio.create_task(event.wait()): name for name, event in taken.items()}
        done, pending = await asyncio.wait(waits, timeout=30,
                                           return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        winner = service.manager.models[waits[done.pop()]]
        other = next(m for m in models if m is not winner)
        assert winner.in_flight == 1
        assert other.state.value == "LOADING"  # waiting for the winner's lease to end
        end[winner.name].set()
        await asyncio.wait_for(taken[other.name].wait(), 30)
        end[other.name].set()
        await asyncio.gather(*holders, *pending)
        await service.manager.shutdown()
        return service

    service = run(scenario())
    status = service.snapshot()
    assert [model.loads for model in status.models] == [1, 1]
    assert status.evictions == {"memory_pressure": 1}


# --- pre-warms ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("uses", "spared"), [(50, True), (0, False)])
def test_a_prewarm_never_evicts_a_model_worth_keeping_more_than_itself(uses: int,
                                                                       spared: bool) -> None:
    # Cost-aware: "held" has served 50 requests since its load (worth 51 x its reload per
    # MiB), the pre-warm is due in 30 s (worth 600 / 30 = 20 x its reload per MiB, at a size
    # alike); with no request since its load it is worth 1 and may go.
    held = FakeTenant("held", 400, last_used=900.0, load_s=1.0, uses=uses)
    pinned = FakeTenant("pinned", 400, holds="pinned")
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([held, pinned, new], cost_aware=True)

    async def prewarm() -> None:
        async with manager.admission("new", "cpu", 400, 0, wait=False,
                                     prewarm=Prewarming(60.0, 1.0)):
            pass

    if spared:
        with pytest.raises(MemoryExhausted, match="worth more than the pre-warm"):
            run(prewarm())
        assert held.unloads == []
        run(admit(manager, new, resident=400))  # a request's load may take its room
        assert held.unloads == ["memory_pressure"]
    else:
        run(prewarm())
        assert held.unloads == ["memory_pressure"]
