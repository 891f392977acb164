"""Memory management without a daemon: the pure policies (pick_victims, budget_bytes,
shortfall), the admission arithmetic of MemoryManager against a fake memory probe (the one
injected piece; GPU devices included), reactive OOM relief, and how sizes and devices are
worked out from a model's files and config.

Tenants here are small fakes of engine/model.py's Model: what the memory manager sees of a
model (name, spec, device, bytes held, lease state) and an `unload` that records its reason.
Every scenario runs in its own event loop (asyncio.run); none waits on a clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import write_corrupt_model, write_mlp

from snoozeml.config import MemoryConfig, ModelConfig, ServerConfig
from snoozeml.engine.memory import (
    FileSizes,
    MemoryManager,
    Resident,
    budget_bytes,
    file_sizes_blocking,
    pick_victims,
    shortfall,
)
from snoozeml.errors import MemoryExhausted, ModelTooLarge
from snoozeml.runtime.base import is_out_of_memory, memory_device

GiB = 2**30
T = TypeVar("T")


def run(scenario: Coroutine[Any, Any, T]) -> T:
    """One scenario in a fresh event loop (pytest-asyncio is not used here)."""
    return asyncio.run(scenario)


# --- pick_victims ---------------------------------------------------------------------------

NOW = 1000.0
MIN_RESIDENCY = 2.0


def resident(name: str, size: int, last_used: float, loaded_at: float = 0.0,
             holds: str = "") -> Resident:
    return Resident(name, size, last_used, loaded_at, holds)


PICK_CASES = [
    pytest.param(
        [resident("a", 100, 30.0), resident("b", 100, 10.0), resident("c", 100, 20.0)],
        100, ["b"], id="the-least-recently-used-goes-first",
    ),
    pytest.param(
        [resident("a", 100, 30.0), resident("b", 100, 10.0), resident("c", 100, 20.0)],
        150, ["b", "c"], id="then-the-next-least-recently-used-until-enough-is-freed",
    ),
    pytest.param(
        [resident("a", 100, 30.0), resident("b", 100, 10.0), resident("c", 100, 20.0)],
        300, ["b", "c", "a"], id="everything-when-everything-is-needed",
    ),
    pytest.param(
        [resident("a", 60, 10.0), resident("b", 40, 20.0)],
        100, ["a", "b"], id="an-exact-fit-is-enough",
    ),
    pytest.param(
        [resident("a", 100, 10.0)], 100, ["a"], id="one-exact-fit",
    ),
    pytest.param(
        [resident("small", 10, 10.0), resident("large", 500, 20.0)],
        100, ["small", "large"], id="order-is-recency-not-size",
    ),
    pytest.param(
        [
            resident("busy", 100, 1.0, holds="busy"),
            resident("pinned", 100, 2.0, holds="pinned"),
            resident("loading", 100, 3.0, holds="loading"),
            resident("unloading", 100, 4.0, holds="unloading"),
            resident("idle", 100, 50.0),
        ],
        100, ["idle"], id="only-idle-unpinned-models-are-victims",
    ),
    pytest.param(
        [resident("busy", 500, 1.0, holds="busy"), resident("idle", 100, 50.0)],
        200, None, id="none-when-the-evictable-ones-are-not-enough",
    ),
    pytest.param(
        [resident("pinned", 500, 1.0, holds="pinned")],
        1, None, id="none-when-nothing-is-evictable",
    ),
    pytest.param([], 1, None, id="none-when-nothing-is-resident"),
    pytest.param(
        [resident("a", 100, 10.0)], 0, [], id="nothing-when-nothing-is-needed",
    ),
    pytest.param(
        [resident("a", 100, 10.0)], -50, [], id="nothing-when-there-is-room-to-spare",
    ),
    # Churn guard: loaded less than MIN_RESIDENCY (2 s) before NOW (1000).
    pytest.param(
        [resident("young", 100, 5.0, loaded_at=999.0), resident("old", 100, 900.0)],
        100, ["old"], id="churn-guard-a-young-model-goes-after-an-older-one",
    ),
    pytest.param(
        [resident("young", 100, 5.0, loaded_at=999.0), resident("old", 100, 900.0)],
        200, ["old", "young"], id="churn-guard-a-young-model-still-goes-when-needed",
    ),
    pytest.param(
        [resident("young", 100, 5.0, loaded_at=999.0)],
        100, ["young"], id="churn-guard-a-young-model-alone-still-goes",
    ),
    pytest.param(
        [
            resident("young-late", 100, 990.0, loaded_at=998.5),
            resident("young-early", 100, 980.0, loaded_at=999.5),
            resident("old", 100, 995.0),
        ],
        300, ["old", "young-early", "young-late"],
        id="churn-guard-young-models-among-themselves-by-recency",
    ),
    pytest.param(
        [resident("exactly-old-enough", 100, 5.0, loaded_at=998.0), resident("b", 100, 900.0)],
        100, ["exactly-old-enough"], id="churn-guard-ends-at-min-residency",
    ),
]


@pytest.mark.parametrize(("residents", "needed", "victims"), PICK_CASES)
def test_pick_victims(residents: list[Resident], needed: int,
                      victims: list[str] | None) -> None:
    assert pick_victims(residents, needed, NOW, MIN_RESIDENCY) == victims


def test_pick_victims_without_a_churn_guard_is_plain_lru() -> None:
    residents = [resident("young", 100, 5.0, loaded_at=999.9), resident("old", 100, 900.0)]
    assert pick_victims(residents, 100, NOW, 0.0) == ["young"]


def test_pick_victims_accepts_any_iterable_once() -> None:
    residents = iter([resident("a", 100, 20.0), resident("b", 100, 10.0)])
    assert pick_victims(residents, 100, NOW, MIN_RESIDENCY) == ["b"]


# --- budget_bytes and shortfall ---------------------------------------------------------------

@pytest.mark.parametrize(("budget", "total", "expected"), [
    pytest.param(0.8, 1000, 800, id="a-share-of-the-total"),
    pytest.param(0.9, 8 * GiB, int(8 * GiB * 0.9), id="a-share-of-a-gpu"),
    pytest.param(1.0, 1000, 1000, id="the-whole-device"),
    pytest.param(6 * GiB, 16 * GiB, 6 * GiB, id="absolute-bytes-ignore-the-total"),
    pytest.param(6 * GiB, 1 * GiB, 6 * GiB, id="absolute-bytes-even-above-the-total"),
    pytest.param(314572800, 0, 314572800, id="absolute-with-unknown-total"),
])
def test_budget_bytes(budget: float | int, total: int, expected: int) -> None:
    assert budget_bytes(budget, total) == expected


@pytest.mark.parametrize(("used", "needed", "budget", "missing"), [
    pytest.param(0, 100, 1000, 0, id="fits-in-an-empty-device"),
    pytest.param(900, 100, 1000, 0, id="fits-exactly"),
    pytest.param(901, 100, 1000, 1, id="one-byte-short"),
    pytest.param(800, 300, 1000, 100, id="short-by-the-overlap"),
    pytest.param(0, 1500, 1000, 500, id="needs-more-than-the-budget"),
    pytest.param(0, 0, 0, 0, id="nothing-needed-nothing-missing"),
    pytest.param(1200, 0, 1000, 200, id="already-over-budget"),
])
def test_shortfall(used: int, needed: int, budget: int, missing: int) -> None:
    assert shortfall(used, needed, budget) == missing


# --- a fake probe and fake tenants ----------------------------------------------------------


class FakeProbe:
    """A MemoryProbe with numbers set by the test: host total, GPU totals, per-device use."""

    def __init__(self, host_total: int, gpu_totals: dict[str, int] | None = None) -> None:
        self.totals = {"cpu": host_total, **(gpu_totals or {})}
        self.process = dict.fromkeys(self.totals, 0)

    def gpus(self) -> list[str]:
        return [device for device in self.totals if device != "cpu"]

    def total(self, device: str) -> int:
        return self.totals[device]

    def used(self, device: str) -> int:
        return self.process[device]


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

    @property
    def spec(self) -> ModelConfig:
        return ModelConfig(name=self.name, path=Path(f"{self.name}.onnx"), format="onnx",
                           device=self.device, memory_factor=self.memory_factor)

    def resident_bytes(self) -> int | None:
        return self.size if self.loaded else None

    def resident(self, now: float) -> Resident | None:
        if self.looked is not None:
            self.looked.set()
        if not self.loaded:
            return None
        return Resident(self.name, self.size, self.last_used, self.loaded_at, self.holds)

    async def unload(self, reason: str) -> None:
        self.unloads.append(reason)
        self.loaded = False


def manager_for(
    tenants: Iterable[FakeTenant],
    probe: FakeProbe | None = None,
    clock: float = NOW,
    **memory: Any,
) -> MemoryManager:
    """A MemoryManager over `tenants` (a live list: tenants added later count too), with a
    frozen clock. Budgets default to 1000 bytes of host memory and 90% of each GPU."""
    settings: dict[str, Any] = {"host_budget": 1000, "memory_wait": 0, "min_residency": 2.0}
    settings.update(memory)
    server = ServerConfig(memory=MemoryConfig(**settings))
    roster = tenants if isinstance(tenants, list) else list(tenants)
    return MemoryManager(server, probe or FakeProbe(host_total=10_000), lambda: roster,
                         clock=lambda: clock)


async def admit(manager: MemoryManager, tenant: FakeTenant, resident: int,
                transient: int = 0) -> None:
    """Pass admission for a load and 'load': the tenant then holds `resident` bytes."""
    async with manager.admission(tenant, resident, transient):
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
    assert manager.device_of(on_missing_gpu) == "cpu"
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
    assert manager.evictions == {}


def test_admission_reserves_the_load_peak_while_the_load_runs() -> None:
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([new])

    async def scenario() -> list[object]:
        async with manager.admission(new, 300, 200):
            return [manager.reserved("cpu"), manager.status()[0]["reserved_bytes"]]

    assert run(scenario()) == [500, 500]
    assert manager.reserved("cpu") == 0
    assert manager.status()[0]["reserved_bytes"] == 0


def test_the_load_peak_not_only_the_resident_size_must_fit() -> None:
    # 400 held; the new model stays at 300 but peaks at 700 while loading: 1100 > 1000.
    old = FakeTenant("old", 400)
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([old, new])

    run(admit(manager, new, resident=300, transient=400))

    assert old.unloads == ["memory_pressure"]


def test_the_least_recently_used_idle_model_on_the_device_is_evicted() -> None:
    recent = FakeTenant("recent", 300, last_used=900.0)
    oldest = FakeTenant("oldest", 300, last_used=100.0)
    middle = FakeTenant("middle", 300, last_used=500.0)
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([recent, oldest, middle, new])

    run(admit(manager, new, resident=200))  # 900 + 200: 100 short

    assert oldest.unloads == ["memory_pressure"]
    assert recent.unloads == middle.unloads == []
    assert manager.evictions == {"memory_pressure": 1}
    assert manager.used("cpu") == 800


def test_as_many_models_are_evicted_as_the_load_needs_oldest_first() -> None:
    tenants = [FakeTenant(f"m{i}", 250, last_used=float(i)) for i in range(4)]
    new = FakeTenant("new", 0, loaded=False)
    manager = manager_for([*tenants, new])

    run(admit(manager, new, resident=300, transient=200))  # needs 500 of the 1000 held

    assert [t.name for t in tenants if t.unloads] == ["m0", "m1"]
    assert manager.evictions == {"memory_pressure": 2}


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
    assert manager.evictions == {}


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
        manager.notify_freed()  # ...and the model says so, as Model.release does
        await asyncio.wait_for(load, 60)  # a guard against a hang, not a measurement
        return busy.unloads

    assert run(scenario()) == ["memory_pressure"]
    assert new.loaded


def test_admission_gives_up_after_memory_wait_when_no_lease_ends() -> None:
    busy = FakeTenant("busy", 800, holds="busy")
    new = FakeTenant("new", 0, loaded=False)
    now = [0.0]
    server = ServerConfig(memory=MemoryConfig(host_budget=1000, memory_wait=5))
    manager = MemoryManager(server, FakeProbe(10_000), lambda: [busy, new],
                            clock=lambda: now[0])

    async def scenario() -> None:
        busy.looked = asyncio.Event()
        load = asyncio.create_task(admit(manager, new, resident=500))
        await busy.looked.wait()
        # Something unrelated freed memory once memory_wait had passed: admission looks
        # again, finds the model still busy, and gives up.
        now[0] = 5.0
        manager.notify_freed()
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
        async with manager.admission(tenant, 600, 0):
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
        async with manager.admission(host, 900, 0), manager.admission(gpu, 1000, 0):
            return manager.reserved("cpu"), manager.reserved("cuda:0")

    assert run(scenario()) == (900, 1000)


def test_a_model_reloading_does_not_count_its_own_old_size() -> None:
    # A model that is being reloaded (say after a failed load) is excluded from `used`.
    itself = FakeTenant("itself", 700)
    manager = manager_for([itself])

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

    freed = run(manager.relieve_oom(failing))

    assert freed == 2
    assert {t.name: t.unloads for t in tenants if t.unloads} == {
        "idle-a": ["oom"], "idle-b": ["oom"],
    }
    assert manager.evictions == {"oom": 2}


def test_relieve_oom_on_a_gpu_leaves_the_host_alone() -> None:
    failing = FakeTenant("failing", 300, device="cuda:1", holds="busy")
    gpu_idle = FakeTenant("gpu1-idle", 100, device="cuda:1")
    other_gpu_idle = FakeTenant("gpu0-idle", 100, device="cuda:0")
    host_idle = FakeTenant("host-idle", 100)
    tenants = [failing, gpu_idle, other_gpu_idle, host_idle]
    manager = manager_for(tenants, GPU_PROBE)

    assert run(manager.relieve_oom(failing)) == 1
    assert [t.name for t in tenants if t.unloads] == ["gpu1-idle"]


def test_relieve_oom_with_nothing_idle_unloads_nothing() -> None:
    failing = FakeTenant("failing", 300, holds="busy")
    pinned = FakeTenant("pinned", 100, holds="pinned")
    manager = manager_for([failing, pinned])

    assert run(manager.relieve_oom(failing)) == 0
    assert pinned.unloads == []
    assert manager.evictions.get("oom", 0) == 0


def test_status_lists_every_device_with_budget_use_and_process_memory() -> None:
    probe = FakeProbe(host_total=10_000, gpu_totals={"cuda:0": 2000, "cuda:1": 4000})
    probe.process.update({"cpu": 7000, "cuda:0": 300})
    tenants = [FakeTenant("host", 400), FakeTenant("gpu", 250, device="cuda:0")]
    manager = manager_for(tenants, probe, gpu_budget=0.5)

    assert manager.status() == [
        {"name": "cpu", "total_bytes": 10_000, "budget_bytes": 1000, "used_bytes": 400,
         "reserved_bytes": 0, "process_bytes": 7000},
        {"name": "cuda:0", "total_bytes": 2000, "budget_bytes": 1000, "used_bytes": 250,
         "reserved_bytes": 0, "process_bytes": 300},
        {"name": "cuda:1", "total_bytes": 4000, "budget_bytes": 2000, "used_bytes": 0,
         "reserved_bytes": 0, "process_bytes": 0},
    ]


# --- is_out_of_memory ----------------------------------------------------------------------


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda.OutOfMemoryError, which is matched by name (torch stays optional)."""


