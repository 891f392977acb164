"""Where a problem in models.toml is, and how it reads: the line of each key path, dotted
names (`models[1].replicas.min`), and pydantic's errors in the file's own words."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# --- locating keys in the file ---------------------------------------------------------

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\"'. ]+?)\s*=")


def index_lines(text: str) -> dict[tuple[str | int, ...], int]:
    """Map key paths like ("models", 1, "idle_timeout") to the 1-based line defining them."""
    index: dict[tuple[str | int, ...], int] = {}
    arrays: dict[tuple[str | int, ...], int] = {}
    table: tuple[str | int, ...] = ()
    for lineno, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            names = [part.strip().strip("\"'") for part in header.group(2).split(".")]
            path: tuple[str | int, ...] = ()
            for name in names[:-1]:
                path = (*path, name)
                if path in arrays:
                    path = (*path, arrays[path])
            path = (*path, names[-1])
            if header.group(1) == "[[":
                arrays[path] = arrays.get(path, -1) + 1
                path = (*path, arrays[path])
            table = path
            index.setdefault(table, lineno)
            continue
        key = _KEY.match(line)
        if key and not line.lstrip().startswith("#"):
            parts = tuple(part.strip().strip("\"'") for part in key.group(1).split("."))
            index.setdefault((*table, *parts), lineno)
    return index


def line_of(index: dict[tuple[str | int, ...], int], loc: tuple[str | int, ...]) -> int | None:
    for end in range(len(loc), 0, -1):
        if loc[:end] in index:
            return index[loc[:end]]
    return None


def dotted(loc: tuple[str | int, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


_TYPE_NAMES = {
    "int_type": "an integer",
    "bool_type": "true or false",
    "float_type": "a number",
    "string_type": "a string",
}


def _toml_value(value: object) -> str:
    """A value as the file wrote it (true, not True; strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def describe(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "missing required key"
    if kind in _TYPE_NAMES:
        return f"must be {_TYPE_NAMES[kind]}, got {_toml_value(error.get('input'))}"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def problem_line(problem: str) -> int:
    """Sort key: problems in file order (those without a line, e.g. from $SNOOZE_*, first)."""
    match = re.match(r"^[^:]*:(\d+):", problem)
    return int(match.group(1)) if match else 0
