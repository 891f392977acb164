"""A backend that always fails to load, with a message saying why (e.g. a missing extra).

Everything else answers without touching a runtime: such a model is listed and sized like any
other, and its load fails with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.base import FileSizes, Instance, LoadPlan
from snoozeml.runtime.files import (
    bytes_on_disk,
    onnx_file_sizes_blocking,
    torch_file_sizes_blocking,
)


class UnavailableBackend:
    def __init__(self, reason: str) -> None:
        self.reason = reason

    def file_sizes_blocking(self, spec: ModelConfig) -> FileSizes:
        """Sized as its format would be (a torch model without the extra: its weight files),
        else the bytes under its path; 0 for what cannot be read. Never raises."""
        try:
            if spec.format == "torch":
                return torch_file_sizes_blocking(spec.path)
            if spec.format == "onnx":
                return onnx_file_sizes_blocking(spec.path)
        except OSError:
            return FileSizes(0, 0)
        return FileSizes(bytes_on_disk(spec.path), 0)

    def memory_device(self, spec: ModelConfig, gpus: Sequence[str]) -> str:
        return "cpu"

    def prepare_blocking(self, spec: ModelConfig) -> None:
        pass

    def background_blocking(self, spec: ModelConfig) -> None:
        pass  # a load leaves nothing for later

    def load_plan_blocking(self, spec: ModelConfig, sizes: FileSizes) -> LoadPlan:
        return LoadPlan("default", sizes.transient)

    def load_blocking(self, spec: ModelConfig) -> Instance:
        raise RuntimeError(self.reason)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return False
