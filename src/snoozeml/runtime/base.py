"""The one small protocol every backend implements. Blocking calls say so in their names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from snoozeml.config import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.errors import InvalidInput


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


def utf8_strings(array: np.ndarray, name: str) -> np.ndarray:
    """A BYTES tensor as str objects, for runtimes that take text; an element that is not
    UTF-8 is this request's 400. Returns `array` itself when it already holds only str."""
    flat = array.reshape(-1)
    if all(type(v) is str for v in flat):
        return array
    strings = np.empty(flat.shape[0], dtype=object)
    for i, value in enumerate(flat):
        try:
            strings[i] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"input {name!r}: element {i} is not valid UTF-8 "
                               f"({exc.reason} at byte {exc.start})") from None
    return strings.reshape(array.shape)


def prepare_blocking(backend: Backend, spec: ModelConfig) -> None:
    """Let a backend import what a model's code needs before its load is measured (memory
    that stays for the life of the process should not be charged to the model)."""
    prepare = getattr(backend, "prepare_blocking", None)
    if prepare is not None:
        prepare(spec)


def backend_for(spec: ModelConfig) -> Backend:
    """The backend that serves `spec.format`; imported lazily so ONNX never imports torch."""
    if spec.format == "onnx":
        from snoozeml.runtime.onnx import OnnxBackend

        return OnnxBackend()
    from snoozeml.runtime.unavailable import UnavailableBackend

    if spec.format == "torch":
        try:
            from snoozeml.runtime.torch import TorchBackend
        except ImportError as exc:
            reason = str(exc)
            if "snoozeml[torch]" not in reason:  # runtime/torch.py's own message names it
                reason += "; torch models need the extra: pip install 'snoozeml[torch]'"
            return UnavailableBackend(reason)
        return TorchBackend(spec.intra_op_threads)
    return UnavailableBackend(f"model format {spec.format!r} is not supported")


_OOM_MARKERS = (
    "failed to allocate memory",
    "bad_alloc",
    "bad allocation",
    "out of memory",
    "cudaerrormemoryallocation",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether a backend exception means memory ran out: MemoryError, torch's
    OutOfMemoryError, or onnxruntime's allocation failures (which arrive as RuntimeException
    with the allocator's message)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _OOM_MARKERS)


def memory_device(spec: ModelConfig, gpus: Sequence[str]) -> str:
    """The device whose memory budget a model counts against: the GPU it will run on, when
    that GPU exists and its runtime can use it, else the host ("cpu")."""
    device = spec.device
    if device in ("cpu", "mps") or not gpus:
        return "cpu"
    if spec.format == "onnx":
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return "cpu"
    wanted = "cuda:0" if device in ("auto", "cuda") else device
    return wanted if wanted in gpus else "cpu"
