"""Fixtures of the ONNX runtime's tests: a weights cache folder, and instances closed at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from snoozeml.runtime.onnx.instance import OnnxInstance


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def closing() -> Iterator[list[OnnxInstance]]:
    made: list[OnnxInstance] = []
    yield made
    for instance in made:
        instance.close()
