"""Choosing a backend (runtime/registry.py): ONNX and torch models get theirs, torch models
without torch get one that names the extra, and serving ONNX alone never imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from model_specs import spec_on
from onnx_models import write_mlp

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.base import FileSizes
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.registry import backend_for
from snoozeml.runtime.unavailable import UnavailableBackend


def test_onnx_models_get_the_onnx_backend() -> None:
    assert isinstance(backend_for(spec_on("cpu", fmt="onnx")), OnnxBackend)


def test_torch_models_get_the_torch_backend(torch_backend: Any) -> None:
    assert isinstance(backend_for(spec_on("cpu")), torch_backend)


def test_torch_models_without_torch_fail_to_load_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    # As if torch were not installed: importing it fails, and runtime/torch/ is imported
    # afresh (monkeypatch puts every module back afterwards).
    monkeypatch.setitem(sys.modules, "torch", None)
    for name in [n for n in sys.modules if n.startswith("snoozeml.runtime.torch")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'snoozeml\[torch\]'"):
        import snoozeml.runtime.torch.backend  # noqa: F401

    backend = backend_for(ModelConfig(name="m", path=tmp_path / "m", format="torch"))

    assert isinstance(backend, UnavailableBackend)
    assert backend.reason == (
        "serving safetensors models needs PyTorch: pip install 'snoozeml[torch]'"
    )
    with pytest.raises(RuntimeError, match=r"pip install 'snoozeml\[torch\]'"):
        backend.load_blocking(ModelConfig(name="m", path=tmp_path / "m", format="torch"))
    assert backend.file_sizes_blocking(
        ModelConfig(name="m", path=tmp_path / "m", format="torch")
    ) == FileSizes(0, 0)


def test_serving_onnx_alone_never_imports_torch(tmp_path: Path) -> None:
    # A fresh interpreter: this one has torch imported by the tests above.
    path = write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 3))
    script = (
        "import sys\n"
        "import numpy as np\n"
        "from snoozeml.config.settings import ModelConfig\n"
        "from snoozeml.runtime.registry import backend_for\n"
        f"spec = ModelConfig(name='mlp', path={str(path)!r}, format='onnx', device='cpu')\n"
        "backend = backend_for(spec)\n"
        "backend.file_sizes_blocking(spec)\n"
        "backend.prepare_blocking(spec)\n"
        "instance = backend.load_blocking(spec)\n"
        "instance.run_batch_blocking([{'x': np.ones((2, 4), np.float32)}] * 2, None)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_a_model_without_a_format_gets_a_backend_that_says_so() -> None:
    backend = backend_for(ModelConfig(name="m", path=Path("m.bin"), format=None))
    assert isinstance(backend, UnavailableBackend)
    assert backend.reason == "model format None is not supported"