@pytest.mark.parametrize(("error", "expected"), [
    pytest.param(MemoryError(), True, id="MemoryError"),
    pytest.param(MemoryError("cannot allocate array"), True, id="MemoryError-with-text"),
    pytest.param(OutOfMemoryError("CUDA error"), True, id="a-class-named-OutOfMemoryError"),
    pytest.param(RuntimeError(
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while "
        "running MatMul node. Status Message: bfc_arena.cc:376 Failed to allocate memory for "
        "requested buffer of size 4000000000000"
    ), True, id="onnxruntime-arena"),
    pytest.param(RuntimeError("std::bad_alloc"), True, id="bad_alloc"),
    pytest.param(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True,
                 id="cuda-out-of-memory"),
    pytest.param(RuntimeError("CUDA failure 2: cudaErrorMemoryAllocation"), True,
                 id="cudaErrorMemoryAllocation"),
    pytest.param(ValueError("shapes (2,3) and (4,5) not aligned"), False, id="a-normal-error"),
    pytest.param(RuntimeError("Failed to load model with error: file not found"), False,
                 id="a-failure-that-is-not-memory"),
    pytest.param(KeyError("memory"), False, id="a-mention-of-memory-alone"),
])
def test_is_out_of_memory(error: BaseException, expected: bool) -> None:
    assert is_out_of_memory(error) is expected


