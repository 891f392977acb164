"""Eviction's pure policies: which idle models make room for a load. Least recently used
(`pick_victims`), or by expected cost (`pick_victims_by_cost`, Greedy-Dual-Size-Frequency);
what a pre-warm may not evict (`Prewarming`); budget arithmetic. engine/memory/budgets.py's
MemoryManager applies them; bench/run.py keepalive's simulator calls them as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Resident:
    """What eviction needs to know about one model holding memory on a device."""

    name: str
    bytes: int
    last_used: float  # monotonic seconds
    loaded_at: float  # monotonic seconds
    holds: str  # "" when evictable, else why not: "busy", "pinned", "loading", "unloading"
    load_s: float = 0.0  # its last load's seconds (what evicting it costs the next request)
    uses: int = 0  # requests since it was loaded (or a decayed count)
    next_use_s: float | None = None  # seconds to its expected next arrival (None: unknown)
    clock: float | None = None  # the inflation when it was last used (None: the current one)


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


FAR_S = 600.0  # a model expected back this far off counts as one whose next use is unknown


def eviction_priority(resident: Resident, inflation: float, far_s: float = FAR_S) -> float:
    """Greedy-Dual-Size-Frequency (FaasCache, ASPLOS 2021): the clock (the inflation when the
    model was last used) plus its frequency x reload seconds per MiB held. Higher: keep.

    The frequency is its requests since its load, plus one; or, when its next arrival is
    expected `next_use_s` from now, the requests a `far_s` window holds at that pace
    (far_s / next_use_s, a second at least) when that is more: a model due in a minute counts
    as ten requests. So a pre-warmed model about to be used, which has had no request since its
    load, is not the first victim. A model expected further off than far_s has its value
    scaled by far_s / next_use_s (holding it that long buys one request)."""
    mib = max(resident.bytes, 1) / 2**20
    frequency = resident.uses + 1.0
    if resident.next_use_s is not None:
        pace = far_s / max(resident.next_use_s, 1.0)
        frequency = max(frequency, pace) * min(pace, 1.0)
    base = inflation if resident.clock is None else resident.clock
    return base + frequency * resident.load_s / mib


@dataclass(frozen=True, slots=True)
class Prewarming:
    """A pre-warm's load (engine/keepalive/): it spares every idle model expected back within
    `window_s` (its own window, from its load to its keep-until), and, with cost-aware
    eviction, every one worth keeping as much as it is (`worth`)."""

    window_s: float | None
    load_s: float  # its last load's seconds

    def worth(self, size: int, inflation: float) -> float:
        """Its priority once loaded: no request yet, its next one due half way into its
        window."""
        due = None if self.window_s is None else self.window_s / 2
        return eviction_priority(Resident("", size, 0.0, 0.0, "", load_s=self.load_s,
                                          next_use_s=due), inflation)

    def spare(self, residents: Iterable[Resident], size: int,
              inflation: float | None) -> list[Resident]:
        """`residents` with those the pre-warm (of `size` bytes) must not evict held: expected
        back within its window, or, evicting by cost (`inflation` not None), worth keeping as
        much as it is."""
        worth = None if inflation is None else self.worth(size, inflation)
        found = []
        for resident in residents:
            if not resident.holds and self.window_s is not None \
                    and resident.next_use_s is not None \
                    and resident.next_use_s <= self.window_s:
                resident = replace(resident, holds="expected back sooner")
            elif not resident.holds and worth is not None \
                    and eviction_priority(resident, inflation or 0.0) >= worth:
                resident = replace(resident, holds="worth more than the pre-warm")
            found.append(resident)
        return found


def pick_victims_by_cost(
    residents: Iterable[Resident], needed: int, now: float, min_residency: float,
    inflation: float, far_s: float = FAR_S,
) -> tuple[list[str] | None, float]:
    """Names to unload, lowest `eviction_priority` first, freeing at least `needed` bytes
    (None as pick_victims: when not even every evictable model would do), and the inflation
    to keep: the priority of the last victim (unchanged when nothing is evicted).

    Models that hold (busy, pinned, loading) are never victims; the churn guard stays: a model
    loaded less than `min_residency` ago goes only after every older one."""
    if needed <= 0:
        return [], inflation
    evictable = [(r, eviction_priority(r, inflation, far_s)) for r in residents if not r.holds]
    evictable.sort(key=lambda pair: (now - pair[0].loaded_at < min_residency, pair[1],
                                     pair[0].last_used))
    chosen: list[str] = []
    freed = 0
    for resident, priority in evictable:
        chosen.append(resident.name)
        freed += resident.bytes
        if freed >= needed:
            return chosen, max(inflation, priority)
    return None, inflation


def budget_bytes(budget: float | int, total: int) -> int:
    """A budget as bytes: a float is a share of `total`, an int is absolute."""
    return int(total * budget) if isinstance(budget, float) else int(budget)


def shortfall(used: int, needed: int, budget: int) -> int:
    """Bytes that must be freed before `needed` more fits beside `used` (0 if it fits)."""
    return max(used + needed - budget, 0)
