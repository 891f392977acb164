"""Typed, immutable pictures of the engine at one moment: the server, each device, each model
and each of its replicas. The engine builds them; the transports only serialise them
(`api/status.py` for `/admin/status`). Times are plain numbers: durations in seconds,
timestamps in seconds since the epoch (`None` when there is none); formatting is the reader's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from snoozeml.engine.observe.recent import RecentEvent


@dataclass(frozen=True, slots=True)
class ServerSnapshot:
    name: str
    version: str
    started_at: float  # epoch seconds
    uptime_s: float
    draining: bool


@dataclass(frozen=True, slots=True)
class DeviceSnapshot:
    name: str  # "cpu", "cuda:0", ...
    total_bytes: int
    budget_bytes: int
    used_bytes: int  # held by models (measured, or predicted before the first load)
    reserved_bytes: int  # held for a load in progress (its peak)
    process_bytes: int  # what the process uses on the device (RSS for the host)


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    index: int
    device: str
    state: str  # loading, ready, draining
    in_flight: int  # requests leased to it: queued or running
    queued: int
    inline: bool  # very short batches run on the event loop
    batches: int  # batches it ran
    requests: int  # requests those batches held
    measured_bytes: int | None  # None while it loads
    loaded_at: float | None  # epoch seconds; None while it loads


@dataclass(frozen=True, slots=True)
class ScalingSnapshot:
    min: int
    max: int
    strategy: str
    target_queue: float
    scale_up_after_s: float
    scale_down_after_s: float
    devices: tuple[str, ...]  # where replicas may go (their budgets)
    intra_op_threads: int  # per replica
    desired: int | None  # what the autoscaler last decided; None when it does not scale
    blocked: str | None  # why no replica can be added, while the model wants one
    last_error: str | None  # the last failed add's
    added: int  # replicas added beyond each load's first
    removed: int  # replicas drained and closed by scaling down
    failures: int  # adds that memory refused or whose load failed


@dataclass(frozen=True, slots=True)
class BatchingSnapshot:
    enabled: bool  # the policy in force (batching may have turned itself off)
    max_batch_size: int
    max_delay_s: float
    max_queue: int
    inline: bool
    batches: int
    requests: int
    rows: int
    largest_batch: int  # requests in the largest batch
    queue_wait_s: float  # summed over requests
    run_s: float  # summed over batches
    queue_timeouts: int
    queue_full: int
    dropped: int


@dataclass(frozen=True, slots=True)
class KeepAliveSnapshot:
    """What the model's keep-alive decided (engine/keepalive/keeper.py). The windows count
    from the end of the model's last request; all None for a fixed one."""

    mode: str  # "fixed" or "adaptive"
    reason: str | None  # the plan's: "learned", "fallback: ...", "pinned"; None when fixed
    unload_after_s: float | None
    prewarm_after_s: float | None
    keep_until_s: float | None
    prewarm_at: float | None  # epoch seconds of the armed pre-warm
    next_arrival_at: float | None  # epoch seconds the next request is likely at
    history: int  # idle gaps recorded
    loaded_by: str | None  # the last load's cause: request, prewarm, explicit, preload, ...
    prewarms_used: int
    prewarms_wasted: int
    prewarms_skipped: int
    idle_memory_byte_seconds: float  # held loaded and idle, ever


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    name: str
    origin: str  # config (models.toml), repository or modelmesh (added at run time)
    format: str | None  # onnx, torch
    device: str
    pinned: bool
    state: str
    reason: str
    replicas: tuple[ReplicaSnapshot, ...]
    scaling: ScalingSnapshot
    in_flight: int
    queued: int
    last_used: float | None  # epoch seconds of the last lease's end
    expires_at: float | None  # epoch seconds the idle timer will unload it at
    idle_timeout_s: float | None
    predicted_bytes: int | None
    measured_bytes: int | None
    resident_bytes: int
    last_load_ms: float | None
    loads: int
    load_failures: int
    requests: int
    errors: int
    batching: BatchingSnapshot
    keep_alive: KeepAliveSnapshot | None = None


@dataclass(frozen=True, slots=True)
class StatusSnapshot:
    server: ServerSnapshot
    devices: tuple[DeviceSnapshot, ...]
    evictions: Mapping[str, int]  # unload reason (memory_pressure, oom) -> models evicted
    models: tuple[ModelSnapshot, ...]
    auth_refusals: Mapping[str, int] = field(default_factory=dict)  # unauthenticated/forbidden
    recent_events: tuple[RecentEvent, ...] = ()  # oldest first
