"""A state-dict model served in process (runtime/torch/state_dict.py): a batch answers each
request its own rows, as the module answers them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from snoozeml.config.settings import ModelConfig, TensorConfig


@pytest.fixture
def clean_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo what loading a state dict does to the process: its folder on sys.path, its module
    imported under its own name."""
    monkeypatch.setattr(sys, "path", [*sys.path])
    yield
    sys.modules.pop("mymodel", None)


def test_a_state_dict_batch_answers_each_request_its_own_rows(
    torch_backend: Any, tmp_path: Path, clean_imports: None,
) -> None:
    import torch
    from torch_models import save_state_dict

    module = save_state_dict(tmp_path)
    spec = ModelConfig(
        name="plain", path=tmp_path / "weights.safetensors", format="torch", device="cpu",
        module="mymodel:build",
        inputs=[TensorConfig(name="x", datatype="FP32", shape=[-1, 8])],
        outputs=[TensorConfig(name="y", datatype="FP32", shape=[-1, 3])],
    )
    backend = torch_backend()
    backend.prepare_blocking(spec)
    instance = backend.load_blocking(spec)
    rng = np.random.default_rng(5)
    requests = [{"x": rng.standard_normal((rows, 8), dtype=np.float32)} for rows in (1, 3, 2)]
    for request in requests:
        instance.validate_inputs(request)

    try:
        answers = instance.run_batch_blocking(requests, None)
    finally:
        instance.close()

    for request, answer in zip(requests, answers, strict=True):
        with torch.inference_mode():
            expected = module(torch.from_numpy(request["x"])).numpy()
        np.testing.assert_allclose(answer["y"], expected, rtol=1e-5, atol=1e-6)
