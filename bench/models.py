"""ONNX models for the benchmarks, written with ``onnx.helper`` and numpy.

- :func:`write_bench_mlp`: the HTTP latency/throughput model, an MLP 64 -> 256 -> 64 (FP32,
  ReLU, dynamic batch). Small on purpose: its compute is a few microseconds, so what the HTTP
  benchmark sees is mostly the daemon's own cost per request.
- :func:`write_heavy_mlp`: MLP 512 -> 2048 -> 2048 -> 512 for the micro-batching benchmark,
  heavy enough per call that coalescing rows pays off.

Both have input ``x`` FP32 [batch, in] and output ``y`` FP32 [batch, out], opset 17 and IR
version 8, and fixed-seed weights. ``python bench/models.py DEST`` writes both into DEST.
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
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="snoozeml-bench"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def write_bench_mlp(path: Path, seed: int = 0) -> Path:
    """The HTTP benchmark model: MLP 64 -> 256 -> 64, FP32, ReLU, dynamic batch."""
    return write_mlp(path, BENCH_MLP_DIMS, seed)


def write_heavy_mlp(path: Path, seed: int = 0) -> Path:
    """The batching benchmark model: MLP 512 -> 2048 -> 2048 -> 512 (about 24 MiB of weights)."""
    return write_mlp(path, HEAVY_MLP_DIMS, seed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the benchmark ONNX models into DEST.")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    for written in (
        write_bench_mlp(args.dest / "mlp.onnx"),
        write_heavy_mlp(args.dest / "heavy_mlp.onnx"),
    ):
        print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
