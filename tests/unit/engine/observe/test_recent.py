"""The recent events of /admin/status: what the bus said about loads, unloads, evictions and
replicas, newest last, bounded, each with its time and one line of detail."""

from __future__ import annotations

from snoozeml.api.status import status_json
from snoozeml.engine.events import (
    EventBus,
    Evicting,
    InferenceStarted,
    LoadFailed,
    LoadFinished,
    ReplicaFailed,
    Unloaded,
)
from snoozeml.engine.observe.recent import RecentEvent, RecentEvents
from snoozeml.engine.observe.snapshots import DeviceSnapshot, ServerSnapshot, StatusSnapshot


def recorder(limit: int = 100) -> tuple[EventBus, RecentEvents, list[float]]:
    bus = EventBus()
    now = [1_800_000_000.0]
    recent = RecentEvents(limit, wall=lambda: now[0])
    recent.subscribe(bus)
    return bus, recent, now


def test_loads_unloads_evictions_and_failures_are_kept_with_their_time() -> None:
    bus, recent, now = recorder()
    bus.publish(LoadFinished("mlp", 0, "cpu", 0.0842, 2 * 1024 * 1024))
    now[0] += 1
    bus.publish(InferenceStarted("mlp"))  # requests are not events of this list
    bus.publish(Evicting("big", "cpu", 4096, ("mlp",)))
    now[0] += 1
    bus.publish(Unloaded("mlp", "memory_pressure", 2 * 1024 * 1024))
    bus.publish(LoadFailed("broken", "model 'broken' failed to load: bad file", 2.0, 0.01))
    assert recent.events() == (
        RecentEvent(1_800_000_000.0, "model_loaded", "mlp", "replica 0 on cpu in 84 ms, 2.0MiB"),
        RecentEvent(1_800_000_001.0, "memory_evicting", "big",
                    "evicting mlp on cpu to make 4.0KiB of room"),
        RecentEvent(1_800_000_002.0, "model_unloaded", "mlp", "memory_pressure, freed 2.0MiB"),
        RecentEvent(1_800_000_002.0, "model_load_failed", "broken",
                    "model 'broken' failed to load: bad file (retry in 2s)"),
    )


def test_a_refused_replica_is_kept_once_per_episode() -> None:
    bus, recent, _ = recorder()
    for first in (True, False, False):
        bus.publish(ReplicaFailed("mlp", "not enough memory", True, first))
    assert [(e.kind, e.detail) for e in recent.events()] == [
        ("replica_refused", "not enough memory")]


def test_only_the_last_ones_are_kept_and_status_shows_them_oldest_first() -> None:
    bus, recent, now = recorder(limit=3)
    for i in range(5):
        now[0] = 1_800_000_000.0 + i
        bus.publish(Unloaded(f"m{i}", "idle", 0))
    assert [e.model for e in recent.events()] == ["m2", "m3", "m4"]
    snapshot = StatusSnapshot(
        ServerSnapshot("snoozeml", "0.1.0", 1_800_000_000.0, 1.0, False),
        (DeviceSnapshot("cpu", 100, 80, 0, 0, 50),), {}, (), {}, recent.events())
    assert status_json(snapshot)["recent_events"][0] == {
        "time": "2027-01-15T08:00:02.000Z", "kind": "model_unloaded", "model": "m2",
        "detail": "idle, freed 0B"}
