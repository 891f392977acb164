"""Tiny real ONNX models for the tests, written with ``onnx.helper`` and numpy.

Plain functions, not fixtures: each writes one ``.onnx`` file and returns its path, so a
fixture, a test body or a scratch script can all call them. Every model is opset 17 with
IR version 8, which onnxruntime 1.18 and later load. Weights come from a seeded numpy
generator, so the same arguments always write the same file.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
# How close a served answer is to a reference onnxruntime session's: the daemon runs a model
# with unpacked MatMul/Gemm weights until a batch of more than one row makes it pre-pack them
# (docs/models.md), and the two kernels agree to float32 rounding, not bit for bit.
SERVED = {"rtol": 1e-5, "atol": 1e-6}
# A single protobuf cannot exceed 2 GiB; stay clear of it for the one-file big model.
_PROTOBUF_LIMIT_BYTES = 2**31 - 1 - 16 * 2**20

Dim = int | str | None


def _save(graph: onnx.GraphProto, path: Path, check: bool = True) -> Path:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="snoozeml-tests",
    )
    model.ir_version = IR_VERSION
    if check:  # the checker serialises the whole model again: skipped for the big one
        onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # SerializeToString + write keeps everything in one file (never external data).
    path.write_bytes(model.SerializeToString())
    return path


def _value(name: str, elem_type: int, shape: Sequence[Dim]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def _weight(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    # He-style scale keeps activations O(1) through a few ReLU layers.
    scale = np.float32(np.sqrt(2.0 / rows))
    return (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float32)


def write_mlp(
    path: Path,
    dims: Sequence[int] = (64, 256, 64),
    seed: int = 0,
    batch_dim: str | None = "batch",
) -> Path:
    """An MLP ``x`` FP32 [batch, dims[0]] -> ``y`` FP32 [batch, dims[-1]].

    One Gemm per consecutive pair of ``dims`` with ReLU between layers (not after the last).
    ``batch_dim=None`` fixes the first dimension to 1 instead of a named dynamic dimension.
    """
    if len(dims) < 2:
        raise ValueError(f"an MLP needs at least two dims, got {tuple(dims)}")
    rng = np.random.default_rng(seed)
    batch: Dim = batch_dim if batch_dim is not None else 1
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    current = "x"
    layers = len(dims) - 1
    for i, (rows, cols) in enumerate(itertools.pairwise(dims)):
        w_name, b_name = f"w{i}", f"b{i}"
        initializers.append(numpy_helper.from_array(_weight(rng, rows, cols), w_name))
        bias = (rng.standard_normal(cols, dtype=np.float32) * np.float32(0.01)).astype(np.float32)
        initializers.append(numpy_helper.from_array(bias, b_name))
        last = i == layers - 1
        out = "y" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [current, w_name, b_name], [out], name=f"gemm{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"], name=f"relu{i}"))
            out = f"r{i}"
        current = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [_value("x", TensorProto.FLOAT, [batch, dims[0]])],
        [_value("y", TensorProto.FLOAT, [batch, dims[-1]])],
        initializers,
    )
    return _save(graph, path)


def write_big_model(path: Path, megabytes: float = 120, seed: int = 0, k: int = 4) -> Path:
    """A model whose weights take about ``megabytes`` MiB, cheap to run, in one file.

    ``x`` FP32 [batch, 16] -> MatMul with a random FP32 weight [16, N] (random, so it neither
    compresses nor deduplicates) -> Reshape [batch, k, N/k] -> ReduceMean -> ``y`` FP32
    [batch, k]. Every weight value feeds the output, so no graph optimisation can drop it.
    """
    in_features = 16
    columns = int(megabytes * 2**20) // (in_features * 4)
    columns -= columns % k
    if columns <= 0:
        raise ValueError(f"megabytes={megabytes} is too small for a [16, N] weight")
    if columns * in_features * 4 >= _PROTOBUF_LIMIT_BYTES:
        raise ValueError(f"megabytes={megabytes} does not fit one protobuf (< 2 GiB)")
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((in_features, columns), dtype=np.float32)
    weight *= np.float32(1.0 / np.sqrt(in_features))
    initializers = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(np.array([0, k, -1], dtype=np.int64), "fold_shape"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
        helper.make_node("Reshape", ["h", "fold_shape"], ["folded"], name="fold"),
        helper.make_node("ReduceMean", ["folded"], ["y"], axes=[2], keepdims=0, name="mean"),
    ]
    graph = helper.make_graph(
        nodes,
        "big",
        [_value("x", TensorProto.FLOAT, ["batch", in_features])],
        [_value("y", TensorProto.FLOAT, ["batch", k])],
        initializers,
    )
    return _save(graph, path, check=False)


def write_multi_dtype_model(path: Path) -> Path:
    """One input and one output per datatype family, each a trivial elementwise op.

    f32 FP32 [-1,4] -> f32_out = f32*2;  i64 INT64 [-1,3] -> i64_out = i64+1;
    flag BOOL [-1,2] -> flag_out = Not(flag);  half FP16 [-1,2] -> half_out = half+half;
    text STRING [-1] -> text_out = Identity(text).
    """
    initializers = [
        numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
    ]
    nodes = [
        helper.make_node("Mul", ["f32", "two"], ["f32_out"], name="double"),
        helper.make_node("Add", ["i64", "one"], ["i64_out"], name="increment"),
        helper.make_node("Not", ["flag"], ["flag_out"], name="negate"),
        helper.make_node("Add", ["half", "half"], ["half_out"], name="sum_half"),
        helper.make_node("Identity", ["text"], ["text_out"], name="echo"),
    ]
    inputs = [
        _value("f32", TensorProto.FLOAT, ["n_f32", 4]),
        _value("i64", TensorProto.INT64, ["n_i64", 3]),
        _value("flag", TensorProto.BOOL, ["n_flag", 2]),
        _value("half", TensorProto.FLOAT16, ["n_half", 2]),
        _value("text", TensorProto.STRING, ["n_text"]),
    ]
    outputs = [
        _value("f32_out", TensorProto.FLOAT, ["n_f32", 4]),
        _value("i64_out", TensorProto.INT64, ["n_i64", 3]),
        _value("flag_out", TensorProto.BOOL, ["n_flag", 2]),
        _value("half_out", TensorProto.FLOAT16, ["n_half", 2]),
        _value("text_out", TensorProto.STRING, ["n_text"]),
    ]
    graph = helper.make_graph(nodes, "multi_dtype", inputs, outputs, initializers)
    return _save(graph, path)


def write_text_model(path: Path) -> Path:
    """``text`` STRING [-1] -> ``echo`` = Identity(text)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["echo"], name="echo")],
        "text",
        [_value("text", TensorProto.STRING, ["n"])],
        [_value("echo", TensorProto.STRING, ["n"])],
    )
    return _save(graph, path)


