"""The models table: its columns, how each cell reads, sorting, filtering, and the plain-text
form `snooze monitor --once` prints. The Textual app shows the same cells.

Pure: no I/O, no Textual.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from snoozeml.monitor.latency import Latency
from snoozeml.monitor.status import ModelRow

DASH = "-"  # a value the monitor doesn't have (no /metrics, no window yet, no timer)


@dataclass(frozen=True)
class Row:
    """One model as the table shows it: its status, and its latency window when there is one."""

    model: ModelRow
    latency: Latency | None


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    numeric: bool  # right-aligned, and sorted largest first
    sort_value: Callable[[Row], float | str | None]  # None sorts last, either way


# Most interesting first when sorted by state.
STATE_ORDER = {"FAILED": 0, "LOADING": 1, "UNLOADING": 2, "READY": 3, "UNLOADED": 4}


def _p(q: str) -> Callable[[Row], float | None]:
    def value(row: Row) -> float | None:
        if row.latency is None:
            return None
        return row.latency.p50_s if q == "p50" else row.latency.p99_s
    return value


COLUMNS: tuple[Column, ...] = (
    Column("name", "MODEL", False, lambda r: r.model.name),
    Column("state", "STATE", False, lambda r: float(STATE_ORDER.get(r.model.state, 5))),
    Column("replicas", "REPLICAS", True, lambda r: r.model.replicas),
    Column("in_flight", "IN-FLIGHT", True, lambda r: r.model.in_flight),
    Column("queued", "QUEUED", True, lambda r: r.model.queued),
    Column("per_s", "REQ/S", True, lambda r: r.latency.per_s if r.latency else None),
    Column("p50", "P50", True, _p("p50")),
    Column("p99", "P99", True, _p("p99")),
    Column("memory", "MEMORY", True, lambda r: r.model.resident_bytes),
    Column("idle_in", "IDLE IN", True, lambda r: r.model.expires_in_s),
    Column("cold_start", "COLD START", True, lambda r: r.model.last_load_ms),
)
COLUMN_KEYS = tuple(column.key for column in COLUMNS)


def cells(row: Row) -> tuple[str, ...]:
    """The row's cells as text, in COLUMNS order."""
    model, latency = row.model, row.latency
    return (
        model.name,
        model.state,
        str(model.replicas),
        str(model.in_flight),
        str(model.queued),
        DASH if latency is None else format_rate(latency.per_s),
        DASH if latency is None else format_seconds(latency.p50_s),
        DASH if latency is None else format_seconds(latency.p99_s),
        format_bytes(model.resident_bytes) if model.resident_bytes else DASH,
        idle_in(model),
        DASH if model.last_load_ms is None else format_seconds(model.last_load_ms / 1000),
    )


def idle_in(model: ModelRow) -> str:
    """Time until the idle timer unloads the model (the window the adaptive keep-alive chose,
    or idle_timeout), `pinned`, `warm 12s` for an unloaded model the keep-alive will pre-warm
    then, or `-` when no timer runs."""
    if model.pinned and model.state == "READY":
        return "pinned"
    if model.expires_in_s is None:
        if model.prewarm_in_s is not None and model.state == "UNLOADED":
            return f"warm {format_duration(model.prewarm_in_s)}"
        return DASH
    return format_duration(model.expires_in_s)


def build_rows(models: Iterable[ModelRow], window: dict[str, Latency] | None) -> list[Row]:
    """Rows for the models, each with its latency window when `window` names it (a daemon
    with `[server.metrics] per_model = false` names none: their latency columns read `-`)."""
    window = window or {}
    return [Row(model, window.get(model.name)) for model in models]


def state_counts(models: Iterable[ModelRow]) -> list[tuple[str, int]]:
    """How many models are in each state, in STATE_ORDER, leaving out states none is in."""
    counts: dict[str, int] = {}
    for model in models:
        counts[model.state] = counts.get(model.state, 0) + 1
    return sorted(counts.items(), key=lambda item: (STATE_ORDER.get(item[0], 5), item[0]))


def filter_rows(rows: Iterable[Row], text: str) -> list[Row]:
    """The rows whose model name contains `text`, ignoring case and surrounding spaces."""
    needle = text.strip().lower()
    return [row for row in rows if needle in row.model.name.lower()]


def sort_rows(rows: Iterable[Row], key: str | None, reverse: bool = False) -> list[Row]:
    """Rows sorted by the column `key`: names and states ascending, numbers largest first,
    missing values last; ties keep the daemon's (config) order. `key` None keeps that order.
    `reverse` flips the direction, but missing values stay last."""
    rows = list(rows)
    if key is None:
        return rows[::-1] if reverse else rows
    column = next(c for c in COLUMNS if c.key == key)
    present = [r for r in rows if column.sort_value(r) is not None]
    missing = [r for r in rows if column.sort_value(r) is None]
    descending = column.numeric != reverse
    present.sort(key=lambda r: _comparable(column.sort_value(r)), reverse=descending)
    return present + missing


def _comparable(value: float | str | None) -> float | str:
    return value.lower() if isinstance(value, str) else (value or 0.0)


def next_sort(key: str | None) -> str | None:
    """The column after `key` in the cycle: the daemon's order, then each column in turn."""
    cycle: tuple[str | None, ...] = (None, *COLUMN_KEYS)
    return cycle[(cycle.index(key) + 1) % len(cycle)]


def render_text(rows: Sequence[Row]) -> str:
    """The table as aligned plain text, one header line then one line per model."""
    lines = [tuple(c.title for c in COLUMNS), *(cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    out = []
    for line in lines:
        parts = [text.rjust(width) if column.numeric else text.ljust(width)
                 for text, width, column in zip(line, widths, COLUMNS, strict=True)]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


# --- formatting ----------------------------------------------------------------------------

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(size: float) -> str:
    """`0 B`, `512 B`, `9.5 MiB`, `18.8 GiB`: binary units, three significant digits."""
    value = float(size)
    for unit in _BYTE_UNITS:
        if abs(value) < 1024 or unit == _BYTE_UNITS[-1]:
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.0f} {unit}" if abs(value) >= 100 else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(seconds: float | None) -> str:
    """A latency: `0.42ms`, `12.3ms`, `123ms`, `1.25s`, `42.0s`; `-` for None."""
    if seconds is None or math.isnan(seconds):
        return DASH
    ms = seconds * 1000
    if ms < 10:
        return f"{ms:.2f}ms"
    if ms < 100:
        return f"{ms:.1f}ms"
    if ms < 1000:
        return f"{ms:.0f}ms"
    return f"{seconds:.2f}s" if seconds < 10 else f"{seconds:.1f}s"


def format_duration(seconds: float) -> str:
    """A span of time to the second: `7s`, `4m05s`, `2h03m`, `3d04h`."""
    whole = max(0, math.ceil(seconds)) if seconds < 60 else int(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def format_rate(per_s: float) -> str:
    """Requests per second: `0`, `0.4`, `12.5`, `1234`."""
    if per_s == 0:
        return "0"
    return f"{per_s:.1f}" if per_s < 100 else f"{per_s:.0f}"


def memory_bar(used: int, budget: int | None, width: int) -> tuple[int, float | None]:
    """How many of `width` cells a device's bar fills, and the used share of the budget
    (None without a budget). Anything used shows at least one cell; over budget fills it."""
    if not budget or budget <= 0:
        return 0, None
    share = used / budget
    filled = min(width, math.ceil(share * width)) if used > 0 else 0
    return filled, share
