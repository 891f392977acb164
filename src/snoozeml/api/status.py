"""`/admin/status` as JSON: the engine's typed snapshot, serialised (timestamps as ISO 8601 UTC
with milliseconds, durations as numbers), and the process's own resources read at that moment.
The monitor reads this; so does `bench/run.py soak`, for the asyncio tasks no outside tool sees."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from snoozeml.engine.memory.probes import process_rss
from snoozeml.engine.observe.snapshots import (
    BatchingSnapshot,
    DeviceSnapshot,
    KeepAliveSnapshot,
    ModelSnapshot,
    ReplicaSnapshot,
    ScalingSnapshot,
    StatusSnapshot,
)


def status_json(snapshot: StatusSnapshot) -> dict[str, Any]:
    server = snapshot.server
    return {
        "server": {
            "name": server.name,
            "version": server.version,
            "started_at": iso_time(server.started_at),
            "uptime_s": round(server.uptime_s, 3),
            "draining": server.draining,
        },
        "devices": [_device(device) for device in snapshot.devices],
        "evictions": dict(snapshot.evictions),
        "auth_refusals": dict(snapshot.auth_refusals),
        "recent_events": [
            {"time": iso_time(e.time), "kind": e.kind, "model": e.model, "detail": e.detail}
            for e in snapshot.recent_events
        ],
        "models": [_model(model) for model in snapshot.models],
        "process": process_json(),
    }


def process_json() -> dict[str, Any]:
    """The daemon process's resources now: cheap reads of /proc (tens of microseconds), so a
    leak shows in `/admin/status` polled over hours. `asyncio_tasks` counts the running event
    loop's unfinished tasks, the one answering this request included; it is None when called
    off the loop (only the loop's own thread can count its tasks)."""
    try:
        tasks: int | None = len(asyncio.all_tasks())
    except RuntimeError:  # no running event loop in this thread
        tasks = None
    return {
        "pid": os.getpid(),
        "rss_bytes": process_rss(),
        "open_fds": _open_fds(),
        "threads": _threads(),
        "asyncio_tasks": tasks,
    }


def _open_fds() -> int | None:
    try:
        # Listing the folder opens one descriptor of its own, which is not the daemon's.
        return len(os.listdir("/proc/self/fd")) - 1
    except OSError:
        pass
    import psutil  # here, not at start: the first status read pays its import

    try:
        return psutil.Process().num_fds()
    except (AttributeError, psutil.Error):  # no such count on this platform
        return None


def _threads() -> int | None:
    import psutil

    try:
        return psutil.Process().num_threads()
    except psutil.Error:
        return None


def _device(device: DeviceSnapshot) -> dict[str, Any]:
    return {
        "name": device.name,
        "total_bytes": device.total_bytes,
        "budget_bytes": device.budget_bytes,
        "used_bytes": device.used_bytes,
        "reserved_bytes": device.reserved_bytes,
        "process_bytes": device.process_bytes,
    }


def _model(model: ModelSnapshot) -> dict[str, Any]:
    return {
        "name": model.name,
        "origin": model.origin,
        "format": model.format,
        "device": model.device,
        "pinned": model.pinned,
        "state": model.state,
        "reason": model.reason,
        # A count, as before replicas could scale: those running (ready or draining).
        "replicas": sum(1 for r in model.replicas if r.state != "loading"),
        "replica_details": [_replica(replica) for replica in model.replicas],
        "scaling": _scaling(model.scaling),
        "in_flight": model.in_flight,
        "queued": model.queued,
        "last_used": iso_time(model.last_used),
        "expires_at": iso_time(model.expires_at),
        "idle_timeout_s": model.idle_timeout_s,
        "predicted_bytes": model.predicted_bytes,
        "measured_bytes": model.measured_bytes,
        "resident_bytes": model.resident_bytes,
        "last_load_ms": model.last_load_ms,
        "loads": model.loads,
        "load_failures": model.load_failures,
        "requests": model.requests,
        "errors": model.errors,
        "batching": _batching(model.batching),
        "keep_alive": _keep_alive(model.keep_alive) if model.keep_alive else None,
    }


def _keep_alive(keep: KeepAliveSnapshot) -> dict[str, Any]:
    return {
        "mode": keep.mode,
        "reason": keep.reason,
        "unload_after_s": keep.unload_after_s,
        "prewarm_after_s": keep.prewarm_after_s,
        "keep_until_s": keep.keep_until_s,
        "prewarm_at": iso_time(keep.prewarm_at),
        "next_arrival_at": iso_time(keep.next_arrival_at),
        "history": keep.history,
        "loaded_by": keep.loaded_by,
        "prewarms": {"used": keep.prewarms_used, "wasted": keep.prewarms_wasted,
                     "skipped": keep.prewarms_skipped},
        "idle_memory_byte_seconds": round(keep.idle_memory_byte_seconds, 3),
    }


def _replica(replica: ReplicaSnapshot) -> dict[str, Any]:
    return {
        "index": replica.index,
        "device": replica.device,
        "state": replica.state,
        "in_flight": replica.in_flight,
        "queued": replica.queued,
        "inline": replica.inline,
        "batches": replica.batches,
        "requests": replica.requests,
        "measured_bytes": replica.measured_bytes,
        "loaded_at": iso_time(replica.loaded_at),
    }


def _scaling(scaling: ScalingSnapshot) -> dict[str, Any]:
    return {
        "min": scaling.min,
        "max": scaling.max,
        "strategy": scaling.strategy,
        "target_queue": scaling.target_queue,
        "scale_up_after_s": scaling.scale_up_after_s,
        "scale_down_after_s": scaling.scale_down_after_s,
        "devices": list(scaling.devices),
        "intra_op_threads": scaling.intra_op_threads,
        "desired": scaling.desired,
        "blocked": scaling.blocked,
        "last_error": scaling.last_error,
        "added": scaling.added,
        "removed": scaling.removed,
        "failures": scaling.failures,
    }


def _batching(batching: BatchingSnapshot) -> dict[str, Any]:
    return {
        "enabled": batching.enabled,
        "max_batch_size": batching.max_batch_size,
        "max_delay_s": batching.max_delay_s,
        "max_queue": batching.max_queue,
        "inline": batching.inline,
        "batches": batching.batches,
        "requests": batching.requests,
        "rows": batching.rows,
        "mean_requests_per_batch": _ratio(batching.requests, batching.batches),
        "mean_rows_per_batch": _ratio(batching.rows, batching.batches),
        "largest_batch": batching.largest_batch,
        "mean_queue_wait_ms": _ratio(batching.queue_wait_s * 1000, batching.requests),
        "mean_run_ms": _ratio(batching.run_s * 1000, batching.batches),
        "queue_timeouts": batching.queue_timeouts,
        "queue_full": batching.queue_full,
        "dropped": batching.dropped,
    }


def _ratio(a: float, b: int) -> float | None:
    return round(a / b, 3) if b else None


def iso_time(stamp: float | None) -> str | None:
    """Epoch seconds as `2026-12-01T20:41:35.123Z`."""
    if stamp is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp % 1 * 1000):03d}Z"