def write_flag_model(path: Path) -> Path:
    """``flag`` BOOL [-1,2] -> ``flag_out`` = Not(flag)."""
    graph = helper.make_graph(
        [helper.make_node("Not", ["flag"], ["flag_out"], name="negate")],
        "flags",
        [_value("flag", TensorProto.BOOL, ["n", 2])],
        [_value("flag_out", TensorProto.BOOL, ["n", 2])],
    )
    return _save(graph, path)


def write_bf16_model(path: Path) -> Path:
    """``x`` BF16 [-1,2] -> ``wide`` = Cast(x, FP32);  ``f`` FP32 [-1,2] -> ``narrow`` =
    Cast(f, BF16). numpy has no bfloat16: on the wire BF16 is the upper 16 bits of an FP32."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["wide"], name="widen", to=TensorProto.FLOAT),
            helper.make_node("Cast", ["f"], ["narrow"], name="narrow", to=TensorProto.BFLOAT16),
        ],
        "bf16",
        [_value("x", TensorProto.BFLOAT16, ["n", 2]), _value("f", TensorProto.FLOAT, ["m", 2])],
        [
            _value("wide", TensorProto.FLOAT, ["n", 2]),
            _value("narrow", TensorProto.BFLOAT16, ["m", 2]),
        ],
    )
    return _save(graph, path)


def write_fixed_shape_model(path: Path) -> Path:
    """``x`` FP32 [2, 3] (fixed, no batch dimension) -> ``y`` = x + 1."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"], name="add_one")],
        "fixed_shape",
        [_value("x", TensorProto.FLOAT, [2, 3])],
        [_value("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")],
    )
    return _save(graph, path)


