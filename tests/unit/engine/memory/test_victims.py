"""Eviction's pure policies (engine/memory/victims.py): least recently used, Greedy-Dual-Size-
Frequency by expected cost, what a pre-warm spares, and the budget arithmetic."""

from __future__ import annotations

import pytest

from snoozeml.engine.memory.victims import (
    Prewarming,
    Resident,
    budget_bytes,
    eviction_priority,
    pick_victims,
    pick_victims_by_cost,
    shortfall,
)

# --- pick_victims ---------------------------------------------------------------------------

GiB = 2**30
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


# --- pick_victims_by_cost (Greedy-Dual-Size-Frequency) ----------------------------------------

MiB = 2**20


def costed(name: str, mib: int, *, load_s: float = 1.0, uses: int = 0,
           next_use_s: float | None = None, clock: float | None = None,
           last_used: float = 500.0, loaded_at: float = 0.0, holds: str = "") -> Resident:
    return Resident(name, mib * MiB, last_used, loaded_at, holds, load_s=load_s, uses=uses,
                    next_use_s=next_use_s, clock=clock)


COST_CASES = [
    pytest.param(
        [costed("often", 100, uses=50), costed("seldom", 100, uses=1)],
        100 * MiB, ["seldom"], id="the-less-used-goes-first-whatever-its-recency",
    ),
    pytest.param(
        [costed("slow-load", 100, load_s=5.0), costed("quick-load", 100, load_s=0.1)],
        100 * MiB, ["quick-load"], id="the-cheaper-to-reload-goes-first",
    ),
    pytest.param(
        [costed("large", 1000, uses=5), costed("small", 10, uses=5)],
        10 * MiB, ["large"], id="per-mib-held-the-large-one-goes-first",
    ),
    pytest.param(
        [costed("soon", 100, uses=5, next_use_s=1.0), costed("unknown", 100, uses=5),
         costed("far", 100, uses=5, next_use_s=3600.0)],
        200 * MiB, ["far", "unknown"], id="one-expected-far-off-goes-first-one-wanted-soon-last",
    ),
    pytest.param(
        [costed("used-long-ago", 100, uses=5, clock=0.0),
         costed("used-lately", 100, uses=5, clock=20.0)],
        100 * MiB, ["used-long-ago"], id="the-clock-of-its-last-use-ages-a-model",
    ),
    pytest.param(
        [costed("busy", 100, holds="busy"), costed("pinned", 100, holds="pinned"),
         costed("loading", 100, holds="loading"), costed("idle", 100, uses=1000)],
        100 * MiB, ["idle"], id="only-idle-unpinned-models-are-victims",
    ),
    pytest.param(
        [costed("busy", 500, holds="busy"), costed("idle", 100)],
        200 * MiB, None, id="none-when-the-evictable-ones-are-not-enough",
    ),
    pytest.param(
        [costed("young", 100, loaded_at=999.0), costed("old", 100, uses=100)],
        100 * MiB, ["old"], id="churn-guard-a-young-model-goes-after-an-older-one",
    ),
    pytest.param([costed("a", 100)], 0, [], id="nothing-when-nothing-is-needed"),
]


@pytest.mark.parametrize(("residents", "needed", "victims"), COST_CASES)
def test_pick_victims_by_cost(residents: list[Resident], needed: int,
                              victims: list[str] | None) -> None:
    chosen, _ = pick_victims_by_cost(residents, needed, NOW, MIN_RESIDENCY, 10.0)
    assert chosen == victims


def test_the_inflation_becomes_the_priority_of_the_last_victim() -> None:
    residents = [costed("a", 100, uses=1), costed("b", 100, uses=3), costed("c", 100, uses=9)]
    chosen, inflation = pick_victims_by_cost(residents, 200 * MiB, NOW, MIN_RESIDENCY, 10.0)
    assert chosen == ["a", "b"]
    assert inflation == pytest.approx(eviction_priority(residents[1], 10.0))
    assert inflation == pytest.approx(10.0 + 4 * 1.0 / 100)


def test_the_inflation_is_kept_when_nothing_is_evicted() -> None:
    assert pick_victims_by_cost([costed("a", 100)], 0, NOW, MIN_RESIDENCY, 7.0) == ([], 7.0)
    assert pick_victims_by_cost([costed("a", 100, holds="busy")], 1, NOW, MIN_RESIDENCY,
                                7.0) == (None, 7.0)


@pytest.mark.parametrize(("next_use_s", "frequency"), [
    pytest.param(None, 10.0, id="unknown-its-requests-since-its-load"),
    pytest.param(600.0, 10.0, id="far-s-away-the-same"),
    pytest.param(120.0, 10.0, id="a-pace-under-its-requests-changes-nothing"),
    pytest.param(30.0, 20.0, id="due-in-30-s-twenty-requests-a-window"),
    pytest.param(0.0, 600.0, id="due-now-counted-as-due-in-a-second"),
    pytest.param(1200.0, 5.0, id="twice-far-s-away-half"),
])
def test_the_frequency_is_its_requests_or_the_pace_its_next_arrival_implies(
        next_use_s: float | None, frequency: float) -> None:
    model = costed("m", 100, uses=9, load_s=2.0, next_use_s=next_use_s)
    assert eviction_priority(model, 0.0, far_s=600.0) == pytest.approx(frequency * 2.0 / 100)


def test_a_prewarmed_model_about_to_be_used_outlasts_one_with_requests_but_no_next_arrival(
) -> None:
    prewarmed = costed("prewarmed", 100, uses=0, next_use_s=30.0)
    used = costed("used", 100, uses=5)
    assert pick_victims_by_cost([prewarmed, used], 100 * MiB, NOW, MIN_RESIDENCY, 0.0)[0] \
        == ["used"]


def test_resident_keeps_its_positional_form() -> None:
    # what MemoryManager's tenants build today still builds: the new fields have defaults
    plain = Resident("a", 100, 1.0, 0.0, "")
    assert (plain.load_s, plain.uses, plain.next_use_s, plain.clock) == (0.0, 0, None, None)


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




def test_a_prewarm_is_worth_its_pace_half_way_into_its_window() -> None:
    # due in 30 s: 600 / 30 = 20 requests' worth, x 2 s of reload per MiB, on the clock
    assert Prewarming(60.0, 2.0).worth(100 * MiB, 5.0) == pytest.approx(5.0 + 20 * 2.0 / 100)
    # no window known: its next request unknown, one request's worth
    assert Prewarming(None, 2.0).worth(100 * MiB, 5.0) == pytest.approx(5.0 + 2.0 / 100)


@pytest.mark.parametrize(("inflation", "held"), [
    pytest.param(0.0, ["busy", "expected back sooner", "worth more than the pre-warm", ""],
                 id="by-cost"),
    pytest.param(None, ["busy", "expected back sooner", "", ""], id="least-recently-used"),
])
def test_what_a_prewarm_spares(inflation: float | None, held: list[str]) -> None:
    # the pre-warm: a 60 s window, due in 30 s (worth 20 x 1 s per MiB at 100 MiB)
    residents = [costed("busy", 100, holds="busy"), costed("soon", 100, next_use_s=50.0),
                 costed("busier", 100, uses=30), costed("cheap", 100, uses=3)]
    spared = Prewarming(60.0, 1.0).spare(residents, 100 * MiB, inflation)
    assert [r.holds for r in spared] == held
