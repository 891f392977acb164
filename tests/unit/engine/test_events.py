"""The event bus, the counters that subscribe to it, and /admin/status's JSON made from a typed
snapshot."""

from __future__ import annotations

import asyncio

from snoozeml.api.status import iso_time, status_json
from snoozeml.engine.events import (
    BatchRun,
    EngineEvent,
    EventBus,
    Evicting,
    InferenceFailed,
    InferenceStarted,
    LoadFailed,
    LoadFinished,
    ModelIdle,
    OomRetry,
    QueueFull,
    QueueTimedOut,
    RequestDropped,
    RequestFinished,
)
from snoozeml.engine.observe.counters import Counters
from snoozeml.engine.observe.snapshots import (
    BatchingSnapshot,
    DeviceSnapshot,
    ModelSnapshot,
    ScalingSnapshot,
    ServerSnapshot,
    StatusSnapshot,
)
from snoozeml.operations import Operation

# --- the bus ----------------------------------------------------------------------------------


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


# --- counters ------------------------------------------------------------------------------------


def test_counters_sum_what_the_events_say() -> None:
    counters = Counters(["m", "other"])
    bus = EventBus()
    counters.subscribe(bus)
    for event in (
        InferenceStarted("m"),
        InferenceStarted("m"),
        InferenceFailed("m"),
        InferenceStarted("m"),  # its client left: nothing more
        # What the transports record is theirs (the request log; metrics), not these counters.
        RequestFinished(Operation.INFER, "http", "m", "invalid_input", 400, 0.0),
        BatchRun("m", 0, 5, (0.002, 0.004), 0.010, False),
        BatchRun("m", 0, 1, (0.001,), 0.005, True),
        LoadFinished("m", 0, "cpu", 0.25, 1000),
        LoadFailed("m", "broken", 1.0, 0.1),
        QueueFull("m", 8),
        QueueTimedOut("m"),
        RequestDropped("m"),
        Evicting("other", "cpu", 100, ("m",)),
        OomRetry("other", "cpu", "run", "out of memory", ("a", "b")),
        OomRetry("other", "cpu", "run", "out of memory", ()),
    ):
        bus.publish(event)
    m = counters.model("m")
    assert (m.requests, m.errors) == (3, 1)
    assert (m.batches, m.batched_requests, m.rows, m.largest_batch) == (2, 3, 6, 2)
    assert abs(m.queue_wait_s - 0.007) < 1e-12
    assert abs(m.run_s - 0.015) < 1e-12
    assert (m.loads, m.load_failures, m.last_load_ms) == (1, 1, 250.0)
    assert (m.queue_full, m.queue_timeouts, m.dropped) == (1, 1, 1)
    assert counters.evictions == {"memory_pressure": 1, "oom": 2}
    assert counters.model("other").requests == 0


# --- /admin/status from a snapshot -------------------------------------------------------------


def batching(**overrides: object) -> BatchingSnapshot:
    values: dict[str, object] = dict(
        enabled=True, max_batch_size=32, max_delay_s=0.002, max_queue=1024, inline=False,
        batches=0, requests=0, rows=0, largest_batch=0, queue_wait_s=0.0, run_s=0.0,
        queue_timeouts=0, queue_full=0, dropped=0,
    )
    values.update(overrides)
    return BatchingSnapshot(**values)  # type: ignore[arg-type]


SCALING = ScalingSnapshot(
    min=0, max=1, strategy="least-queue", target_queue=4.0, scale_up_after_s=1.0,
    scale_down_after_s=30.0, devices=("cpu",), intra_op_threads=2, desired=None, blocked=None,
    last_error=None, added=0, removed=0, failures=0,
)


def snapshot_of(model_batching: BatchingSnapshot, last_used: float | None) -> StatusSnapshot:
    model = ModelSnapshot(
        origin="config",
        name="m", format="onnx", device="cpu", pinned=False, state="UNLOADED", reason="",
        replicas=(), scaling=SCALING, in_flight=0, queued=0, last_used=last_used,
        expires_at=None,
        idle_timeout_s=300.0, predicted_bytes=1100, measured_bytes=None, resident_bytes=0,
        last_load_ms=None, loads=0, load_failures=0, requests=0, errors=0,
        batching=model_batching,
    )
    return StatusSnapshot(
        ServerSnapshot("snoozeml", "0.1.0", 1_800_000_000.25, 12.3456, False),
        (DeviceSnapshot("cpu", 100, 80, 0, 0, 50),),
        {},
        (model,),
    )


def test_a_model_that_never_ran_has_no_means_and_no_times() -> None:
    doc = status_json(snapshot_of(batching(), last_used=None))
    model = doc["models"][0]
    assert model["batching"]["batches"] == 0
    assert model["batching"]["mean_requests_per_batch"] is None
    assert model["batching"]["mean_queue_wait_ms"] is None
    assert (model["last_used"], model["expires_at"]) == (None, None)
    assert (model["replicas"], model["replica_details"]) == (0, [])
    assert doc["server"] == {"name": "snoozeml", "version": "0.1.0",
                             "started_at": "2027-01-15T08:00:00.250Z", "uptime_s": 12.346,
                             "draining": False}


def test_means_are_per_batch_and_per_request_in_milliseconds() -> None:
    doc = status_json(snapshot_of(
        batching(batches=2, requests=3, rows=6, largest_batch=2, queue_wait_s=0.006,
                 run_s=0.010), last_used=1_800_000_001.0))
    stats = doc["models"][0]["batching"]
    assert (stats["mean_requests_per_batch"], stats["mean_rows_per_batch"]) == (1.5, 3.0)
    assert (stats["mean_queue_wait_ms"], stats["mean_run_ms"]) == (2.0, 5.0)
    assert doc["models"][0]["last_used"] == iso_time(1_800_000_001.0)
