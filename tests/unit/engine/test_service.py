"""The service facade (engine/service.py) without a transport: Triton statistics looked up by
model name and version, and the extensions the server metadata lists."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from onnx_models import write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.events import BatchRun
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.service import EXTENSIONS, InferenceService
from snoozeml.errors import ModelNotFound


@pytest.fixture
def service(tmp_path: Path) -> Iterator[InferenceService]:
    for name in ("a", "b"):
        write_mlp(tmp_path / f"{name}.onnx", dims=(4, 2))
    config = parse_config({"models": [
        {"name": "a", "path": str(tmp_path / "a.onnx")},
        {"name": "b", "path": str(tmp_path / "b.onnx")},
    ]}, source=tmp_path / "models.toml")
    manager = ModelManager(config)
    yield InferenceService(manager)
    manager.loader.shutdown()


def test_the_service_answers_for_one_model_or_every_configured_one(
    service: InferenceService,
) -> None:
    service.events.publish(BatchRun("b", 0, 2, (0.001,), 0.002, False))
    assert [s.name for s in service.statistics()] == ["a", "b"]  # loaded or not
    assert [s.name for s in service.statistics("")] == ["a", "b"]
    (b,) = service.statistics("b")
    assert (b.name, b.version, b.inference_count, b.execution_count) == ("b", "1", 2, 1)
    assert service.statistics("b", "1") == (b,)


def test_an_unknown_model_or_version_is_not_found(service: InferenceService) -> None:
    with pytest.raises(ModelNotFound):
        service.statistics("missing")
    with pytest.raises(ModelNotFound):
        service.statistics("a", "7")


def test_server_metadata_lists_the_extension() -> None:
    assert "statistics" in EXTENSIONS
