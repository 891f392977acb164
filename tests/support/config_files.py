"""models.toml files written for a test, and the problems load_config finds in one: what the
config tests share (their `model_file` fixture is in tests/unit/config/conftest.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from snoozeml.config.settings import load_config
from snoozeml.errors import ConfigError


def write(directory: Path, body: str, name: str = "models.toml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(body).lstrip("\n"))
    return path


def problems_of(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ or {})
    assert info.value.problems, "a ConfigError must list at least one problem"
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems
