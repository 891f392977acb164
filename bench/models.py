"""ONNX models for the benchmarks, written with ``onnx.helper`` and numpy.

- :func:`write_bench_mlp`: the HTTP latency/throughput model, an MLP 64 -> 256 -> 64 (FP32,
  ReLU, dynamic batch). Small on purpose: its compute is a few microseconds, so what the HTTP
  benchmark sees is mostly the daemon's own cost per request.
- :func:`write_heavy_mlp`: MLP 512 -> 2048 -> 2048 -> 512 for the micro-batching benchmark,
  heavy enough per call that coalescing rows pays off.
- :func:`write_embedding`: the protocol benchmark's small model, one MatMul 384 -> 384 (an
  embedding-sized output, 1x384 FP32 per row).
- :func:`write_image_mean`: the protocol benchmark's large-input model, the mean of each image
  of a [batch, 3, 224, 224] FP32 input (64 images are about 38 MB in, 256 bytes out).
- :func:`write_null`: one Relu, ``x`` [batch, width] -> ``y`` [batch, width]: a model whose
  run costs next to nothing, so serving it measures the daemon alone (the throughput benchmark
  sets it beside an MLP of the same widths).
- :func:`write_lookup_table`: the memory benchmark's model, a Gather from a random FP32 table
  of a chosen size (about 100 MiB there): big to load, almost free to run.

All have input ``x`` and output ``y`` with a dynamic first dimension, opset 17 and IR version
8, and fixed-seed weights. ``python bench/models.py DEST`` writes the first four into DEST.
Self-contained on purpose: benchmarks do not import the test helpers.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
BENCH_MLP_DIMS = (64, 256, 64)
HEAVY_MLP_DIMS = (512, 2048, 2048, 512)
EMBEDDING_WIDTH = 384
IMAGE_SHAPE = (3, 224, 224)


def write_mlp(path: Path, dims: Sequence[int], seed: int = 0) -> Path:
    """Gemm per layer, ReLU between layers; ``x`` [batch, dims[0]] -> ``y`` [batch, dims[-1]]."""
    if len(dims) < 2:
        raise ValueError(f"an MLP needs at least two dims, got {tuple(dims)}")
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    current = "x"
    last_layer = len(dims) - 2
    for i, (rows, cols) in enumerate(itertools.pairwise(dims)):
        weight = (rng.standard_normal((rows, cols)) * np.sqrt(2.0 / rows)).astype(np.float32)
        bias = (rng.standard_normal(cols) * 0.01).astype(np.float32)
        initializers += [
            numpy_helper.from_array(weight, f"w{i}"),
            numpy_helper.from_array(bias, f"b{i}"),
        ]
        out = "y" if i == last_layer else f"h{i}"
        nodes.append(helper.make_node("Gemm", [current, f"w{i}", f"b{i}"], [out], name=f"gemm{i}"))
        if i != last_layer:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"], name=f"relu{i}"))
            out = f"r{i}"
        current = out
    graph = helper.make_graph(
        nodes,
        "mlp_" + "x".join(str(d) for d in dims),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dims[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", dims[-1]])],
        initializers,
    )
    return _save(graph, path)


def write_bench_mlp(path: Path, seed: int = 0) -> Path:
    """The HTTP benchmark model: MLP 64 -> 256 -> 64, FP32, ReLU, dynamic batch."""
    return write_mlp(path, BENCH_MLP_DIMS, seed)


def write_heavy_mlp(path: Path, seed: int = 0) -> Path:
    """The batching benchmark model: MLP 512 -> 2048 -> 2048 -> 512 (about 24 MiB of weights)."""
    return write_mlp(path, HEAVY_MLP_DIMS, seed)


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="snoozeml-bench"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def write_embedding(path: Path, width: int = EMBEDDING_WIDTH, seed: int = 0) -> Path:
    """``x`` FP32 [batch, width] -> MatMul (width x width) -> ``y`` FP32 [batch, width]."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")],
        f"embedding_{width}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        [numpy_helper.from_array(weight, "w")],
    )
    return _save(graph, path)


def write_image_mean(path: Path, image: Sequence[int] = IMAGE_SHAPE) -> Path:
    """``x`` FP32 [batch, *image] -> ReduceMean over every axis but the first -> ``y`` FP32
    [batch]: a large input with a tiny output, so the request is what costs."""
    axes = list(range(1, len(image) + 1))
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=axes, keepdims=0, name="mean")],
        "image_mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", *image])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
    )
    return _save(graph, path)


def write_null64_daemon(folder: Path) -> Path:
    """``null-64.onnx`` and a ``models.toml`` serving it (preloaded, one intra-op thread, never
    idle) in ``folder``; returns the config's path. The daemon side of the two floor benches."""
    write_null(folder / "null-64.onnx", 64)
    config = folder / "models.toml"
    config.write_text('[server]\nidle_timeout = "never"\n\n[[models]]\nname = "null-64"\n'
                      'path = "null-64.onnx"\npreload = true\nintra_op_threads = 1\n',
                      encoding="utf-8")
    return config


def write_null(path: Path, width: int) -> Path:
    """``x`` FP32 [batch, width] -> Relu -> ``y`` FP32 [batch, width]: the cheapest model with
    the same input and output sizes as a real one."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        f"null_{width}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
    )
    return _save(graph, path)


def write_lookup_table(path: Path, rows: int, width: int, seed: int = 0) -> np.ndarray:
    """``x`` INT64 [batch] -> Gather from a random FP32 [rows, width] table -> ``y`` FP32
    [batch, width]. Random values, so the file does not compress; returns the table (row ``i``
    is the answer for index ``i``)."""
    table = np.random.default_rng(seed).standard_normal((rows, width), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "x"], ["y"], axis=0, name="lookup")],
        f"lookup_{rows}x{width}",
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        [numpy_helper.from_array(table, "table")],
    )
    _save(graph, path)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the benchmark ONNX models into DEST.")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    for written in (
        write_bench_mlp(args.dest / "mlp.onnx"),
        write_heavy_mlp(args.dest / "heavy_mlp.onnx"),
        write_embedding(args.dest / "embedding.onnx"),
        write_image_mean(args.dest / "image_mean.onnx"),
    ):
        print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
