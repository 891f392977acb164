"""ONNX models loaded the way the engine loads them, with or without the weights cache: the
entry for a model, a MatMul model whose weights pre-packing copies, rows to run, and a load
that runs the work its plan left for later. The ONNX cache, split and instance tests share
them; their fixtures (`cache`, `closing`) are in tests/unit/runtime/onnx/conftest.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.onnx.instance import OnnxInstance


def spec(path: Path, prepack: str = "auto", **extra: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": path.stem, "path": path, "format": "onnx",
                                       "device": "cpu", "prepack": prepack, **extra})


def write_matmul(path: Path, seed: int = 0, external: bool = False) -> Path:
    """x [N, 256] -> MatMul w [256, 512] -> Add b -> Relu -> MatMul v [512, 64] -> y: weights
    that pre-packing copies (w, v) beside one it does not (b)."""
    rng = np.random.default_rng(seed)
    tensors = [
        numpy_helper.from_array(rng.standard_normal((256, 512), dtype=np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(512, dtype=np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((512, 64), dtype=np.float32), "v"),
    ]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "v"], ["y"])],
        "matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data",
                  size_threshold=0)
    else:
        onnx.save(model, str(path))
    return path


def rows(count: int, width: int = 256, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width), dtype=np.float32)


def run(instance: OnnxInstance, x: np.ndarray) -> np.ndarray:
    return instance.run_blocking({"x": x}, None)["y"]


def load(backend: OnnxBackend, model: ModelConfig, closing: list[OnnxInstance]) -> OnnxInstance:
    """A load as the engine does one: its plan, the load, then the work it left for later."""
    plan = backend.load_plan_blocking(model, backend.file_sizes_blocking(model))
    instance = backend.load_blocking(model)
    closing.append(instance)
    if plan.background:
        backend.background_blocking(model)
    return instance
