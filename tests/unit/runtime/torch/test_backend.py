"""The torch backend (runtime/torch/backend.py) on its own: which errors are out of memory,
which device a model counts against, and what a folder or a safetensors file weighs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from allocator_failures import ALLOCATOR_FAILURES
from model_specs import spec_on

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.base import FileSizes


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda.OutOfMemoryError, which is matched by name."""


@pytest.mark.parametrize(("error", "expected"), [
    *ALLOCATOR_FAILURES,
    pytest.param(OutOfMemoryError("CUDA error"), True, id="a-class-named-OutOfMemoryError"),
])
def test_torch_is_out_of_memory(torch_backend: Any, error: BaseException,
                                expected: bool) -> None:
    assert torch_backend().is_out_of_memory(error) is expected


def test_torch_is_out_of_memory_knows_torchs_own_class_under_any_name(
    torch_backend: Any,
) -> None:
    import torch

    base = getattr(torch, "OutOfMemoryError", None)
    if base is None:
        pytest.skip("this torch has no top-level OutOfMemoryError")

    class DeviceFull(base):
        pass

    assert torch_backend().is_out_of_memory(DeviceFull("no room"))


@pytest.mark.parametrize(("spec", "gpus", "device"), [
    pytest.param(spec_on("cpu"), ["cuda:0"], "cpu", id="cpu-stays-on-the-host"),
    pytest.param(spec_on("mps"), ["cuda:0"], "cpu", id="mps-shares-the-host-memory"),
    pytest.param(spec_on("auto"), [], "cpu", id="auto-without-gpus"),
    pytest.param(spec_on("cuda"), [], "cpu", id="cuda-without-gpus-is-inert"),
    pytest.param(spec_on("auto"), ["cuda:0", "cuda:1"], "cuda:0", id="auto-takes-the-first-gpu"),
    pytest.param(spec_on("cuda"), ["cuda:0", "cuda:1"], "cuda:0", id="cuda-means-cuda-0"),
    pytest.param(spec_on("cuda:1"), ["cuda:0", "cuda:1"], "cuda:1", id="a-named-gpu"),
    pytest.param(spec_on("cuda:3"), ["cuda:0", "cuda:1"], "cpu", id="a-gpu-that-is-not-there"),
])
def test_torch_memory_device(torch_backend: Any, spec: ModelConfig, gpus: list[str],
                             device: str) -> None:
    assert torch_backend().memory_device(spec, gpus) == device


def test_a_torch_folder_counts_its_weight_files_only(torch_backend: Any, tmp_path: Path) -> None:
    folder = tmp_path / "bert"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    (folder / "sub" / "extra.bin").write_bytes(b"\0" * 300)
    (folder / "tokenizer.json").write_bytes(b"{}" * 5000)
    (folder / "README.md").write_text("a long model card " * 100)
    spec = ModelConfig(name="bert", path=folder, format="torch")
    assert torch_backend().file_sizes_blocking(spec) == FileSizes(weights=1300, transient=0)


def test_a_single_safetensors_file_counts_itself(torch_backend: Any, tmp_path: Path) -> None:
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"\0" * 4096)
    spec = ModelConfig(name="w", path=path, format="torch")
    assert torch_backend().file_sizes_blocking(spec) == FileSizes(weights=4096, transient=0)
