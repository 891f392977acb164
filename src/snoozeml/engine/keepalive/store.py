"""The models' idle-gap histories across restarts: `<cache_dir>/keepalive.json`, read once at
start and written at shutdown and every `SAVE_EVERY_S` while any model's keep-alive is
adaptive or eviction is by cost (engine/registry.py). A history is what a model learned in
hours of traffic; a daemon that forgot it at every restart would fall back to its fixed window
for the next ten gaps.

The file is a cache: one that is missing starts every model afresh; one that cannot be read
or parsed, or a model's entry that is malformed, is ignored with a logged warning, never a
failed start. It is written whole to a temporary file and renamed over the old one, so a
crash mid-write leaves the previous version.

    {"format": 1, "models": {"<name>": <IdleHistogram.to_json()>, ...}}
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from snoozeml.engine.keepalive.histogram import IdleHistogram
from snoozeml.errors import describe_exception
from snoozeml.logs import log_event

FILE_NAME = "keepalive.json"
FORMAT = 1
SAVE_EVERY_S = 60.0


def read_histories(path: Path) -> dict[str, IdleHistogram]:
    """Each model's history from `path`; {} when there is none or it is unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        log_event("keepalive_history_ignored", logging.WARNING, path=str(path),
                  error=describe_exception(exc))
        return {}
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT \
                or not isinstance(data.get("models"), dict):
            raise ValueError(f"not a format {FORMAT} keep-alive file")
    except ValueError as exc:  # JSONDecodeError included
        log_event("keepalive_history_ignored", logging.WARNING, path=str(path),
                  error=describe_exception(exc))
        return {}
    histories: dict[str, IdleHistogram] = {}
    for name, entry in data["models"].items():
        try:
            histories[str(name)] = IdleHistogram.from_json(entry)
        except ValueError as exc:
            log_event("keepalive_history_ignored", logging.WARNING, path=str(path),
                      model=str(name), error=describe_exception(exc))
    return histories


def histories_json(histories: Mapping[str, IdleHistogram]) -> str:
    """The file's text (built on the event loop: a few hundred bytes a model)."""
    return json.dumps({"format": FORMAT, "models": {
        name: history.to_json() for name, history in sorted(histories.items())
        if history.count}}, separators=(",", ":"))


def write_histories(path: Path, text: str) -> None:
    """Replace the file with `text` (blocking: off the loop but at shutdown); a failure is
    logged, never raised."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        log_event("keepalive_history_unsaved", logging.WARNING, path=str(path),
                  error=describe_exception(exc))
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
