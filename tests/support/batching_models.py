"""Tiny real ONNX models for the batching tests, written with ``onnx.helper``.

Plain functions like those in onnx_models.py: each writes one ``.onnx`` file and returns its
path. Opset 17, IR version 8.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="snoozeml-tests"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def write_matmul_chain_model(
    path: Path, matmuls: int = 64, size: int = 1024, fail_on_negative: bool = False
) -> Path:
    """``x`` FP32 [batch, 1] -> ``y`` FP32 [batch, 1] equal to ``x``, after ``matmuls`` dense
    ``size`` x ``size`` MatMuls (about 0.7 s on one thread of a 2-core box with the defaults),
    so that requests queue up behind a running one.

    The chain starts from ``W * ReduceMean(x)`` and ends in ``y = x + 0 * ReduceSum(A_K)``, so
    it depends on the input and onnxruntime cannot constant-fold it. ``W`` is the all-``1/size``
    matrix, which is idempotent: the chain stays finite and ``0 * sum`` is exactly 0.

    With ``fail_on_negative``, ``y`` goes through a Reshape to ``[batch, 1 + any(x < 0)]``: a
    run whose batch holds a negative value fails inside onnxruntime (a runtime error, not an
    invalid argument), while any other run succeeds.
    """
    weight = np.full((size, size), 1.0 / size, dtype=np.float32)
    initializers = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0, name="mean"),
        helper.make_node("Mul", ["w", "mean"], ["a0"], name="seed"),
    ]
    for i in range(matmuls):
        nodes.append(helper.make_node("MatMul", [f"a{i}", "w"], [f"a{i + 1}"], name=f"mm{i}"))
    nodes += [
        helper.make_node("ReduceSum", [f"a{matmuls}"], ["total"], keepdims=0, name="total"),
        helper.make_node("Mul", ["total", "zero"], ["nothing"], name="nothing"),
    ]
    if fail_on_negative:
        initializers += [
            numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
        ]
        nodes += [
            helper.make_node("ReduceMin", ["x"], ["lowest"], keepdims=0, name="lowest"),
            helper.make_node("Less", ["lowest", "zero"], ["negative"], name="negative"),
            helper.make_node("Cast", ["negative"], ["extra"], to=TensorProto.INT64, name="cast"),
            helper.make_node("Add", ["extra", "one"], ["width"], name="width"),
            helper.make_node("Unsqueeze", ["width", "axis0"], ["width1"], name="width1"),
            helper.make_node("Shape", ["x"], ["rows"], end=1, name="rows"),
            helper.make_node("Concat", ["rows", "width1"], ["target"], axis=0, name="target"),
            helper.make_node("Reshape", ["x", "target"], ["reshaped"], name="reshape"),
            helper.make_node("Add", ["reshaped", "nothing"], ["y"], name="add"),
        ]
    else:
        nodes.append(helper.make_node("Add", ["x", "nothing"], ["y"], name="add"))
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        initializers,
    )
    return _save(graph, path)


def write_doubler(path: Path) -> Path:
    """``x`` FP32 [batch, width] (both dynamic) -> ``y`` = x * 2, same shape."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"], name="double")],
        "doubler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "width"])],
        [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    return _save(graph, path)
