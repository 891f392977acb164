"""`/admin/status` JSON as typed rows for the monitor (see docs/http-api.md#adminstatus).

Pure: no I/O, no Textual. Fields the monitor doesn't show are left out. A daemon older than a
field (`recent_events`, `replicas`) still parses: what is missing reads as empty or `None`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


class StatusFormatError(ValueError):
    """The answer is not an `/admin/status` document."""


@dataclass(frozen=True)
class ServerInfo:
    name: str
    version: str
    started_at: float | None  # epoch seconds; a new value means a new daemon process
    uptime_s: float
    draining: bool
    # The daemon's clock when it wrote the document (started_at + uptime_s), in epoch seconds:
    # timers are measured against it, so the monitor's own clock never skews them.
    now: float | None


@dataclass(frozen=True)
class DeviceRow:
    name: str
    used_bytes: int
    budget_bytes: int | None
    total_bytes: int | None


@dataclass(frozen=True)
class ModelRow:
    name: str
    state: str
    reason: str
    pinned: bool
    replicas: int
    in_flight: int
    queued: int
    resident_bytes: int
    expires_in_s: float | None  # until the idle timer unloads it; None when no timer runs
    last_load_ms: float | None
    requests: int
    errors: int
    prewarm_in_s: float | None = None  # until the adaptive keep-alive loads it again


@dataclass(frozen=True)
class EventRow:
    time: str  # as the daemon wrote it: ISO 8601 UTC with milliseconds
    kind: str
    model: str | None
    detail: str


@dataclass(frozen=True)
class Status:
    server: ServerInfo
    devices: tuple[DeviceRow, ...]
    models: tuple[ModelRow, ...]
    events: tuple[EventRow, ...] | None  # oldest first; None: the daemon has no recent_events


def parse_time(text: object) -> float | None:
    """Epoch seconds from `2026-12-01T00:10:23.099Z`; None for null or anything else."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_status(document: object) -> Status:
    """The monitor's view of one `/admin/status` answer. Raises StatusFormatError when the
    document lacks `server` or `models`."""
    if not isinstance(document, dict):
        raise StatusFormatError("the status is not a JSON object")
    server = document.get("server")
    models = document.get("models")
    if not isinstance(server, dict) or not isinstance(models, list):
        raise StatusFormatError("the status has no 'server' object or 'models' list")
    info = _server(server)
    return Status(
        server=info,
        devices=tuple(_device(d) for d in _dicts(document.get("devices"))),
        models=tuple(_model(m, info.now) for m in _dicts(models)),
        events=(tuple(_event(e) for e in _dicts(document["recent_events"]))
                if isinstance(document.get("recent_events"), list) else None),
    )


def _server(server: dict[str, Any]) -> ServerInfo:
    uptime = _float(server.get("uptime_s")) or 0.0
    started = parse_time(server.get("started_at"))
    return ServerInfo(
        name=str(server.get("name", "")),
        version=str(server.get("version", "")),
        started_at=started,
        uptime_s=uptime,
        draining=server.get("draining") is True,
        now=None if started is None else started + uptime,
    )


def _device(device: dict[str, Any]) -> DeviceRow:
    return DeviceRow(
        name=str(device.get("name", "?")),
        used_bytes=_int(device.get("used_bytes")) or 0,
        budget_bytes=_int(device.get("budget_bytes")),
        total_bytes=_int(device.get("total_bytes")),
    )


def _model(model: dict[str, Any], now: float | None) -> ModelRow:
    expires = parse_time(model.get("expires_at"))
    expires_in = None if expires is None or now is None else max(0.0, expires - now)
    keep_alive = model.get("keep_alive")
    prewarm = parse_time(keep_alive.get("prewarm_at")) if isinstance(keep_alive, dict) else None
    return ModelRow(
        name=str(model.get("name", "?")),
        state=str(model.get("state", "?")),
        reason=str(model.get("reason") or ""),
        pinned=model.get("pinned") is True,
        replicas=_int(model.get("replicas")) or 0,
        in_flight=_int(model.get("in_flight")) or 0,
        queued=_int(model.get("queued")) or 0,
        resident_bytes=_int(model.get("resident_bytes")) or 0,
        expires_in_s=expires_in,
        last_load_ms=_float(model.get("last_load_ms")),
        requests=_int(model.get("requests")) or 0,
        errors=_int(model.get("errors")) or 0,
        prewarm_in_s=None if prewarm is None or now is None else max(0.0, prewarm - now),
    )


def _event(event: dict[str, Any]) -> EventRow:
    model = event.get("model")
    return EventRow(
        time=str(event.get("time", "")),
        kind=str(event.get("kind", "?")),
        model=model if isinstance(model, str) else None,
        detail=str(event.get("detail") or ""),
    )


def _dicts(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
