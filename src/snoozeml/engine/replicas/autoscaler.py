"""Replica autoscaling: a pure `desired_replicas` decides, a small reconcile loop acts.

Every `tick` the loop samples each watched model's load (queued + running requests on its ready
replicas) into two sliding windows, one `scale_up_after` long and one `scale_down_after` long,
asks `desired_replicas` how many replicas the model should have, and takes one step towards it:
it adds a replica (memory permitting, at once) or drains one. Each step resets both windows, so
the next one needs a whole window of evidence with the new count: replicas come one at a time,
and one just added is not removed within `scale_down_after`.

The loop runs only while some watched model (`replicas.max` > 1) is READY: the event stream
(`StateChanged`) wakes it, and it stops when the server drains. The last replica is not its
business: a model with `min = 0` goes to zero by its idle timer, and a request brings it back.

Invariants:
- At most one replica is being added or removed per model (the model's scaling lock).
- A scaling step is never cancelled half way (its load or drain runs to the end); `stop` waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

from snoozeml.config.settings import ReplicasConfig
from snoozeml.engine.clock import Clock
from snoozeml.engine.events import Draining, EventBus, StateChanged
from snoozeml.engine.lifecycle import State, load_backoff
from snoozeml.engine.model import Model
from snoozeml.errors import describe_exception
from snoozeml.logs import log_event

# --- the pure policy ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    min: int
    max: int
    target_queue: float  # queued + running requests per replica above which the model grows
    scale_up_after: float
    scale_down_after: float

    @classmethod
    def of(cls, conf: ReplicasConfig, most: int | None = None) -> ScalePolicy:
        """The model's policy; `most` lowers `max` (no more CPU replicas than cores)."""
        top = conf.max if most is None else min(conf.max, most)
        return cls(min(conf.min, top), top, float(conf.target_queue), conf.scale_up_after,
                   conf.scale_down_after)


@dataclass(frozen=True, slots=True)
class ScaleStats:
    """What the decision looks at, for one model at one moment."""

    ready: int  # replicas serving requests
    changing: bool = False  # a replica is being added or drained
    # Mean queued + running requests over the last scale_up_after (scale_down_after); None
    # until the model has been watched that long since its last change.
    mean_load_up: float | None = None
    mean_load_down: float | None = None
    retry_at: float = 0.0  # an add failed (memory refused it, or its load): none before this


def desired_replicas(stats: ScaleStats, now: float, policy: ScalePolicy) -> int:
    """How many ready replicas the model should have: at most one more or one fewer than it
    has. Up while the mean load per replica stayed above `target_queue` for `scale_up_after`
    (and no failed add asks to wait); down once the load of the last `scale_down_after` would
    have fitted in one replica fewer; never below `min` (nor below one: the last replica
    follows the idle timer), never above `max`."""
    ready = stats.ready
    if ready == 0 or stats.changing:
        return ready  # not loaded (a request loads it), or one step at a time
    floor = max(policy.min, 1)
    may_add = now >= stats.retry_at
    if ready < floor:
        return ready + 1 if may_add else ready
    if ready > policy.max:
        return ready - 1
    up = stats.mean_load_up
    if ready < policy.max and up is not None and up > policy.target_queue * ready:
        return ready + 1 if may_add else ready
    down = stats.mean_load_down
    if ready > floor and down is not None and down <= policy.target_queue * (ready - 1):
        return ready - 1
    return ready


class LoadWindow:
    """The mean of the samples of the last `span` seconds; None until `span` has passed since
    the last reset."""

    def __init__(self, span: float) -> None:
        self.span = span
        self._samples: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self._since: float | None = None

    def reset(self, now: float) -> None:
        self._samples.clear()
        self._sum = 0.0
        self._since = now

    def add(self, now: float, value: float) -> None:
        if self._since is None:
            self._since = now
        samples = self._samples
        samples.append((now, value))
        self._sum += value
        while samples[0][0] < now - self.span:
            self._sum -= samples.popleft()[1]

    def mean(self, now: float) -> float | None:
        if self._since is None or now - self._since < self.span or not self._samples:
            return None
        return self._sum / len(self._samples)


# --- the reconcile loop ---------------------------------------------------------------------


