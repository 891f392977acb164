"""A ready-to-serve demo: two small ONNX models and the ``models.toml`` that serves them.

``python -m snoozeml.demo DEST`` (or :func:`make_demo`) writes into DEST:

- ``classifier.onnx``: an iris-like tabular classifier, ``features`` FP32 [-1, 4]
  (sepal length, sepal width, petal length, petal width in cm) -> ``probabilities``
  FP32 [-1, 3] (setosa, versicolor, virginica), a softmax over fixed logistic-regression weights;
- ``embedder.onnx``: a small embedding MLP, ``tokens`` FP32 [-1, 32] -> ``embedding``
  FP32 [-1, 64], L2-normalised per row; weights from a fixed seed;
- ``models.toml``: both models, the classifier with a short ``idle_timeout`` so scale-to-zero
  shows within a minute.

Running it again overwrites the same files with identical bytes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_OPSET = 17
_IR_VERSION = 8  # loadable by every onnxruntime the project supports (>= 1.18)
_EMBEDDER_SEED = 20240601

# Multinomial logistic regression on Fisher's iris measurements (cm); rows are features,
# columns classes. Rounded, but they still separate the three species on typical flowers.
_IRIS_WEIGHTS = np.array(
    [
        [-0.42, 0.53, -0.11],
        [0.97, -0.32, -0.65],
        [-2.52, -0.21, 2.73],
        [-1.08, -0.94, 2.02],
    ],
    dtype=np.float32,
)
_IRIS_BIAS = np.array([9.85, 2.23, -12.08], dtype=np.float32)

MODELS_TOML = """\
# Written by `python -m snoozeml.demo`; serve it with `snooze serve -c models.toml`.
[server]
host = "127.0.0.1"
http_port = 8080
grpc_port = 8081
idle_timeout = "5m"

[[models]]
name = "classifier"
path = "classifier.onnx"
idle_timeout = "30s"

[[models]]
name = "embedder"
path = "embedder.onnx"
"""


def _write_model(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET)],
        producer_name="snoozeml-demo",
    )
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())


def _classifier_graph() -> onnx.GraphProto:
    nodes = [
        helper.make_node("Gemm", ["features", "weights", "bias"], ["logits"], name="linear"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1, name="softmax"),
    ]
    return helper.make_graph(
        nodes,
        "iris_like_classifier",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 3])],
        [
            numpy_helper.from_array(_IRIS_WEIGHTS, "weights"),
            numpy_helper.from_array(_IRIS_BIAS, "bias"),
        ],
    )


def _embedder_graph() -> onnx.GraphProto:
    rng = np.random.default_rng(_EMBEDDER_SEED)
    w0 = (rng.standard_normal((32, 128)) * np.sqrt(2.0 / 32)).astype(np.float32)
    b0 = np.zeros(128, dtype=np.float32)
    w1 = (rng.standard_normal((128, 64)) * np.sqrt(1.0 / 128)).astype(np.float32)
    b1 = np.zeros(64, dtype=np.float32)
    nodes = [
        helper.make_node("Gemm", ["tokens", "w0", "b0"], ["h"], name="hidden"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w1", "b1"], ["projected"], name="projection"),
        helper.make_node("ReduceL2", ["projected"], ["norm"], axes=[1], keepdims=1, name="norm"),
        # An all-zero row would divide by zero; the floor keeps it finite (it stays zero).
        helper.make_node("Max", ["norm", "eps"], ["safe_norm"], name="floor"),
        helper.make_node("Div", ["projected", "safe_norm"], ["embedding"], name="normalise"),
    ]
    return helper.make_graph(
        nodes,
        "embedder",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", 64])],
        [
            numpy_helper.from_array(w0, "w0"),
            numpy_helper.from_array(b0, "b0"),
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(np.array(1e-12, dtype=np.float32), "eps"),
        ],
    )


def make_demo(dest: Path) -> Path:
    """Write the two demo models and their ``models.toml`` into ``dest``; return the TOML path.

    ``dest`` is created if missing; existing demo files in it are overwritten.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    _write_model(_classifier_graph(), dest / "classifier.onnx")
    _write_model(_embedder_graph(), dest / "embedder.onnx")
    config = dest / "models.toml"
    config.write_text(MODELS_TOML, encoding="utf-8")
    return config


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m snoozeml.demo",
        description="Write two demo ONNX models and a models.toml that serves them.",
    )
    parser.add_argument("dest", type=Path, help="folder to write into (created if missing)")
    args = parser.parse_args(argv)
    config = make_demo(args.dest)
    print(f"wrote {config}")
    print(f"serve it with: snooze serve -c {config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
