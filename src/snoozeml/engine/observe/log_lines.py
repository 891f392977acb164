"""The log lines of engine events: one subscriber of the event bus turns each event into its
structured `event key=value` line (`model_loaded model=minilm ms=84 bytes=1048576 device=cpu`).
The engine itself logs only failures of its own background tasks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from snoozeml.engine.events import (
    BatchingDisabled,
    EngineEvent,
    EventBus,
    Evicting,
    InlineDisabled,
    LoadDeferred,
    LoadFailed,
    LoadFinished,
    LoadStarted,
    ModelAdded,
    ModelRemoved,
    OomRetry,
    ReplicaAdded,
    ReplicaDraining,
    ReplicaFailed,
    ReplicaRemoved,
    ReplicaUpgraded,
    RequestFinished,
    Unloaded,
    UpgradeDeferred,
)
from snoozeml.engine.keepalive.events import ColdStart, KeepAlivePlanned, Prewarm
from snoozeml.logs import log_event


def subscribe_logs(bus: EventBus) -> Callable[[], None]:
    """Log every event that has a line; returns the unsubscribe."""
    return bus.subscribe_each(_LINES)


def _added(event: ModelAdded) -> None:
    log_event("model_added", model=event.model, origin=event.origin, path=event.path)


def _removed(event: ModelRemoved) -> None:
    log_event("model_removed", model=event.model, origin=event.origin)


def _load_started(event: LoadStarted) -> None:
    log_event("model_loading", model=event.model, path=event.path, device=event.device)


def _loaded(event: LoadFinished) -> None:
    log_event("model_loaded", model=event.model, ms=round(event.seconds * 1000.0, 1),
              bytes=event.bytes, device=event.device, reserved_bytes=event.reserved_bytes,
              peak_bytes=event.peak_bytes)


def _upgraded(event: ReplicaUpgraded) -> None:
    log_event("replica_upgraded", model=event.model, replica=event.replica,
              ms=round(event.seconds * 1000.0, 1), bytes=event.bytes, device=event.device)


def _upgrade_deferred(event: UpgradeDeferred) -> None:
    log_event("upgrade_deferred", logging.INFO if event.retry else logging.WARNING,
              model=event.model, replica=event.replica, reason=event.reason,
              retry=event.retry)


def _load_failed(event: LoadFailed) -> None:
    log_event("model_load_failed", logging.WARNING, model=event.model, error=event.error,
              retry_in_s=event.retry_in)


def _deferred(event: LoadDeferred) -> None:
    log_event("model_load_deferred", logging.WARNING, model=event.model, error=event.error)


def _unloaded(event: Unloaded) -> None:
    log_event("model_unloaded", model=event.model, reason=event.reason,
              freed_bytes=event.freed_bytes)


def _replica_added(event: ReplicaAdded) -> None:
    log_event("replica_added", model=event.model, replica=event.replica, device=event.device,
              replicas=event.replicas)


def _replica_draining(event: ReplicaDraining) -> None:
    log_event("replica_draining", model=event.model, replica=event.replica,
              replicas=event.replicas)


def _replica_removed(event: ReplicaRemoved) -> None:
    log_event("replica_removed", model=event.model, replica=event.replica, device=event.device,
              freed_bytes=event.freed_bytes, replicas=event.replicas)


def _replica_failed(event: ReplicaFailed) -> None:
    # Once per episode: a spike that memory cannot serve would otherwise log at every retry.
    level = logging.WARNING if event.first else logging.DEBUG
    log_event("replica_refused" if event.memory else "replica_load_failed", level,
              model=event.model, error=event.error)


def _evicting(event: Evicting) -> None:
    log_event("memory_evicting", model=event.model, device=event.device,
              needed_bytes=event.needed_bytes, victims=",".join(event.victims))


def _oom(event: OomRetry) -> None:
    if event.phase == "load":
        log_event("model_load_oom", logging.WARNING, model=event.model, error=event.error)
    log_event("memory_oom", logging.WARNING, model=event.model, device=event.device,
              evicting=",".join(event.victims) or "nothing")


def _cold_start(event: ColdStart) -> None:
    log_event("model_cold_start", logging.DEBUG, model=event.model, cause=event.cause,
              ms=round(event.seconds * 1000.0, 1))


def _prewarm(event: Prewarm) -> None:
    if event.outcome == "started":
        log_event("prewarm", model=event.model)
    elif event.outcome == "skipped":
        log_event("prewarm_skipped", model=event.model, reason=event.detail)
    elif event.outcome == "wasted":  # its window ran out, or it was unloaded for `detail`
        log_event("prewarm_wasted", model=event.model, reason=event.detail or "window_ended")
    else:
        log_event("prewarm_used", model=event.model)


def _planned(event: KeepAlivePlanned) -> None:
    log_event("keep_alive_plan", model=event.model, reason=event.reason,
              unload_after_s=_seconds(event.unload_after_s),
              prewarm_after_s=_seconds(event.prewarm_after_s),
              keep_until_s=_seconds(event.keep_until_s))


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _batching_disabled(event: BatchingDisabled) -> None:
    log_event("batching_disabled", logging.WARNING, model=event.model, reason=event.reason)


def _inline_disabled(event: InlineDisabled) -> None:
    log_event("inline_disabled", logging.INFO, model=event.model, reason=event.reason)


def _request(event: RequestFinished) -> None:
    if event.outcome in ("unauthenticated", "forbidden"):
        # Every refusal, with who when known; never a credential (the error says only
        # missing, invalid or expired, or which role was needed).
        who: dict[str, Any] = {"model": event.model} if event.model is not None else {}
        if event.principal is not None:
            who["principal"] = event.principal
        log_event("auth_refused", logging.WARNING, operation=event.operation.value,
                  protocol=event.protocol, status=event.status, **who, reason=event.error)
        return
    # Server-side failures only: a client's mistake (4xx) or a feature it asked for that we
    # lack (501) is answered, not logged; so is a "not ready" answer.
    if event.outcome in ("ok", "cancelled") or event.status < 500 or event.status == 501:
        return
    level = logging.ERROR if event.outcome == "internal" else logging.WARNING
    fields: dict[str, Any] = {"model": event.model} if event.model is not None else {}
    log_event("request_failed", level, **fields, status=event.status,
              operation=event.operation.value, protocol=event.protocol, error=event.error)


_LINES: dict[type[EngineEvent], Callable[[Any], None]] = {  # one line per kind
    ModelAdded: _added,
    ModelRemoved: _removed,
    LoadStarted: _load_started,
    LoadFinished: _loaded,
    LoadFailed: _load_failed,
    ReplicaUpgraded: _upgraded,
    UpgradeDeferred: _upgrade_deferred,
    LoadDeferred: _deferred,
    Unloaded: _unloaded,
    Evicting: _evicting,
    OomRetry: _oom,
    ReplicaAdded: _replica_added,
    ReplicaDraining: _replica_draining,
    ReplicaRemoved: _replica_removed,
    ReplicaFailed: _replica_failed,
    ColdStart: _cold_start,
    Prewarm: _prewarm,
    KeepAlivePlanned: _planned,
    BatchingDisabled: _batching_disabled,
    InlineDisabled: _inline_disabled,
    RequestFinished: _request,
}