class _Watch:
    """The loop's memory of one model."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.policy = ScalePolicy.of(model.spec.replicas, model.replicas.max_replicas)
        self.up = LoadWindow(self.policy.scale_up_after)
        self.down = LoadWindow(self.policy.scale_down_after)
        self.ready = -1  # the count the windows were filled with
        self.step: asyncio.Task[None] | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.desired = 0

    def reset(self, now: float, ready: int) -> None:
        self.up.reset(now)
        self.down.reset(now)
        self.ready = ready


class Autoscaler:
    def __init__(self, models: Iterable[Model], events: EventBus, clock: Clock) -> None:
        self._watches: dict[str, _Watch] = {}
        self._events = events
        self._clock = clock
        self.tick = 0.1
        self._wake = asyncio.Event()
        self._started = False
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        for model in models:
            self.watch(model)
        self._unsubscribe = events.subscribe_each({StateChanged: self._on_state,
                                                   Draining: self._on_draining})

    def watch(self, model: Model) -> None:
        """Scale `model` from now on (if it may have more than one replica): at start, and for
        a model added at run time."""
        most, wanted = model.replicas.max_replicas, model.spec.replicas.max
        if most < wanted:
            log_event("replicas_capped", logging.WARNING, model=model.name, max=wanted,
                      cpu_replicas=most, reason="one replica per core; set "
                      "intra_op_threads to choose threads and replicas yourself")
        if most <= 1:
            return
        self._watches[model.name] = _Watch(model)
        spans = [span for w in self._watches.values()
                 for span in (w.policy.scale_up_after, w.policy.scale_down_after)]
        # Ten samples per window at least, and no busier than 100 a second.
        self.tick = min(max(min(spans) / 10, 0.01), 0.25)
        if self._started:
            self.start()
        self._wake.set()

    async def unwatch(self, name: str) -> None:
        """Stop scaling the model `name`; waits for a step of it already under way."""
        watch = self._watches.pop(name, None)
        if watch is not None and watch.step is not None:
            await asyncio.gather(watch.step, return_exceptions=True)

    def desired(self, name: str) -> int | None:
        """The replica count last decided for `name`; None when it does not scale."""
        watch = self._watches.get(name)
        return watch.desired if watch is not None else None

    def start(self) -> None:
        self._started = True
        if self._watches and self._task is None and not self._stopping:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop deciding; wait for a step already under way (a load or a drain)."""
        self._stopping = True
        self._unsubscribe()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        steps = [w.step for w in self._watches.values() if w.step is not None]
        await asyncio.gather(*steps, return_exceptions=True)

    def _on_state(self, event: StateChanged) -> None:
        if event.model in self._watches:
            self._wake.set()

    def _on_draining(self, event: Draining) -> None:
        self._stopping = True
        self._wake.set()

    async def _run(self) -> None:
        while not self._stopping:
            active = []
            for watch in self._watches.values():
                if watch.model.state is State.READY:
                    active.append(watch)
                elif watch.step is None:  # it starts afresh when it is next loaded
                    watch.ready = -1
                    watch.desired = 0
            if not active:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self._clock.now()
            for watch in active:
                try:
                    self._reconcile(watch, now)
                except Exception as exc:  # boundary: one model's trouble stops nothing
                    log_event("autoscaler_failed", logging.ERROR, model=watch.model.name,
                              error=describe_exception(exc))
            await asyncio.sleep(self.tick)

    def _reconcile(self, watch: _Watch, now: float) -> None:
        model = watch.model
        replicas = model.replicas
        ready = len(replicas.ready)
        changing = watch.step is not None or model.scaling or replicas.draining > 0
        if changing or ready != watch.ready:
            watch.reset(now, ready)
        load = replicas.load
        watch.up.add(now, load)
        watch.down.add(now, load)
        stats = ScaleStats(ready, changing, watch.up.mean(now), watch.down.mean(now),
                           watch.retry_at)
        watch.desired = desired = desired_replicas(stats, now, watch.policy)
        if desired > ready:
            colder_than = now - watch.policy.scale_up_after  # spare what the spike used
            watch.step = asyncio.get_running_loop().create_task(
                self._add(watch, colder_than, desired))
        elif desired < ready:
            watch.step = asyncio.get_running_loop().create_task(self._remove(watch, desired))
        elif model.steps.blocked is not None and not changing and \
                desired_replicas(replace(stats, retry_at=0.0), now, watch.policy) <= ready:
            model.steps.blocked = None  # the model no longer wants one: the episode is over

    async def _add(self, watch: _Watch, colder_than: float, desired: int) -> None:
        try:
            await watch.model.steps.add_replica(colder_than, until=desired)
            watch.failures = 0
            watch.retry_at = 0.0
        except Exception:  # published by the model (ReplicaFailed): wait before the next try
            watch.failures += 1
            wait = max(watch.policy.scale_up_after, load_backoff(watch.failures, cap=60.0))
            watch.retry_at = self._clock.now() + wait
        finally:
            watch.step = None

    async def _remove(self, watch: _Watch, desired: int) -> None:
        try:
            await watch.model.steps.remove_replica(until=desired)
        except Exception as exc:  # boundary of a background step
            log_event("replica_remove_failed", logging.ERROR, model=watch.model.name,
                      error=describe_exception(exc))
        finally:
            watch.step = None
