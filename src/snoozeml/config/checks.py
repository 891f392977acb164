"""The checks of models.toml that its types alone don't make: those that look at more than one
field, or at the disk. config/settings.py runs them on the raw tables, so that every problem is
reported in one go, whatever else is wrong."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

_REPLICA_DEVICE = re.compile(r"^(cpu|mps|cuda:\d+)$")  # a device a replica goes to
_MODEL_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")  # a model's `device`: may choose
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")

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


def check_models(raw: dict[str, Any], base: Path, gpus: Sequence[str] | None,
                 problem: Problem) -> list[str | None]:
    """The checks of `[server.replicas]` and of each `[[models]]` entry that the types alone
    don't make; returns each entry's format as its path shows it (None where the entry names
    it, or it can't be told)."""
    server_raw = raw.get("server")
    server_replicas: dict[str, Any] = {}
    if isinstance(server_raw, dict) and isinstance(server_raw.get("replicas"), dict):
        server_replicas = server_raw["replicas"]
        check_min_max(server_replicas, {}, ("server", "replicas"), problem)
    raw_models = raw.get("models")
    formats: list[str | None] = []
    seen: dict[str, int] = {}  # model name -> its first entry
    for i, entry in enumerate(raw_models if isinstance(raw_models, list) else []):
        formats.append(None)
        if not isinstance(entry, dict):
            continue
        _check_model(i, entry, seen, server_replicas, gpus, problem)
        _check_labels(i, entry, base, problem)
        formats[i] = _found_format(i, entry, base, problem)
    return formats


def _check_model(i: int, entry: dict[str, Any], seen: dict[str, int],
                 server_replicas: dict[str, Any], gpus: Sequence[str] | None,
                 problem: Problem) -> None:
    name = entry.get("name")
    if isinstance(name, str):
        if not MODEL_NAME.match(name):
            problem(("models", i, "name"), f"invalid model name {name!r} (letters, "
                    "digits, '_', '-', '.'; starting with a letter or digit)")
        if name in seen:
            problem(("models", i, "name"), f"duplicate model name {name!r} "
                    f"(first defined as models[{seen[name]}])")
        seen.setdefault(name, i)
    device = entry.get("device")
    if isinstance(device, str) and not _MODEL_DEVICE.match(device):
        problem(("models", i, "device"), f"invalid device {device!r} "
                "(expected auto, cpu, cuda, cuda:N or mps)")
    replicas = entry.get("replicas")
    if isinstance(replicas, dict):
        check_devices(replicas.get("devices"), gpus, ("models", i, "replicas", "devices"),
                      problem)
    check_min_max(replicas if isinstance(replicas, dict) else {}, server_replicas,
                  ("models", i, "replicas"), problem)


def _check_labels(i: int, entry: dict[str, Any], base: Path, problem: Problem) -> None:
    """A `labels` file must be there (whether it fits the model is known at its load)."""
    raw_path = entry.get("labels")
    if not isinstance(raw_path, str) or not raw_path:
        return
    path = Path(raw_path) if Path(raw_path).is_absolute() else base / raw_path
    if not path.is_file():
        problem(("models", i, "labels"), f"no such file: {path}")


def _found_format(i: int, entry: dict[str, Any], base: Path, problem: Problem) -> str | None:
    """The format the entry's path shows, when the entry names none: a problem when the path
    does not exist, or shows none."""
    raw_path = entry.get("path")
    if not isinstance(raw_path, str):
        return None
    path = Path(raw_path) if Path(raw_path).is_absolute() else base / raw_path
    if not path.exists():
        problem(("models", i, "path"), f"no such file or folder: {path}")
        return None
    if entry.get("format") is not None:
        return None
    if path.is_file() and path.suffix == ".onnx":
        return "onnx"
    if path.is_dir() or path.suffix == ".safetensors":
        return "torch"
    problem(("models", i, "path"), f"cannot tell the format of {path} "
            "(expected a .onnx file, a .safetensors file or a model folder)")
    return None
