"""Which backend serves a model: chosen by its format, imported only when a model needs it, so
a daemon serving ONNX alone never imports torch."""

from __future__ import annotations

from pathlib import Path

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.base import Backend
from snoozeml.runtime.unavailable import UnavailableBackend


def backend_for(spec: ModelConfig, cache_dir: Path | None = None) -> Backend:
    """The backend that serves `spec.format`, or one whose loads fail saying why not (an
    unknown format, or torch models without the torch extra installed). `cache_dir` holds
    the ONNX weights cache (None: none)."""
    if spec.format == "onnx":
        from snoozeml.runtime.onnx.backend import OnnxBackend

        return OnnxBackend(cache_dir / "onnx" if cache_dir is not None else None)
    if spec.format == "torch":
        try:
            from snoozeml.runtime.torch.backend import TorchBackend
        except ImportError as exc:
            reason = str(exc)
            if "snoozeml[torch]" not in reason:  # runtime/torch/backend.py's own message names it
                reason += "; torch models need the extra: pip install 'snoozeml[torch]'"
            return UnavailableBackend(reason)
        return TorchBackend()
    return UnavailableBackend(f"model format {spec.format!r} is not supported")
