"""A model given by a path at run time (ModelMesh's `loadModel`, the repository extension's load
with a `path` parameter, `snooze serve --model NAME=PATH`): the `models.toml` entry the scan
would write for it, resolved like a configured one.

The path is an ONNX file, a folder holding one ONNX model (ModelMesh's puller and KServe's
storage initializer place a model's files in a folder of their own), or a Hugging Face
safetensors folder. A `kind` (ModelMesh's `modelType`, or the name in its `modelKey`) narrows
the format. Everything here reads metadata only, never the weights, and raises InvalidInput
when nothing can be served: no load is attempted then.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from snoozeml.config.settings import (
    BatchingConfig,
    ModelConfig,
    ServerConfig,
    resolve_model,
    valid_model_name,
)
from snoozeml.errors import InvalidInput
from snoozeml.hub.scan import ScannedModel, scan

# ModelMesh's model types (KServe's model format names) and the format that serves them.
KINDS = {
    "onnx": "onnx",
    "pytorch": "torch",
    "torch": "torch",
    "safetensors": "torch",
    "huggingface": "torch",
    "transformers": "torch",
}


def check_name(name: str) -> None:
    if not valid_model_name(name) or len(name) > 256:
        raise InvalidInput(f"invalid model name {name[:100]!r}: letters, digits, '_', '-' and "
                           "'.', starting with a letter or digit, at most 256 characters")


def kind_of(model_type: str, model_key: str = "") -> str | None:
    """The format `model_type` (or, when it is empty, `model_key`'s `model_type.name`) asks
    for; None when neither names one. InvalidInput for a type SnoozeML does not serve."""
    kind = model_type.strip().lower()
    if not kind and model_key.strip():
        try:
            key = json.loads(model_key)
        except ValueError:
            key = None  # opaque to us, as ModelMesh allows
        if isinstance(key, dict) and isinstance(key.get("model_type"), dict):
            name = key["model_type"].get("name")
            kind = name.strip().lower() if isinstance(name, str) else ""
    if not kind:
        return None
    if kind not in KINDS:
        raise InvalidInput(f"model type {kind!r} is not one SnoozeML serves "
                           f"({', '.join(sorted(KINDS))})")
    return KINDS[kind]


def spec_for_path(
    name: str, path: Path, server: ServerConfig, kind: str | None = None,
    idle_timeout: float | str | None = "server",
) -> ModelConfig:
    """The entry for the model at `path` (blocking: reads files; run it off the loop).
    `idle_timeout` None pins the model; "server" inherits `[server] idle_timeout`."""
    check_name(name)
    if not path.is_absolute():
        raise InvalidInput(f"model path {str(path)!r} must be absolute")
    if not path.exists():
        raise InvalidInput(f"no such file or folder: {path}")
    found = [m for m in scan(path, base_name=name).models if kind is None or m.format == kind]
    if not found:
        wanted = {"onnx": "ONNX", "torch": "safetensors"}.get(kind or "", "ONNX or safetensors")
        raise InvalidInput(f"no {wanted} model found at {path}")
    if len(found) > 1:
        names = ", ".join(str(m.path.relative_to(path) if path.is_dir() else m.path)
                          for m in found[:5])
        raise InvalidInput(f"{path} holds {len(found)} models ({names}); give the path of one")
    model = found[0]
    if model.format == "torch" and model.path.is_file():
        raise InvalidInput(f"{model.path} is a bare safetensors state dict: its module and "
                           "tensors must be declared in models.toml")
    return resolve_model(_entry(name, model, idle_timeout), server, path.parent)


def _entry(name: str, model: ScannedModel, idle_timeout: float | str | None) -> ModelConfig:
    fields: dict[str, object] = {"name": name, "path": model.path, "format": model.format}
    for key in ("task", "pooling", "normalize", "max_length", "image"):
        if getattr(model, key) is not None:
            fields[key] = getattr(model, key)
    if model.tokenize:
        fields["tokenize"] = True
    if model.max_batch_size is not None:
        fields["batching"] = BatchingConfig(max_batch_size=model.max_batch_size)
    if idle_timeout != "server":
        fields["idle_timeout"] = "never" if idle_timeout is None else idle_timeout
    return ModelConfig(**fields)  # type: ignore[arg-type]


def file_bytes(path: Path) -> int:
    """The bytes of the files at `path` (a file, or a folder's, hidden ones aside): a model's
    size from its files alone, for ModelMesh's predictModelSize. InvalidInput when there is
    nothing at `path`."""
    if not path.is_absolute():
        raise InvalidInput(f"model path {str(path)!r} must be absolute")
    if not path.exists():
        raise InvalidInput(f"no such file or folder: {path}")
    if path.is_file():
        return path.stat().st_size
    total = 0
    for folder, folders, files in os.walk(path):
        folders[:] = [f for f in folders if not f.startswith(".")]
        for file in files:
            if not file.startswith("."):
                try:
                    total += (Path(folder) / file).stat().st_size
                except OSError:
                    continue  # gone meanwhile, or a dangling link
    return total
