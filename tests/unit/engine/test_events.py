"""The event bus (engine/events.py): subscribers see every event, or the kinds they asked for,
in order; a failing one harms no other; `changed` is set by state-changing events only. (The
counters that subscribe to it: tests/unit/engine/observe/test_counters.py.)"""

from __future__ import annotations

import asyncio

from snoozeml.engine.events import (
    BatchRun,
    EngineEvent,
    EventBus,
    ModelIdle,
    QueueFull,
    QueueTimedOut,
)


def test_subscribers_see_every_event_in_order_until_they_unsubscribe() -> None:
    bus = EventBus()
    first: list[EngineEvent] = []
    second: list[EngineEvent] = []
    unsubscribe = bus.subscribe(first.append)
    bus.subscribe(second.append)
    bus.publish(ModelIdle("a"))
    unsubscribe()
    bus.publish(ModelIdle("b"))
    assert first == [ModelIdle("a")]
    assert second == [ModelIdle("a"), ModelIdle("b")]


def test_a_subscription_to_some_kinds_sees_only_those() -> None:
    bus = EventBus()
    idle: list[EngineEvent] = []
    runs: list[EngineEvent] = []
    everything: list[EngineEvent] = []
    bus.subscribe(idle.append, [ModelIdle])
    unsubscribe = bus.subscribe_each({BatchRun: runs.append, QueueFull: runs.append})
    bus.subscribe(everything.append)
    events = [ModelIdle("a"), BatchRun("a", 0, 1, (0.0,), 0.1, False), QueueFull("a", 3),
              QueueTimedOut("a")]
    for event in events:
        bus.publish(event)
    unsubscribe()
    bus.publish(QueueFull("a", 4))
    assert idle == events[:1]
    assert runs == events[1:3]
    assert everything == [*events, QueueFull("a", 4)]


def test_a_failing_subscriber_neither_fails_the_publisher_nor_starves_the_others() -> None:
    bus = EventBus()
    seen: list[EngineEvent] = []

    def broken(event: EngineEvent) -> None:
        raise RuntimeError("a subscriber's bug")

    bus.subscribe(broken)
    bus.subscribe(seen.append)
    bus.publish(ModelIdle("a"))
    assert seen == [ModelIdle("a")]


def test_changed_is_set_by_state_changing_events_only() -> None:
    async def scenario() -> list[bool]:
        bus = EventBus()
        changed = bus.changed()
        bus.publish(BatchRun("m", 0, 1, (0.0,), 0.001, False))  # traffic: nothing to re-read
        after_batch = changed.is_set()
        bus.publish(ModelIdle("m"))  # memory may be free now
        after_idle = changed.is_set()
        return [after_batch, after_idle, bus.changed() is not changed]

    assert asyncio.run(scenario()) == [False, True, True]
