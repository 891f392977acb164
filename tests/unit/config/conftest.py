"""Fixtures of the config tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny.onnx"
    path.parent.mkdir()
    path.write_bytes(b"not read by load_config")
    return path
