"""ONNX models through onnxruntime: the backend the engine holds for each ONNX model.

What the engine asks before a model loads (its files' sizes, the device whose memory it takes)
needs no onnxruntime, so this module does not import it. Everything else is
runtime/onnx/sessions.py's (how a model loads: the load plan, the sessions, the weights cache
entry), which imports onnxruntime and is imported at a model's first load, in
`prepare_blocking`: before the load is measured (the library's memory is the process's, not
the model's), and not at start, so that a daemon whose models load on demand starts without
it. A GPU that a model asks for is the exception: whether onnxruntime can run on it decides
where the model's memory goes, so that model's backend imports it at start.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.base import FileSizes, Instance, LoadPlan, looks_out_of_memory, requested_gpu
from snoozeml.runtime.files import onnx_file_sizes_blocking

if TYPE_CHECKING:
    from snoozeml.runtime.onnx.sessions import OnnxSessions


class OnnxBackend:
    def __init__(self, cache_dir: Path | None = None) -> None:
        self._cache_dir = cache_dir  # None: no weights cache, every load takes the default path
        self._unbuildable: set[str] = set()  # entry keys whose build failed in this process
        self._loads: OnnxSessions | None = None

    def _sessions(self) -> OnnxSessions:
        """The loading half, imported (with onnxruntime) at the first call that needs it."""
        if self._loads is None:
            from snoozeml.runtime.onnx.sessions import OnnxSessions

            # Two threads may both get here: either instance does, as they share the state.
            self._loads = OnnxSessions(self._cache_dir, self._unbuildable)
        return self._loads

    def file_sizes_blocking(self, spec: ModelConfig) -> FileSizes:
        return onnx_file_sizes_blocking(spec.path)

    def memory_device(self, spec: ModelConfig, gpus: Sequence[str]) -> str:
        """The GPU the model asks for when it is present and this onnxruntime has CUDA;
        otherwise the host, where the CPU provider will run it."""
        gpu = requested_gpu(spec.device, gpus)
        if gpu != "cpu" and not self._sessions().has_cuda():
            return "cpu"
        return gpu

    def prepare_blocking(self, spec: ModelConfig) -> None:
        self._sessions()  # onnxruntime; a model brings no code of its own

    def load_plan_blocking(self, spec: ModelConfig, sizes: FileSizes) -> LoadPlan:
        return self._sessions().load_plan_blocking(spec, sizes)

    def background_blocking(self, spec: ModelConfig) -> None:
        self._sessions().background_blocking(spec)

    def load_blocking(self, spec: ModelConfig) -> Instance:
        instance = self._sessions().load_blocking(spec)
        if spec.image is None:
            return instance
        from snoozeml.runtime.image.instance import with_images_blocking  # Pillow, only then

        return with_images_blocking(instance, spec.image)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return looks_out_of_memory(exc)
