"""/admin/status's JSON made from a typed snapshot (api/status.py): means per batch and per
request in milliseconds, times in ISO 8601, nothing where a model never ran."""

from __future__ import annotations

from snoozeml.api.status import iso_time, status_json
from snoozeml.engine.observe.snapshots import (
    BatchingSnapshot,
    DeviceSnapshot,
    KeepAliveSnapshot,
    ModelSnapshot,
    ScalingSnapshot,
    ServerSnapshot,
    StatusSnapshot,
)


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


def snapshot_of(model_batching: BatchingSnapshot, last_used: float | None,
                keep_alive: KeepAliveSnapshot | None = None) -> StatusSnapshot:
    model = ModelSnapshot(
        origin="config",
        name="m", format="onnx", device="cpu", pinned=False, state="UNLOADED", reason="",
        replicas=(), scaling=SCALING, in_flight=0, queued=0, last_used=last_used,
        expires_at=None,
        idle_timeout_s=300.0, predicted_bytes=1100, measured_bytes=None, resident_bytes=0,
        last_load_ms=None, loads=0, load_failures=0, requests=0, errors=0,
        batching=model_batching, keep_alive=keep_alive,
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


def test_the_keep_alive_shows_its_plan_windows_times_and_counts() -> None:
    keep = KeepAliveSnapshot(
        mode="adaptive", reason="learned", unload_after_s=0.0, prewarm_after_s=13.5,
        keep_until_s=18.2, prewarm_at=1_800_000_013.5, next_arrival_at=1_800_000_015.0,
        history=12, loaded_by="prewarm", prewarms_used=3, prewarms_wasted=1,
        prewarms_skipped=0, idle_memory_byte_seconds=1234.56789)
    doc = status_json(snapshot_of(batching(), last_used=None, keep_alive=keep))
    assert doc["models"][0]["keep_alive"] == {
        "mode": "adaptive", "reason": "learned", "unload_after_s": 0.0,
        "prewarm_after_s": 13.5, "keep_until_s": 18.2,
        "prewarm_at": "2027-01-15T08:00:13.500Z", "next_arrival_at": "2027-01-15T08:00:15.000Z",
        "history": 12, "loaded_by": "prewarm",
        "prewarms": {"used": 3, "wasted": 1, "skipped": 0},
        "idle_memory_byte_seconds": 1234.568}
    assert status_json(snapshot_of(batching(), None))["models"][0]["keep_alive"] is None
