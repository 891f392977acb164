"""PyTorch as the torch instances use it: devices, dtypes, and the optional libraries of the
torch extra (transformers, tokenizers, safetensors), reported by name when one is missing."""

from __future__ import annotations

import importlib
from typing import Any

import torch

PLATFORM = "pytorch_safetensors"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def torch_device(device: str) -> torch.device:
    """The torch device for a configured `device`; "auto" prefers CUDA, then MPS, then CPU."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda:0")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} was asked for but CUDA is not available")
    if device == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError("device 'mps' was asked for but MPS is not available")
    return torch.device(device)


def require(name: str) -> Any:
    """A module of the torch extra; its absence fails the load, naming the extra."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise RuntimeError(
            f"{exc}; torch models need the extra: pip install 'snoozeml[torch]'"
        ) from exc


def transformers_version() -> tuple[int, int]:
    """The installed transformers' (major, minor)."""
    major, minor = require("transformers").__version__.split(".")[:2]
    return int(major), int(minor)


def dtype_key() -> str:
    """The name transformers gives the model dtype, as a from_pretrained argument and a config
    attribute: `dtype` since 4.56, `torch_dtype` before."""
    return "dtype" if transformers_version() >= (4, 56) else "torch_dtype"
