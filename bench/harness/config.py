"""``models.toml`` written from plain dicts: ``[server]``, other top-level tables (``[auth]``)
and one ``[[models]]`` entry each, a dict value becoming a sub-table (``[models.batching]``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class Raw(str):
    """A value written as it is (an inline table printed by ``snooze keys new``)."""


def toml_value(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a basic string: JSON's escapes are TOML's


def _table(header: str, values: Mapping[str, Any]) -> list[str]:
    lines = [header]
    lines += [f"{key} = {toml_value(v)}" for key, v in values.items() if not isinstance(v, dict)]
    name = header.strip("[]")
    for key, sub in values.items():
        if isinstance(sub, dict):
            lines += [f"[{name}.{key}]", *(f"{k} = {toml_value(v)}" for k, v in sub.items())]
    return [*lines, ""]


def write_config(path: Path, models: Sequence[Mapping[str, Any]],
                 server: Mapping[str, Any] | None = None,
                 tables: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    """Write the config to ``path`` and return it."""
    lines = _table("[server]", server) if server else []
    for name, values in (tables or {}).items():
        lines += _table(f"[{name}]", values)
    for model in models:
        lines += _table("[[models]]", model)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
