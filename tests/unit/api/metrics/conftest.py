"""Fixtures of the metrics tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from metrics_samples import MODELS
from onnx_models import write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.service import InferenceService


@pytest.fixture
def service(tmp_path: Path) -> Iterator[InferenceService]:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    config = parse_config({"models": [{"name": name, "path": "mlp.onnx", "device": "cpu"}
                                      for name in MODELS]},
                          source=tmp_path / "models.toml")
    manager = ModelManager(config)
    yield InferenceService(manager)
    manager.loader.shutdown()
