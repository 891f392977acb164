"""The trace replayed on a virtual clock (no sleeps) through the engine's own policy code:
`engine/keepalive/` (IdleHistogram, plan, next_arrival_s) and `engine/memory/budgets.py`
(pick_victims, pick_victims_by_cost).

Per model: a request that finds it unloaded loads it (a cold start: it waits the load time);
one that finds it loading (a pre-warm, or another request's load) waits the rest; requests
overlap freely, each running its run time. When its last request ends the model records the
gap it had (histogram) and gets a plan - a fixed window, or `plan()` for `adaptive` with the
fixed window as fallback - whose unload, pre-warm and keep-until times are timers on the
virtual clock, cancelled by the next request. A pre-warm never waits: it evicts idle models
as the policy picks, sparing those expected back within its window and, by cost, those worth
keeping more than it is (engine/memory/victims.py Prewarming), or is skipped; a request's load
evicts idle models as the policy picks (LRU or cost-aware) when a budget is set, and goes over
the budget only when nothing idle is left (counted).

Memory-time held idle: each model's size times the time it is loaded, minus its loads and the
time requests run on it; the trace's end closes every interval.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from snoozeml.engine.keepalive.histogram import IdleHistogram
from snoozeml.engine.keepalive.keeper import PrewarmBudget
from snoozeml.engine.keepalive.policy import (
    KeepAliveSettings,
    Plan,
    next_arrival_s,
    plan,
    wasted_share,
)
from snoozeml.engine.memory.victims import (
    Prewarming,
    Resident,
    pick_victims,
    pick_victims_by_cost,
)

from .trace import Trace

MIB = 2**20
MIN_RESIDENCY_S = 2.0  # the daemon's default churn guard
REPLAN_EVERY_S = 1.0  # as engine/keepalive/keeper.py: a busy model's plan at most this often


@dataclass(frozen=True)
class Policy:
    name: str
    window_s: float | None  # the fixed window (adaptive: its fallback); None: never unload
    adaptive: bool = False
    eviction: str = "lru"  # "lru" or "cost"
    budget_mib: float | None = None
    settings: KeepAliveSettings = field(default_factory=KeepAliveSettings)


@dataclass
class Result:
    policy: Policy
    requests: int = 0
    cold: int = 0  # requests that waited for a load
    cold_partial: int = 0  # of which found it loading already (a late pre-warm, a shared load)
    latencies: list[float] = field(default_factory=list, repr=False)  # added, cold ones only
    idle_mib_s: float = 0.0
    held_mib_s: float = 0.0
    loads: int = 0
    prewarms: int = 0
    prewarm_used: int = 0
    prewarm_wasted: int = 0
    prewarm_skipped: int = 0  # no room, or the daemon's pre-warm budget
    prewarm_limited: int = 0  # of which the pre-warm budget (30 a minute, 5 at once)
    evictions: int = 0
    over_budget: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    per_model: list[tuple[int, float]] = field(default_factory=list, repr=False)  # cold, idle

    @property
    def cold_rate(self) -> float:
        return self.cold / self.requests if self.requests else 0.0

    def p99_added_s(self) -> float:
        """The 99th percentile of every request's added latency (warm ones add nothing)."""
        if not self.requests:
            return 0.0
        rank = max(int(self.requests * 0.99 + 0.999999), 1)
        warm = self.requests - len(self.latencies)
        if rank <= warm:
            return 0.0
        return sorted(self.latencies)[rank - warm - 1]


@dataclass
class State:
    """One model in the simulation."""

    size_mib: float
    load_s: float
    run_s: float
    histogram: IdleHistogram = field(default_factory=IdleHistogram)
    loaded: bool = False
    load_began: float = 0.0
    ready_at: float = 0.0
    busy_until: float = -1.0  # end of its last request (-1: none yet)
    busy_s: float = 0.0  # request time since the load began
    uses: int = 0
    clock: float | None = None
    prewarmed: bool = False  # loaded by a pre-warm, no request yet
    wasted: float = 0.0  # the share of its recent pre-warms nobody used (as the keeper's)
    version: int = 0  # bumped by every request: cancels the timers set before it
    plan: Plan | None = None
    planned_at: float = -1e9
    planned_count: int = -1
    cold: int = 0
    idle_mib_s: float = 0.0


class VirtualClock:
    """What the daemon's PrewarmBudget reads of the engine's clock: `now`."""

    def __init__(self) -> None:
        self.at = 0.0

    def now(self) -> float:
        return self.at


