"""The one walk over an ONNX model's external tensors (runtime/files.py): tensors in subgraphs
and in Constant attributes are found, and their files count as weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from model_specs import onnx_spec
from onnx import TensorProto, helper, numpy_helper
from onnx_models import reference_session, write_mlp

from snoozeml.runtime.base import FileSizes
from snoozeml.runtime.files import external_data_paths
from snoozeml.runtime.onnx.backend import OnnxBackend


def _model_with_tensors_everywhere() -> onnx.ModelProto:
    """x FP32 [2] -> If(cond): then x + then_w, else x * else_c, where then_w is an initializer
    of the then-branch and else_c the value of a Constant node in the else-branch; plus a
    Constant in the main graph (main_c) and an initializer of the main graph (main_w)."""
    def const(name: str, values: list[float]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.float32), name)

    value = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])]
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["x", "then_w"], ["out"])], "then", [], value,
        [const("then_w", [1.0, 2.0])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["else_c_out"], value=const("else_c", [3.0, 4.0])),
         helper.make_node("Mul", ["x", "else_c_out"], ["out"])], "else", [], value,
    )
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["main_c_out"], value=const("main_c", [5.0, 6.0])),
            helper.make_node("Add", ["x", "main_c_out"], ["shifted"]),
            helper.make_node("Add", ["shifted", "main_w"], ["summed"]),
            helper.make_node("ReduceSum", ["summed"], ["total"], keepdims=0),
            helper.make_node("Greater", ["total", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_branch,
                             else_branch=else_branch),
        ],
        "everywhere",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [const("main_w", [7.0, 8.0]), const("zero", [0.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_tensors_in_subgraphs_and_constant_attributes_are_found_external(
    tmp_path: Path,
) -> None:
    # One file per tensor, named after it: which files are found says which tensors were.
    path = tmp_path / "everywhere.onnx"
    onnx.save_model(_model_with_tensors_everywhere(), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True)
    names = {"then_w", "else_c", "main_c", "main_w", "zero"}
    assert names <= {p.name for p in tmp_path.iterdir()}

    found = external_data_paths(onnx.load(str(path), load_external_data=False), tmp_path)

    assert found == {(tmp_path / name).resolve() for name in names}
    # onnxruntime reads them all back: the model is whole.
    [y] = reference_session(path).run(None, {"x": np.array([1.0, 1.0], np.float32)})
    np.testing.assert_array_equal(y, [2.0, 3.0])


def test_files_of_subgraph_and_constant_tensors_count_as_weights(tmp_path: Path) -> None:
    path = tmp_path / "everywhere.onnx"
    onnx.save_model(_model_with_tensors_everywhere(), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True)
    graph_bytes = path.stat().st_size
    data_bytes = sum((tmp_path / name).stat().st_size
                     for name in ("then_w", "else_c", "main_c", "main_w", "zero"))

    sizes = OnnxBackend().file_sizes_blocking(onnx_spec(path))

    assert sizes == FileSizes(graph_bytes + data_bytes, graph_bytes)


def test_a_model_with_every_tensor_inside_has_no_external_files(tmp_path: Path) -> None:
    model = onnx.load(str(write_mlp(tmp_path / "mlp.onnx")))
    assert external_data_paths(model, tmp_path) == set()


def test_sizing_a_model_without_external_data_never_imports_onnx(tmp_path: Path) -> None:
    # A fresh interpreter: this one has onnx imported by the tests above.
    path = write_mlp(tmp_path / "mlp.onnx")
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from snoozeml.runtime.files import onnx_file_sizes_blocking\n"
        f"sizes = onnx_file_sizes_blocking(Path({str(path)!r}))\n"
        f"assert sizes.weights == {path.stat().st_size}, sizes\n"
        "assert 'onnx' not in sys.modules, 'onnx was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_a_model_that_only_says_location_is_read_and_has_no_external_files(
    tmp_path: Path,
) -> None:
    path = write_mlp(tmp_path / "mlp.onnx")
    model = onnx.load(str(path))
    model.doc_string = "trained at one location, served at another"
    onnx.save_model(model, str(path))
    size = path.stat().st_size

    assert OnnxBackend().file_sizes_blocking(onnx_spec(path)) == FileSizes(size, size)
