"""Classifiers with class labels, for the classification extension's tests: an ONNX-ML
LinearClassifier that carries its labels, written with onnx.helper, and a labels file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx_models import IR_VERSION, OPSET

ANIMALS = ("cat", "dog", "eel")


def write_ml_classifier(path: Path, labels: Sequence[str] = ANIMALS, seed: int = 0,
                        through: str | None = "Identity") -> Path:
    """`features` FP32 [batch, 4] -> `label` BYTES [batch] and `probabilities` FP32
    [batch, len(labels)]: an ai.onnx.ml LinearClassifier (softmax scores) with
    `classlabels_strings`, its scores reaching the output through `through` (None: directly),
    as skl2onnx writes a classifier exported with zipmap=False."""
    rng = np.random.default_rng(seed)
    classes = len(labels)
    coefficients = rng.standard_normal(classes * 4).astype(np.float32)
    intercepts = rng.standard_normal(classes).astype(np.float32) * 0.1
    scores = "scores" if through else "probabilities"
    nodes = [helper.make_node(
        "LinearClassifier", ["features"], ["label", scores], domain="ai.onnx.ml",
        coefficients=coefficients.tolist(), intercepts=intercepts.tolist(),
        classlabels_strings=list(labels), post_transform="SOFTMAX", multi_class=0)]
    if through:
        extra = {"to": TensorProto.FLOAT} if through == "Cast" else {}
        nodes.append(helper.make_node(through, [scores], ["probabilities"], **extra))
    graph = helper.make_graph(
        nodes, "ml_classifier",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("label", TensorProto.STRING, ["batch"]),
         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT,
                                       ["batch", classes])])
    model = helper.make_model(graph, producer_name="snoozeml-tests", opset_imports=[
        helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def write_labels(path: Path, labels: Sequence[str]) -> Path:
    path.write_text("".join(f"{label}\n" for label in labels), encoding="utf-8")
    return path