class Simulation:
    """`models`: (MiB, load seconds, run seconds) each; `arrivals`: (seconds, model index) in
    time order; `end_s`: when the replay ends."""

    def __init__(self, models: Sequence[tuple[float, float, float]],
                 arrivals: Sequence[tuple[float, int]], end_s: float, policy: Policy) -> None:
        self.arrivals = arrivals
        self.end_s = end_s
        self.policy = policy
        self.models = [State(size, load, run) for size, load, run in models]
        self.result = Result(policy)
        self.timers: list[tuple[float, int, str, int, int]] = []
        self.sequence = 0
        self.inflation = 0.0
        self.used_mib = 0.0
        self.clock = VirtualClock()
        self.prewarm_budget = PrewarmBudget(self.clock)  # type: ignore[arg-type]

    def run(self) -> Result:
        for at, index in self.arrivals:
            self._due(at)
            self.clock.at = at
            self._arrive(at, index)
        end = self.end_s
        self._due(end)
        for index, model in enumerate(self.models):
            if model.loaded:
                self._unload(end, index)
        self.result.per_model = [(m.cold, m.idle_mib_s) for m in self.models]
        return self.result

    # --- timers -----------------------------------------------------------------------------

    def _at(self, when: float, kind: str, index: int) -> None:
        self.sequence += 1
        heapq.heappush(self.timers, (when, self.sequence, kind, index,
                                     self.models[index].version))

    def _due(self, now: float) -> None:
        while self.timers and self.timers[0][0] <= now:
            when, _, kind, index, version = heapq.heappop(self.timers)
            self.clock.at = when
            model = self.models[index]
            if version != model.version:
                continue
            if kind == "idle":
                self._idle(when, index)
            elif kind == "prewarm":
                self._prewarm(when, index)
            elif model.loaded and (kind == "unload" or model.prewarmed):
                self._unload(when, index)  # "unload", or "expire" of an unused pre-warm

    # --- requests ---------------------------------------------------------------------------

    def _arrive(self, now: float, index: int) -> None:
        model = self.models[index]
        result = self.result
        result.requests += 1
        if model.busy_until >= 0 and now > model.busy_until:
            model.histogram.add(now - model.busy_until)
            model.wasted = wasted_share(model.wasted, self.policy.settings)
        model.version += 1
        if not model.loaded:
            self._load(now, index, prewarm=False)
        wait = max(model.ready_at - now, 0.0)
        if wait > 0:
            result.cold += 1
            model.cold += 1
            result.latencies.append(wait)
            if model.prewarmed or model.uses:
                result.cold_partial += 1
        if model.prewarmed:
            result.prewarm_used += 1
            model.prewarmed = False
            model.wasted = wasted_share(model.wasted, self.policy.settings, "used")
        start = now + wait
        end = start + model.run_s
        model.busy_s += max(end - max(start, model.busy_until), 0.0)
        model.busy_until = max(model.busy_until, end)
        model.uses += 1
        model.clock = self.inflation
        self._at(model.busy_until, "idle", index)

    def _idle(self, now: float, index: int) -> None:
        """The model's last request just ended: plan what happens until the next one."""
        model = self.models[index]
        chosen = self._plan(model, now)
        model.plan = chosen
        self.result.reasons[chosen.reason] = self.result.reasons.get(chosen.reason, 0) + 1
        if chosen.unload_after_s is not None:
            self._at(now + chosen.unload_after_s, "unload", index)
        if chosen.prewarm_after_s is not None:
            self._at(now + chosen.prewarm_after_s, "prewarm", index)
            if chosen.keep_until_s is not None:
                self._at(now + chosen.keep_until_s, "expire", index)

    def _plan(self, model: State, now: float) -> Plan:
        """As the daemon's keeper: worked out again when the history grew, at most every
        REPLAN_EVERY_S while gaps keep coming (at every gap while it is young)."""
        window = self.policy.window_s
        if not self.policy.adaptive:
            return Plan(window, None, None, "fixed" if window is not None else "pinned")
        count = model.histogram.count
        if model.plan is None or (count != model.planned_count and (
                now - model.planned_at >= REPLAN_EVERY_S
                or count <= self.policy.settings.min_history)):
            model.plan = plan(model.histogram, window, self.policy.settings,
                              load_s=model.load_s, wasted=model.wasted)
            model.planned_at, model.planned_count = now, count
        return model.plan

    def _prewarm(self, now: float, index: int) -> None:
        model = self.models[index]
        if model.loaded:
            return
        if not self.prewarm_budget.take():
            self.result.prewarm_skipped += 1
            self.result.prewarm_limited += 1
            return
        chosen = model.plan
        spare = None if chosen is None or chosen.keep_until_s is None \
            or chosen.prewarm_after_s is None else chosen.keep_until_s - chosen.prewarm_after_s
        if not self._make_room(now, index, Prewarming(spare, model.load_s)):
            self.result.prewarm_skipped += 1
            return
        self._load(now, index, prewarm=True)

    # --- memory -----------------------------------------------------------------------------

    def _load(self, now: float, index: int, prewarm: bool) -> None:
        model = self.models[index]
        if not prewarm and not self._make_room(now, index):
            self.result.over_budget += 1
            for resident in self._residents(now, index):
                if not resident.holds:
                    self._evict(now, int(resident.name))
        model.loaded = True
        model.load_began = now
        model.ready_at = now + model.load_s
        model.busy_s = 0.0
        model.uses = 0
        model.clock = self.inflation  # Greedy-Dual: a load is an access
        model.prewarmed = prewarm
        self.used_mib += model.size_mib
        self.result.loads += 1
        self.result.prewarms += int(prewarm)

    def _unload(self, now: float, index: int, evicted: bool = False) -> None:
        model = self.models[index]
        held = now - model.load_began
        loading = min(model.load_s, held)
        busy = model.busy_s - max(model.busy_until - now, 0.0)  # the trace's end cuts a run
        self.result.held_mib_s += model.size_mib * held
        idle = model.size_mib * max(held - loading - busy, 0.0)
        self.result.idle_mib_s += idle
        model.idle_mib_s += idle
        if model.prewarmed:
            self.result.prewarm_wasted += 1
            if not evicted:  # as the keeper: its window ran out, not memory pressure
                model.wasted = wasted_share(model.wasted, self.policy.settings, "wasted")
        model.loaded = False
        model.prewarmed = False
        self.used_mib -= model.size_mib

    def _make_room(self, now: float, index: int, prewarm: Prewarming | None = None) -> bool:
        """Evict idle models, as the policy picks, until model `index` fits; False (and nobody
        evicted) when it cannot. A pre-warm spares what `prewarm.spare` says (as the daemon's
        admission does)."""
        budget = self.policy.budget_mib
        needed = self.models[index].size_mib
        if budget is None or self.used_mib + needed <= budget:
            return True
        missing = int((self.used_mib + needed - budget) * MIB) + 1
        residents = self._residents(now, index)
        if prewarm is not None:
            residents = prewarm.spare(residents, int(needed * MIB), self.inflation
                                      if self.policy.eviction == "cost" else None)
        if self.policy.eviction == "cost":
            victims, inflation = pick_victims_by_cost(
                residents, missing, now, MIN_RESIDENCY_S, self.inflation)
            if victims is not None:
                self.inflation = inflation
        else:
            victims = pick_victims(residents, missing, now, MIN_RESIDENCY_S)
        if victims is None:
            return False
        for name in victims:
            self._evict(now, int(name))
        return True

    def _evict(self, now: float, index: int) -> None:
        self.result.evictions += 1
        self._unload(now, index, evicted=True)

    def _residents(self, now: float, index: int) -> list[Resident]:
        return [self._resident(now, other) for other, model in enumerate(self.models)
                if model.loaded and other != index]

    def _resident(self, now: float, index: int) -> Resident:
        model = self.models[index]
        holds = "busy" if model.busy_until > now else "loading" if model.ready_at > now else ""
        idle_for = now - model.busy_until if model.busy_until >= 0 else 0.0
        ahead = None if model.plan is None else next_arrival_s(
            model.histogram, model.plan, idle_for, self.policy.settings)
        return Resident(
            str(index), int(model.size_mib * MIB), model.busy_until, model.load_began, holds,
            load_s=model.load_s, uses=model.uses, next_use_s=ahead, clock=model.clock)


def simulate(trace: Trace, policy: Policy,
             arrivals: Sequence[tuple[float, int]] | None = None) -> Result:
    """`policy` over the whole trace (`arrivals`: its arrivals, when already expanded)."""
    models = [(m.size_mib, m.load_s, m.run_s) for m in trace.models]
    return Simulation(models, trace.arrivals() if arrivals is None else arrivals,
                      trace.minutes * 60.0, policy).run()
