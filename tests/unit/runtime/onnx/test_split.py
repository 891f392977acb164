"""Splitting an ONNX model into a graph and an aligned weights file (runtime/onnx/split.py):
every kind of initializer survives, and the split graph answers as the model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx_loads import load, rows, spec
from onnx_models import reference_session

from snoozeml.runtime.onnx import cache as onnx_cache
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.onnx.cache import build_blocking
from snoozeml.runtime.onnx.cache_entry import STORAGE, WEIGHTS
from snoozeml.runtime.onnx.instance import OnnxInstance
from snoozeml.runtime.onnx.split import split_blocking


def write_mixed(path: Path) -> Path:
    """Initializers of several kinds: FP16, INT64 and BOOL weights (moved), one kept in
    float_data rather than raw bytes (stays), one a Loop body reads from the outer scope
    (moved: it is a main-graph initializer), and a string constant (stays)."""
    rng = np.random.default_rng(3)
    half = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float16), "half")
    index = numpy_helper.from_array(np.arange(512, dtype=np.int64) % 32, "index")
    mask = numpy_helper.from_array(rng.random(2048) > 0.5, "mask")
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [16, 16],
                               rng.standard_normal(256).astype(np.float32).tolist())
    outer = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "outer")
    words = numpy_helper.from_array(np.array(["a", "b"], dtype=object), "words")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "outer"], ["s_mm"]),
         helper.make_node("Tanh", ["s_mm"], ["s_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", TensorProto.FLOAT, ["N", 32])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, ["N", 32])])
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
        helper.make_node("MatMul", ["x16", "half"], ["h16"]),
        helper.make_node("Cast", ["h16"], ["h"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["trips"], value=numpy_helper.from_array(
            np.array(2, dtype=np.int64))),
        helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(
            np.array(True))),
        helper.make_node("Loop", ["trips", "go", "h"], ["looped"], body=body),
        helper.make_node("Gather", ["looped", "index"], ["picked"], axis=1),
        helper.make_node("ReduceSum", ["picked"], ["y"], keepdims=0,
                         axes=None),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["mask_f"], ["count"], keepdims=0),
        helper.make_node("ReduceSum", ["typed"], ["typed_sum"], keepdims=0),
        helper.make_node("Size", ["words"], ["word_count"]),
    ]
    graph = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("count", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("typed_sum", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("word_count", TensorProto.INT64, [])],
        [half, index, mask, typed, outer, words])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_every_kind_of_initializer_survives_the_split(tmp_path: Path, cache: Path,
                                                      closing: list[OnnxInstance]) -> None:
    path = write_mixed(tmp_path / "mixed.onnx")
    split = tmp_path / "split"
    split.mkdir()
    itemsizes = {kind: np.dtype(name).itemsize for kind, name in STORAGE.items()}
    moved, _, _ = split_blocking(path, split / "graph.onnx", split / WEIGHTS, itemsizes,
                                 onnx_cache.ALIGN, onnx_cache.MIN_MAPPED)
    assert {m.name for m in moved} == {"half", "index", "mask", "outer"}
    assert all(m.offset % onnx_cache.ALIGN == 0 for m in moved)
    x = rows(3, 32)
    # The split graph is the same model: onnxruntime reads it (and weights.bin) as it is.
    split_answers = reference_session(split / "graph.onnx").run(None, {"x": x})
    original = reference_session(path).run(None, {"x": x})
    for got, expected in zip(split_answers, original, strict=True):
        assert np.array_equal(got, expected)
    # And the entry (the optimized graph, mapped) answers as the model loaded the default way.
    build_blocking(cache, path)
    cached = load(OnnxBackend(cache), spec(path, "on"), closing).run_blocking({"x": x}, None)
    plain = load(OnnxBackend(None), spec(path, "on"), closing).run_blocking({"x": x}, None)
    assert cached.keys() == plain.keys()
    for name in plain:
        assert np.array_equal(cached[name], plain[name]), name
    assert int(cached["word_count"]) == 2