def _allocating_session(tmp_path: Path) -> ort.InferenceSession:
    """A real onnxruntime session whose output shape is its INT64 input's values."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"],
                          value=numpy_helper.from_array(np.array([1.0], np.float32)))],
        "allocate",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "cols"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "allocate.onnx"
    path.write_bytes(model.SerializeToString())
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_a_real_onnxruntime_allocation_failure_is_out_of_memory(tmp_path: Path) -> None:
    session = _allocating_session(tmp_path)
    with pytest.raises(Exception) as info:  # noqa: PT011 - the class is onnxruntime's own
        session.run(None, {"shape": np.array([10**6, 10**6], np.int64)})  # 4 TB of float32
    assert is_out_of_memory(info.value), info.value


def test_a_real_onnxruntime_input_error_is_not_out_of_memory(tmp_path: Path) -> None:
    session = _allocating_session(tmp_path)
    with pytest.raises(Exception) as info:  # noqa: PT011
        session.run(None, {"shape": np.array([2.0, 3.0], np.float32)})  # wrong dtype
    assert not is_out_of_memory(info.value), info.value


# --- sizes from files, and which device a model counts against ---------------------------------

def test_a_single_file_onnx_model_holds_its_file_and_peaks_at_twice_it(tmp_path: Path) -> None:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(64, 256, 64))
    spec = ModelConfig(name="mlp", path=path, format="onnx")
    size = path.stat().st_size
    assert file_sizes_blocking(spec) == FileSizes(weights=size, transient=size)


def test_external_data_counts_as_weights_but_not_as_load_transient(tmp_path: Path) -> None:
    write_mlp(tmp_path / "inline.onnx", dims=(64, 512, 64))
    model = onnx.load(str(tmp_path / "inline.onnx"))
    onnx.save_model(model, str(tmp_path / "external.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    graph_bytes = (tmp_path / "external.onnx").stat().st_size
    data_bytes = (tmp_path / "weights.bin").stat().st_size
    assert data_bytes > 100_000 > graph_bytes

    spec = ModelConfig(name="ext", path=tmp_path / "external.onnx", format="onnx")
    assert file_sizes_blocking(spec) == FileSizes(graph_bytes + data_bytes, graph_bytes)


def test_an_unreadable_onnx_file_is_sized_by_its_bytes_and_fails_later_at_load(
    tmp_path: Path,
) -> None:
    path = write_corrupt_model(tmp_path / "broken.onnx")
    spec = ModelConfig(name="broken", path=path, format="onnx")
    size = path.stat().st_size
    assert file_sizes_blocking(spec) == FileSizes(weights=size, transient=size)


def test_a_torch_folder_counts_its_weight_files_only(tmp_path: Path) -> None:
    folder = tmp_path / "bert"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    (folder / "sub" / "extra.bin").write_bytes(b"\0" * 300)
    (folder / "tokenizer.json").write_bytes(b"{}" * 5000)
    (folder / "README.md").write_text("a long model card " * 100)
    spec = ModelConfig(name="bert", path=folder, format="torch")
    assert file_sizes_blocking(spec) == FileSizes(weights=1300, transient=0)


def test_a_single_safetensors_file_counts_itself(tmp_path: Path) -> None:
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"\0" * 4096)
    spec = ModelConfig(name="w", path=path, format="torch")
    assert file_sizes_blocking(spec) == FileSizes(weights=4096, transient=0)


def _spec(device: str, fmt: Literal["onnx", "torch"] = "torch") -> ModelConfig:
    return ModelConfig(name="m", path=Path("m"), format=fmt, device=device)


@pytest.mark.parametrize(("spec", "gpus", "device"), [
    pytest.param(_spec("cpu"), ["cuda:0"], "cpu", id="cpu-stays-on-the-host"),
    pytest.param(_spec("mps"), ["cuda:0"], "cpu", id="mps-shares-the-host-memory"),
    pytest.param(_spec("auto"), [], "cpu", id="auto-without-gpus"),
    pytest.param(_spec("cuda"), [], "cpu", id="cuda-without-gpus-is-inert"),
    pytest.param(_spec("auto"), ["cuda:0", "cuda:1"], "cuda:0", id="auto-takes-the-first-gpu"),
    pytest.param(_spec("cuda"), ["cuda:0", "cuda:1"], "cuda:0", id="cuda-means-cuda-0"),
    pytest.param(_spec("cuda:1"), ["cuda:0", "cuda:1"], "cuda:1", id="a-named-gpu"),
    pytest.param(_spec("cuda:3"), ["cuda:0", "cuda:1"], "cpu", id="a-gpu-that-is-not-there"),
])
def test_memory_device(spec: ModelConfig, gpus: list[str], device: str) -> None:
    assert memory_device(spec, gpus) == device


def test_an_onnx_model_counts_against_the_host_when_onnxruntime_has_no_cuda() -> None:
    spec = _spec("cuda:0", fmt="onnx")
    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    assert memory_device(spec, ["cuda:0"]) == ("cuda:0" if has_cuda else "cpu")


# --- admission with real models ------------------------------------------------------------------

def test_a_freshly_loaded_model_is_not_evicted_before_the_request_that_loaded_it(
    tmp_path: Path,
) -> None:
    # Two cold models requested at once under a budget for one: the second load waits for the
    # first (one admission per device). When the first finishes, its request has not yet taken
    # its lease; the second must not evict it then, or the first request reloads it, evicting
    # the second before *its* request takes a lease, and so on for ever.
    from concurrent.futures import ThreadPoolExecutor

    from snoozeml.engine.model import Model
    from snoozeml.runtime.onnx import OnnxBackend

    specs = [
        ModelConfig(name=name, path=write_mlp(tmp_path / f"{name}.onnx", seed=i),
                    format="onnx", device="cpu", idle_timeout=300)  # None would pin
        for i, name in enumerate(("first", "second"))
    ]
    size = specs[0].path.stat().st_size
    # Each resident model is predicted at 1.1 x its file and peaks at 2.1 x while loading:
    # one resident beside a load needs 3.2 x, and the budget is 2.5 x.
    server = ServerConfig(memory=MemoryConfig(host_budget=int(size * 2.5), memory_wait=3600))
    models: list[Model] = []
    memory = MemoryManager(server, FakeProbe(host_total=10 * GiB), lambda: models)
    loader = ThreadPoolExecutor(2)
    models.extend(Model(spec, OnnxBackend(), loader, memory) for spec in specs)
    first, second = models

    async def scenario() -> None:
        leases = {asyncio.create_task(model.acquire()): model for model in models}
        # Either load may reach the device first (each reads its files on the loader threads
        # before asking for memory); the other waits for the winner's lease to end.
        # The timeouts guard against the ping-pong, not timing.
        done, pending = await asyncio.wait(leases, timeout=30,
                                           return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        (winner_lease,), (other_lease,) = done, pending
        winner, other = leases[winner_lease], leases[other_lease]
        winner_lease.result()
        assert winner.in_flight == 1
        assert other.state.value == "LOADING"  # waiting for the winner's lease to end
        winner.release()
        await asyncio.wait_for(other_lease, 30)
        other.release()
        await asyncio.gather(*(m.unload("shutdown") for m in models))

    try:
        run(scenario())
    finally:
        loader.shutdown(wait=True)
    assert first.stats.loads == 1
    assert second.stats.loads == 1
    assert memory.evictions == {"memory_pressure": 1}
