"""A real ONNX instance (runtime/onnx/instance.py): a batch answers each request its own rows,
an output that ignores the rows is unsplittable, and what onnxruntime rejects is the input's
fault while a failure inside it is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from model_specs import onnx_spec
from onnx_models import reference_session, write_mlp, write_run_failure_model

from snoozeml.errors import InvalidInput
from snoozeml.runtime.base import Unsplittable
from snoozeml.runtime.onnx.backend import OnnxBackend


def test_an_onnx_batch_answers_each_request_its_own_rows(tmp_path: Path) -> None:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(4, 16, 3))
    instance = OnnxBackend().load_blocking(onnx_spec(path))
    reference = reference_session(path)
    rng = np.random.default_rng(3)
    requests = [{"x": rng.standard_normal((rows, 4), dtype=np.float32)} for rows in (2, 0, 1, 5)]

    try:
        answers = instance.run_batch_blocking(requests, None)
    finally:
        instance.close()

    assert len(answers) == len(requests)
    for request, answer in zip(requests, answers, strict=True):
        [expected] = reference.run(None, request)
        assert answer.keys() == {"y"}
        assert answer["y"].shape == expected.shape
        np.testing.assert_allclose(answer["y"], expected, rtol=1e-5, atol=1e-6)


def test_an_onnx_batch_whose_output_ignores_the_rows_is_unsplittable(tmp_path: Path) -> None:
    # y = Reshape(x, [3, -1]): six rows in, three rows out.
    instance = OnnxBackend().load_blocking(onnx_spec(write_run_failure_model(tmp_path / "r.onnx")))
    requests = [{"x": np.ones((rows, 4), np.float32)} for rows in (2, 4)]

    with pytest.raises(Unsplittable, match="'y'"):
        instance.run_batch_blocking(requests, None)


@pytest.mark.parametrize("x", [
    pytest.param(np.ones((2, 4), np.float64), id="a-dtype-the-graph-does-not-take"),
    pytest.param(np.ones((2, 5), np.float32), id="a-width-the-graph-does-not-take"),
])
def test_an_input_onnxruntime_rejects_is_invalid_input(tmp_path: Path, x: np.ndarray) -> None:
    instance = OnnxBackend().load_blocking(onnx_spec(write_mlp(tmp_path / "mlp.onnx",
                                                              dims=(4, 8, 3))))

    with pytest.raises(InvalidInput, match="model 'mlp' rejected the input: ") as info:
        instance.run_blocking({"x": x}, None)

    assert type(info.value.__cause__).__name__ == "InvalidArgument"


def test_a_failure_inside_onnxruntime_is_not_the_inputs_fault(tmp_path: Path) -> None:
    # Reshape to three rows fails for two: onnxruntime's FAIL, a backend failure.
    instance = OnnxBackend().load_blocking(onnx_spec(write_run_failure_model(tmp_path / "r.onnx")))

    with pytest.raises(Exception) as info:  # noqa: PT011 - the class is onnxruntime's own
        instance.run_blocking({"x": np.ones((2, 4), np.float32)}, None)

    assert not isinstance(info.value, InvalidInput)
    assert not OnnxBackend().is_out_of_memory(info.value)