def write_corrupt_model(path: Path) -> Path:
    """Bytes that no ONNX loader accepts, under whatever (``.onnx``) name is given."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A leading zero byte is protobuf field tag 0, which is invalid, so parsing fails at once.
    noise = np.random.default_rng(1234).integers(0, 256, size=512, dtype=np.uint8).tobytes()
    path.write_bytes(b"\x00\x00this is not an ONNX model\n" + noise)
    return path


def write_classifier(path: Path, seed: int = 0) -> Path:
    """Tabular classifier ``features`` FP32 [batch, 8] -> ``logits`` FP32 [batch, 3] and
    ``probabilities`` FP32 [batch, 3] = Softmax(logits) over the last axis."""
    rng = np.random.default_rng(seed)
    initializers = [
        numpy_helper.from_array(_weight(rng, 8, 16), "w0"),
        numpy_helper.from_array(np.zeros(16, dtype=np.float32), "b0"),
        numpy_helper.from_array(_weight(rng, 16, 3), "w1"),
        numpy_helper.from_array(np.array([0.1, 0.0, -0.1], dtype=np.float32), "b1"),
    ]
    nodes = [
        helper.make_node("Gemm", ["features", "w0", "b0"], ["h"], name="hidden"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w1", "b1"], ["logits"], name="head"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [_value("features", TensorProto.FLOAT, ["batch", 8])],
        [
            _value("logits", TensorProto.FLOAT, ["batch", 3]),
            _value("probabilities", TensorProto.FLOAT, ["batch", 3]),
        ],
        initializers,
    )
    return _save(graph, path)


def write_loop_model(path: Path, size: int = 256, seed: int = 0) -> Path:
    """A model whose run takes as long as each request asks: its ``trips`` input sets the work.

    ``x`` FP32 [batch, 4] and ``trips`` INT64 scalar -> ``y`` FP32 [batch, 4] = x + mean(S),
    where S starts as a fixed [size, size] matrix and goes ``trips`` times through
    S <- Tanh(S @ W) in a Loop. Each trip is one dense [size, size] matmul on a loop-carried
    value, so no optimiser can fold it away and run time grows linearly with ``trips``.
    The scalar input means the model cannot be batched: requests run one after another.
    """
    rng = np.random.default_rng(seed)
    s0 = (rng.standard_normal((size, size), dtype=np.float32) * np.float32(0.1)).astype(np.float32)
    w = _weight(rng, size, size)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
            helper.make_node("MatMul", ["s_in", "w"], ["s_mm"], name="step"),
            helper.make_node("Tanh", ["s_mm"], ["s_out"], name="squash"),
        ],
        "trip",
        [
            _value("i", TensorProto.INT64, []),
            _value("cond_in", TensorProto.BOOL, []),
            _value("s_in", TensorProto.FLOAT, [size, size]),
        ],
        [
            _value("cond_out", TensorProto.BOOL, []),
            _value("s_out", TensorProto.FLOAT, [size, size]),
        ],
    )
    initializers = [
        numpy_helper.from_array(s0, "s0"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.array(True), "go"),
    ]
    nodes = [
        helper.make_node("Loop", ["trips", "go", "s0"], ["s_final"], body=body, name="loop"),
        helper.make_node("ReduceMean", ["s_final"], ["m"], keepdims=0, name="mean"),
        helper.make_node("Add", ["x", "m"], ["y"], name="shift"),
    ]
    graph = helper.make_graph(
        nodes,
        "loop",
        [_value("x", TensorProto.FLOAT, ["batch", 4]), _value("trips", TensorProto.INT64, [])],
        [_value("y", TensorProto.FLOAT, ["batch", 4])],
        initializers,
    )
    return _save(graph, path)


def write_run_failure_model(path: Path) -> Path:
    """A model that loads fine but fails inside onnxruntime for some inputs.

    ``x`` FP32 [batch, 4] -> ``y`` FP32 = Reshape(x, [3, -1]): runs for a multiple of 3 rows,
    and onnxruntime raises (FAIL, not INVALID_ARGUMENT) for any other row count.
    """
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "three_rows"], ["y"], name="reshape")],
        "run_failure",
        [_value("x", TensorProto.FLOAT, ["batch", 4])],
        [_value("y", TensorProto.FLOAT, ["rows", "cols"])],
        [numpy_helper.from_array(np.array([3, -1], dtype=np.int64), "three_rows")],
    )
    return _save(graph, path)


def write_flatten_model(path: Path) -> Path:
    """A model whose output does not follow the batch although its shapes say it might.

    ``x`` FP32 [batch, 4] -> ``y`` FP32 [n] = Reshape(x, [-1]): 4 values per row, so two
    requests stacked give one ``y`` that cannot be split back by rows.
    """
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "flat"], ["y"], name="flatten")],
        "flatten",
        [_value("x", TensorProto.FLOAT, ["batch", 4])],
        [_value("y", TensorProto.FLOAT, ["n"])],
        [numpy_helper.from_array(np.array([-1], dtype=np.int64), "flat")],
    )
    return _save(graph, path)


# --- running the models in-process, as references ------------------------------------------


def reference_session(path: Path) -> ort.InferenceSession:
    """onnxruntime's own session on ``path``, set up like the daemon's (one intra-op thread)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@dataclass(frozen=True)
class LoopModel:
    """A model of ``write_loop_model`` and the time one trip takes on this machine."""

    path: Path
    seconds_per_trip: float

    @classmethod
    def measure(cls, path: Path, trips: int = 300, repeats: int = 5) -> LoopModel:
        """Time ``trips`` trips (a measure to size requests by, not a speed check). The fastest
        of ``repeats`` runs counts, so a busy machine makes requests last longer, never less."""
        session = reference_session(path)
        feed = {"x": np.zeros((1, 4), np.float32), "trips": np.array(trips, np.int64)}
        session.run(None, feed)  # warm up
        fastest = math.inf
        for _ in range(repeats):
            started = time.perf_counter()
            session.run(None, feed)
            fastest = min(fastest, time.perf_counter() - started)
        return cls(path, fastest / trips)

    def trips_for(self, seconds: float) -> int:
        """How many trips make one run last about ``seconds`` here."""
        return max(1, math.ceil(seconds / self.seconds_per_trip))
