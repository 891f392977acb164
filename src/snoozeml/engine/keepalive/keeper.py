"""One model's keep-alive, wired to its lifecycle (issue 34): the idle gaps it records, the plan
it follows after each request, its pre-warms, and what it held idle.

The model (engine/model.py) calls in at four moments: a request arrives (`arrived`), its last
lease ends (`ended`), a load finishes or fails (`loaded`, `load_failed`), an unload starts
(`unloading`). Every model records its gaps (end of its last request to the next arrival) and
its idle memory-time; only a model with `keep_alive = "adaptive"` acts on them:

- after each request it asks the pure policy (engine/keepalive/policy.py) for a plan, and arms
  the idle timer for the plan's `unload_after_s` (the fixed `idle_timeout` while the history
  is young or unpredictable);
- when the plan has `prewarm_after_s`, a timer loads the model again then, unless a request
  came first: through memory admission without waiting and without evicting a busy model or
  one expected back sooner (the model's `start_prewarm`), within the daemon's pre-warm budget
  (`PrewarmBudget`); the pre-warmed model stays until `keep_until_s` unless a request comes;
- a pre-warm ends `used` (a request came while it loaded or was loaded), `wasted` (the model
  unloaded first) or `skipped` (it never loaded: the budget, memory, the model's state); used
  and wasted ones (its window ran out, not an eviction) move the model's `wasted` share, which
  its next plans are charged for.

A `keep_alive = "fixed"` model behaves as before: the idle timer keeps its `idle_timeout`.

Invariants:
- `idle_since` is set only while no request holds the model, and only after a request ended
  (an explicit load's lease records no gap).
- At most one pre-warm timer is armed per model; an arrival cancels it.
- All of it runs on the event loop, on the engine's injected clock.
"""

from __future__ import annotations

from typing import Protocol

from snoozeml.config.settings import ModelConfig
from snoozeml.engine.clock import Clock, Timer
from snoozeml.engine.events import EventBus
from snoozeml.engine.idle import IdleTimer
from snoozeml.engine.keepalive.events import ColdStart, KeepAlivePlanned, Prewarm
from snoozeml.engine.keepalive.histogram import IdleHistogram
from snoozeml.engine.keepalive.policy import (
    KeepAliveSettings,
    Plan,
    next_arrival_s,
    plan,
    wasted_share,
)
from snoozeml.engine.lifecycle import State

PREWARMS_PER_MINUTE = 30.0
PREWARM_BURST = 5.0
REPLAN_EVERY_S = 1.0  # a busy model's plan is worked out again at most this often


class PrewarmBudget:
    """The daemon's pre-warms, rationed: a token bucket of `per_minute` a minute, `burst` at
    once. Models that share one period would all load at the same moment; past the budget
    their pre-warms are skipped (they cold-start as with a fixed timeout), never queued."""

    def __init__(self, clock: Clock, per_minute: float = PREWARMS_PER_MINUTE,
                 burst: float = PREWARM_BURST) -> None:
        self._clock = clock
        self._rate = per_minute / 60.0
        self._burst = burst
        self._tokens = burst
        self._at = clock.now()

    def take(self) -> bool:
        now = self._clock.now()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class Owner(Protocol):
    """What the keep-alive sees of its model (engine/model.py's Model)."""

    @property
    def state(self) -> State: ...

    on_demand: bool
    retired: bool

    def resident_bytes(self) -> int | None: ...

    def start_prewarm(self, spare_within: float | None) -> None: ...


