"""The one small protocol every backend implements. Blocking calls say so in their names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from snoozeml.config import ModelConfig
from snoozeml.datatypes import ModelMetadata


class Instance(Protocol):
    """One loaded copy of a model. `run_blocking` is called from one worker thread at a time."""

    @property
    def metadata(self) -> ModelMetadata: ...

    def run_blocking(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None
    ) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class Backend(Protocol):
    def load_blocking(self, spec: ModelConfig) -> Instance: ...


def backend_for(spec: ModelConfig) -> Backend:
    """The backend that serves `spec.format`; imported lazily so ONNX never imports torch."""
    if spec.format == "onnx":
        from snoozeml.runtime.onnx import OnnxBackend

        return OnnxBackend()
    from snoozeml.runtime.unavailable import UnavailableBackend

    return UnavailableBackend(
        f"model format {spec.format!r} is not supported by this build of snoozeml"
    )
