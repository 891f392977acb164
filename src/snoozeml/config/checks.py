"""The checks of models.toml that look at more than one field (config/settings.py runs them on the
raw
tables, so that every problem is reported in one go, whatever else is wrong)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_REPLICA_DEVICE = re.compile(r"^(cpu|mps|cuda:\d+)$")

Problem = Callable[[tuple[str | int, ...], str], None]


def check_min_max(
    table: Mapping[str, Any], defaults: Mapping[str, Any], loc: tuple[str | int, ...],
    problem: Problem,
) -> None:
    """`min` may not exceed `max` once the table's keys are merged over `defaults` (a table
    that sets neither inherits the pair, checked where it is written)."""
    if defaults and "min" not in table and "max" not in table:
        return
    low = table.get("min", defaults.get("min", 0))
    high = table.get("max", defaults.get("max", 1))
    if not all(type(v) is int for v in (low, high)) or low <= high or high < 1:
        return
    key = "min" if "min" in table or "max" not in table else "max"
    problem((*loc, key), f"min = {low} is more than max = {high}")


def check_devices(
    devices: object, gpus: Sequence[str] | None, loc: tuple[str | int, ...], problem: Problem
) -> None:
    if not isinstance(devices, list):
        return
    seen: set[str] = set()
    for j, device in enumerate(devices):
        if not isinstance(device, str):
            continue  # the type check reports it
        if not _REPLICA_DEVICE.match(device):
            problem((*loc, j), f"unknown device {device!r} (expected cpu, cuda:N or mps)")
        elif device in seen:
            problem((*loc, j), f"device {device!r} is listed twice")
        elif gpus is not None and device.startswith("cuda") and device not in gpus:
            found = ", ".join(gpus) if gpus else "no GPU"
            problem((*loc, j), f"unknown device {device!r}: this machine has {found}")
        seen.add(device)


def check_ports(
    modelmesh_port: int | None, http_port: int, grpc_port: int, origin: str | None,
    problem: Callable[..., None],
) -> None:
    """ModelMesh's SPI has a port of its own: not the HTTP or the gRPC one."""
    clash = {http_port: "http_port", grpc_port: "grpc_port"}.get(modelmesh_port or 0)
    if modelmesh_port and clash is not None:
        problem(("server", "modelmesh_port"), f"{modelmesh_port} is also {clash}: ModelMesh's "
                "SPI listens on a port of its own", origin)
