"""Model entries built in code, without a models.toml: what the runtime's tests hand a backend."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from snoozeml.config.settings import ModelConfig


def onnx_spec(path: Path, device: str = "cpu") -> ModelConfig:
    return ModelConfig(name=path.stem, path=path, format="onnx", device=device)


def spec_on(device: str, fmt: Literal["onnx", "torch"] = "torch") -> ModelConfig:
    """A model named m of format `fmt` on `device`; its path is never read."""
    return ModelConfig(name="m", path=Path("m"), format=fmt, device=device)
