"""The counters of /admin/status (engine/observe/counters.py): they sum what the events on the
bus say, per model and per eviction reason."""

from __future__ import annotations

from snoozeml.engine.events import (
    BatchRun,
    EventBus,
    Evicting,
    InferenceFailed,
    InferenceStarted,
    LoadFailed,
    LoadFinished,
    OomRetry,
    QueueFull,
    QueueTimedOut,
    RequestDropped,
    RequestFinished,
)
from snoozeml.engine.observe.counters import Counters
from snoozeml.operations import Operation


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
