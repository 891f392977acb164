"""safetensors models through PyTorch: Hugging Face folders via `transformers`
(runtime/torch/huggingface.py), or a plain state dict with a user module factory
(runtime/torch/state_dict.py). Optional: needs `pip install 'snoozeml[torch]'`, and importing this
module without it raises an ImportError that says so.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "serving safetensors models needs PyTorch: pip install 'snoozeml[torch]'"
    ) from exc

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.base import (
    FileSizes,
    Instance,
    LoadPlan,
    looks_out_of_memory,
    requested_gpu,
)
from snoozeml.runtime.files import torch_file_sizes_blocking
from snoozeml.runtime.torch.huggingface import HuggingFaceInstance, model_class
from snoozeml.runtime.torch.state_dict import StateDictInstance, import_factory

# Imported now, at start-up, so that their own memory is not charged to the first model loaded.
for _name in ("transformers", "tokenizers", "safetensors.torch"):
    with contextlib.suppress(ImportError):  # reported when a model needs it, naming the extra
        importlib.import_module(_name)
with contextlib.suppress(ImportError):
    _hf_logging: Any = importlib.import_module("transformers.utils.logging")
    _hf_logging.set_verbosity_error()
    _hf_logging.disable_progress_bar()


class TorchBackend:
    def background_blocking(self, spec: ModelConfig) -> None:
        pass  # a load leaves nothing for later

    def load_plan_blocking(self, spec: ModelConfig, sizes: FileSizes) -> LoadPlan:
        return LoadPlan("default", sizes.transient)  # weights mapped, assigned in place

    def file_sizes_blocking(self, spec: ModelConfig) -> FileSizes:
        return torch_file_sizes_blocking(spec.path)

    def memory_device(self, spec: ModelConfig, gpus: Sequence[str]) -> str:
        """The GPU the model asks for ("auto" and "cuda" mean cuda:0) when it is present;
        otherwise the host, which MPS shares too."""
        return requested_gpu(spec.device, gpus)

    def prepare_blocking(self, spec: ModelConfig) -> None:
        """Import what the model's code needs (memory that stays after an unload), so the
        load's measurement counts only the model."""
        if spec.path.is_dir():
            self._check_folder(spec.path)
            model_class(spec.path, spec.task)
        elif spec.module:
            import_factory(spec.module, spec.path.parent)

    def load_blocking(self, spec: ModelConfig) -> Instance:
        if spec.intra_op_threads > 0:
            torch.set_num_threads(spec.intra_op_threads)  # process-wide in PyTorch
        try:
            if spec.path.is_dir():
                self._check_folder(spec.path)
                instance = HuggingFaceInstance(spec)
                if instance.task != "image-classification":
                    return instance
                from snoozeml.runtime.image.processor import with_folder_images_blocking

                return with_folder_images_blocking(instance, spec.path, spec.image)
            return StateDictInstance(spec)
        except Exception as exc:
            # safetensors' own errors ("incomplete metadata, file not fully covered") name
            # no file; a folder may hold several.
            if type(exc).__name__ != "SafetensorError":
                raise
            raise RuntimeError(f"{_weights_named(spec.path)}: not a valid safetensors file: "
                               f"{exc}") from exc

    def is_out_of_memory(self, exc: BaseException) -> bool:
        """An allocator's failure, or torch's OutOfMemoryError (torch.cuda's in older torch,
        matched by name; the top-level class where this torch has it)."""
        if looks_out_of_memory(exc) or type(exc).__name__ == "OutOfMemoryError":
            return True
        out_of_memory = getattr(torch, "OutOfMemoryError", None)
        return isinstance(out_of_memory, type) and isinstance(exc, out_of_memory)

    @staticmethod
    def _check_folder(folder: Path) -> None:
        if not (folder / "config.json").is_file():
            raise RuntimeError(f"{folder} has no config.json (a Hugging Face folder needs one)")


def _weights_named(path: Path) -> Path:
    """The safetensors file a model's path stands for (a folder's own, when it has one)."""
    if path.is_dir() and (path / "model.safetensors").is_file():
        return path / "model.safetensors"
    return path
