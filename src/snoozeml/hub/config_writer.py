"""Scanned models as `[[models]]` entries: printed, or merged into an existing models.toml.

A merge only ever appends. Every byte already in the file (entries, comments, formatting, the
order of tables) stays as it is, and an entry whose model is already there, by resolved path or
by name, is left out: the file's own entry wins, edits and all.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import AoT, Table

from snoozeml.config.settings import TEXT_MAX_BATCH_SIZE
from snoozeml.errors import ConfigError
from snoozeml.hub.scan import ScannedModel


@dataclass(frozen=True)
class Skip:
    model: ScannedModel
    reason: str


@dataclass(frozen=True)
class MergeResult:
    config: Path
    added: list[ScannedModel] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)


def render_toml(
    entries: Sequence[ScannedModel], relative_to: Path | None = None, header: str | None = None
) -> str:
    """`[[models]]` entries as TOML, paths relative to `relative_to` (default: the current
    directory). `header`, if given, opens every entry as a comment (where it came from)."""
    base = (relative_to or Path.cwd()).resolve()
    document = tomlkit.document()
    tables = tomlkit.aot()
    for entry in entries:
        tables.append(_table(entry, base, header))
    document.add("models", tables)
    return tomlkit.dumps(document)


def merge_into(
    config_path: Path, entries: Sequence[ScannedModel], header: str | None = None
) -> MergeResult:
    """Append the entries models.toml lacks; create the file if there is none.

    Raises ConfigError if the file cannot be read, is not TOML, or keeps its models in a way
    an appended `[[models]]` table would break.
    """
    config_path = config_path.absolute()
    text = _read(config_path)
    base = config_path.parent.resolve()
    names, paths = _existing(config_path, text, base)

    added: list[ScannedModel] = []
    skipped: list[Skip] = []
    for entry in entries:
        resolved = entry.path.resolve()
        if resolved in paths:
            skipped.append(Skip(entry, f"already in {config_path.name} as {paths[resolved]!r}"))
        elif entry.name in names:
            skipped.append(Skip(entry, f"{config_path.name} already has a model named "
                                       f"{entry.name!r} (path {names[entry.name]})"))
        else:
            added.append(entry)
            names[entry.name] = str(resolved)
            paths[resolved] = entry.name
    if added:
        entries_text = render_toml(added, base, header)
        if "\r\n" in text:  # keep the file's line endings
            entries_text = entries_text.replace("\n", "\r\n")
        merged = text + _separator(text) + entries_text
        tomllib.loads(merged)  # an invariant: appending [[models]] tables keeps the file valid
        _write_atomically(config_path, merged)
    return MergeResult(config_path, added, skipped)


def check_mergeable(config_path: Path) -> None:
    """Raise ConfigError now if merge_into would refuse `config_path` (before a long download)."""
    config_path = config_path.absolute()
    _existing(config_path, _read(config_path), config_path.parent.resolve())


def _table(entry: ScannedModel, base: Path, header: str | None) -> Table:
    table = tomlkit.table()
    for line in ([header] if header else []) + list(entry.notes):
        table.add(tomlkit.comment(line))
    table.add("name", entry.name)
    table.add("path", relative_path(entry.path, base))
    table.add("format", entry.format)
    optional: list[tuple[str, Any]] = [
        ("task", entry.task),
        ("tokenize", True if entry.tokenize else None),
        ("pooling", entry.pooling),
        ("normalize", entry.normalize),
        ("max_length", entry.max_length),
    ]
    for key, value in optional:
        if value is not None:
            table.add(key, value)
    if entry.max_batch_size is not None:
        batching = tomlkit.table()
        if entry.batching_note:
            batching.add(tomlkit.comment(entry.batching_note))
        # A model that tokenizes batches more rows by default (its runs are bounded by tokens).
        rows = TEXT_MAX_BATCH_SIZE if entry.tokenize and entry.max_batch_size > 1 \
            else entry.max_batch_size
        batching.add("max_batch_size", rows)
        table.add("batching", batching)
    if entry.image is not None:
        image = tomlkit.table()
        for key, value in entry.image.items():
            image.add(key, value)
        table.add("image", image)
    return table


def relative_path(path: Path, base: Path) -> str:
    """`path` relative to `base` with forward slashes (absolute if there is no relative way)."""
    try:
        return Path(os.path.relpath(path.resolve(), base)).as_posix()
    except ValueError:  # another drive, on Windows
        return path.resolve().as_posix()


def _read(config_path: Path) -> str:
    try:
        # Bytes, not read_text: universal newlines would turn CRLF into LF on the way back.
        return config_path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{config_path}: cannot read config: {exc}"]) from exc


def _existing(config_path: Path, text: str, base: Path) -> tuple[dict[str, str], dict[Path, str]]:
    """The names (-> path) and resolved paths (-> name) of the models the file already has."""
    try:
        document = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise ConfigError([f"{config_path}: invalid TOML: {exc}"]) from exc
    models = document.get("models")
    if models is None:
        return {}, {}
    if not isinstance(models, AoT):
        raise ConfigError([f"{config_path}: models is not a list of [[models]] tables; "
                           "write each model as a [[models]] table so entries can be added"])
    names: dict[str, str] = {}
    paths: dict[Path, str] = {}
    for table in models:
        name, raw_path = table.get("name"), table.get("path")
        if isinstance(name, str):
            names[str(name)] = str(raw_path)
        if isinstance(raw_path, str):
            resolved = (base / str(raw_path)).resolve()
            paths.setdefault(resolved, str(name))
    return names, paths


def _separator(text: str) -> str:
    """What goes between the file's text and appended entries: exactly one blank line."""
    if not text.strip():
        return ""
    newline = "\r\n" if "\r\n" in text else "\n"
    if text.endswith(newline * 2):
        return ""
    return newline if text.endswith(newline) else newline * 2


def _write_atomically(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        scratch.write_bytes(text.encode("utf-8"))
        if path.exists():
            os.chmod(scratch, path.stat().st_mode & 0o7777)
        os.replace(scratch, path)
    except OSError as exc:
        scratch.unlink(missing_ok=True)
        raise ConfigError([f"{path}: cannot write config: {exc}"]) from exc