class KeepAlive:
    def __init__(
        self, spec: ModelConfig, clock: Clock, events: EventBus, idle: IdleTimer,
        budget: PrewarmBudget, owner: Owner, history: IdleHistogram | None = None,
        settings: KeepAliveSettings | None = None,
    ) -> None:
        self.name = spec.name
        self.adaptive = spec.keep_alive == "adaptive"
        self.fallback_s = spec.idle_timeout if spec.replicas.min == 0 else None
        self.history = history if history is not None else IdleHistogram()
        self.settings = settings or KeepAliveSettings()
        self.plan: Plan | None = None  # the last one worked out (adaptive models only)
        self._fixed = Plan(self.fallback_s, None, None, "fixed")  # a fixed model's, always
        self.idle_since: float | None = None  # monotonic end of the last request, while idle
        self.held_since: float | None = None  # loaded and idle since (memory-time)
        self.requests = 0  # request leases taken, ever
        self.uses = 0  # of those, since the last load
        self.loaded_by = ""  # the last load's cause (keepalive/events.py CAUSES)
        self.load_s = 0.0  # the last load's seconds
        self.prewarms = {"used": 0, "wasted": 0, "skipped": 0}
        self.wasted = 0.0  # the share of its recent pre-warms nobody used (policy.wasted_share)
        self.idle_byte_seconds = 0.0  # closed idle periods' memory-time
        self._clock = clock
        self._events = events
        self._idle = idle
        self._budget = budget
        self._owner = owner
        self._pending = False  # a pre-warm started and not yet used, wasted or skipped
        self._retired = False  # removed, or the daemon stops: no pre-warm any more
        self._prewarm_timer: Timer | None = None
        self.prewarm_at: float | None = None  # monotonic moment of the armed pre-warm
        self._requests_at_end = 0
        self._planned_at = -REPLAN_EVERY_S
        self._planned_count = -1

    # --- a request comes and goes --------------------------------------------------------------

    def arrived(self) -> None:
        """A request takes a lease (on the hot path: one add and two tests while busy)."""
        self.requests += 1
        self.uses += 1
        if self.idle_since is not None or self.held_since is not None:
            self._arrive()

    def _arrive(self) -> None:
        now = self._clock.now()
        if self.idle_since is not None:
            self.history.add(now - self.idle_since)
            self.wasted = wasted_share(self.wasted, self.settings)
            self.idle_since = None
        self._close_idle(now)
        self._cancel_prewarm()
        if self._pending:
            self._settle("used")

    def ended(self) -> None:
        """The model's last lease ended: idle from now."""
        self._idle.touch()
        now = self._clock.now()
        self.held_since = now
        if self.requests == self._requests_at_end:
            return  # only an explicit load's lease: the plan counts from a request's end
        self._requests_at_end = self.requests
        self.idle_since = now
        if self.adaptive:
            self._follow(self.current_plan(now))

    def current_plan(self, now: float) -> Plan:
        """The plan for the history as it is (worked out again at most every REPLAN_EVERY_S
        while gaps keep coming, at every gap while the history is young)."""
        count = self.history.count
        if self.plan is None or (count != self._planned_count and (
                now - self._planned_at >= REPLAN_EVERY_S or count <= self.settings.min_history)):
            chosen = plan(self.history, self.fallback_s, self.settings, self.load_s,
                          self.wasted)
            if self.plan is None or chosen.reason != self.plan.reason:
                self._events.publish(KeepAlivePlanned(
                    self.name, chosen.reason, chosen.unload_after_s, chosen.prewarm_after_s,
                    chosen.keep_until_s))
            self.plan, self._planned_at, self._planned_count = chosen, now, count
        return self.plan

    def _follow(self, chosen: Plan) -> None:
        self._idle.retime(chosen.unload_after_s)
        self._cancel_prewarm()
        if chosen.prewarm_after_s is not None and self.idle_since is not None \
                and self._owner.on_demand and not self._retired:
            self.prewarm_at = self.idle_since + chosen.prewarm_after_s
            self._prewarm_timer = self._clock.call_later(
                max(self.prewarm_at - self._clock.now(), 0.0), self._prewarm_due)

    # --- pre-warming ---------------------------------------------------------------------------

    def _prewarm_due(self) -> None:
        self._prewarm_timer = None
        self.prewarm_at = None
        chosen = self.plan
        if chosen is None or self.idle_since is None or self._retired:
            return
        state = self._owner.state
        if state is State.READY:  # not unloaded yet: it stays until keep_until instead
            self._idle.retime(chosen.keep_until_s)
            return
        if state is not State.UNLOADED:
            self._skip(f"the model is {state.value}")
            return
        if not self._budget.take():
            self._skip("rate_limit")
            return
        self._pending = True
        self._events.publish(Prewarm(self.name, "started"))
        # Spare what is expected back before this model's window ends.
        keep, after = chosen.keep_until_s, chosen.prewarm_after_s
        self._owner.start_prewarm(keep - after if keep is not None and after is not None
                                  else None)

    def _skip(self, why: str) -> None:
        self._settle("skipped", why)

    def _settle(self, outcome: str, detail: str = "") -> None:
        self._pending = False
        self.prewarms[outcome] += 1
        if outcome == "used" or (outcome == "wasted" and not detail):
            self.wasted = wasted_share(self.wasted, self.settings, outcome)
        self._events.publish(Prewarm(self.name, outcome, detail))

    def _cancel_prewarm(self) -> None:
        timer, self._prewarm_timer = self._prewarm_timer, None
        self.prewarm_at = None
        if timer is not None:
            timer.cancel()

    def retire(self) -> None:
        """The model is removed, or the daemon stops: no pre-warm any more."""
        self._retired = True
        self._cancel_prewarm()

    # --- loads and unloads ---------------------------------------------------------------------

    def loaded(self, cause: str, seconds: float) -> None:
        """The model's first replica serves, loaded because of `cause`."""
        self.loaded_by, self.load_s = cause, seconds
        self.uses = 1 if cause == "request" else 0
        self._events.publish(ColdStart(self.name, cause, seconds))
        self._idle.touch()
        now = self._clock.now()
        self.held_since = now
        if not self.adaptive:
            return
        chosen = self.plan
        if cause == "prewarm" and chosen is not None and chosen.keep_until_s is not None \
                and self.idle_since is not None:
            self._idle.retime(max(self.idle_since + chosen.keep_until_s - now, 0.0))
        else:
            self._idle.retime(self.fallback_s)

    def load_failed(self, why: str) -> None:
        """The load did not happen (memory, or the load raised)."""
        if self._pending:
            self._settle("skipped", why)

    def unloading(self, reason: str = "idle") -> None:
        """An unload starts (`reason`: engine/model.py's): the model holds no idle memory from
        now. A pre-warm nobody used is wasted; the policy is charged for it only when its own
        window ran out ("idle"), not when memory pressure or an operator took the model."""
        self._close_idle(self._clock.now())
        if self._pending:
            self._settle("wasted", "" if reason == "idle" else reason)

    # --- reading -------------------------------------------------------------------------------

    def _close_idle(self, now: float) -> None:
        since, self.held_since = self.held_since, None
        if since is not None:
            self.idle_byte_seconds += (now - since) * (self._owner.resident_bytes() or 0)

    def idle_memory(self, now: float) -> float:
        """Byte-seconds the model has held loaded and idle, the idle period now included."""
        held = self.idle_byte_seconds
        if self.held_since is not None:
            held += (now - self.held_since) * (self._owner.resident_bytes() or 0)
        return held

    def next_use_s(self, now: float) -> float | None:
        """Seconds until the next request is expected (policy.py's `next_arrival_s`, as the
        benchmark's simulator reads it; a fixed model's from its median gap, which cost-aware
        eviction reads too): None while busy, with a young history, or overdue."""
        chosen = self.plan if self.adaptive else self._fixed
        if chosen is None or self.idle_since is None:
            return None
        return next_arrival_s(self.history, chosen, now - self.idle_since, self.settings)
