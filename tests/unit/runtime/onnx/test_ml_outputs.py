"""ZipMap outputs rewritten into the tensors they read, against skl2onnx's real exports run in
onnxruntime before and after; what has no tensor form; the load path such a model takes."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from classifier_models import write_ml_classifier
from onnx import TensorProto, helper

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.onnx import ml_outputs
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.onnx.class_labels import classifier_labels_blocking
from snoozeml.runtime.onnx.instance import OnnxInstance
from snoozeml.runtime.onnx.ml_outputs import (
    NoTensorForm,
    may_rewrite_blocking,
    no_tensor_form,
    tensor_form,
    type_name,
    write_tensor_form_blocking,
)

X = np.random.default_rng(0).standard_normal((30, 4)).astype(np.float32)


def export_logistic(path: Path, labels: np.ndarray) -> Path:
    """skl2onnx's default export of a LogisticRegression fitted on X with `labels`."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LogisticRegression().fit(X, labels[np.arange(len(X)) % len(labels)])
        onnx.save(to_onnx(model, X[:1]), str(path))
    return path


@pytest.mark.parametrize("labels", [np.array(["cat", "dog", "eel"]), np.array([7, 3, 5])],
                         ids=["strings", "int64"])
def test_a_zipmap_output_becomes_the_tensor_of_its_columns_in_class_order(
    tmp_path: Path, labels: np.ndarray
) -> None:
    source = export_logistic(tmp_path / "model.onnx", labels)
    target = tmp_path / "tensor.onnx"

    assert write_tensor_form_blocking(source, target)

    maps = ort.InferenceSession(str(source)).run(None, {"X": X})[1]
    rewritten = ort.InferenceSession(str(target))
    assert [(o.name, o.type) for o in rewritten.get_outputs()] == [
        ("output_label", "tensor(string)" if labels.dtype.kind == "U" else "tensor(int64)"),
        ("output_probability", "tensor(float)")]
    probabilities = rewritten.run(["output_probability"], {"X": X})[0]
    order = sorted(labels.tolist())  # scikit-learn's classes_, ZipMap's keys
    assert probabilities.shape == (len(X), 3)
    np.testing.assert_array_equal(probabilities, [[row[c] for c in order] for row in maps])
    assert onnx.load(str(target)).graph.output[1].type.tensor_type.shape.dim[1].dim_value == 3
    # The labels that name the columns: ZipMap's own, for the classification extension.
    assert classifier_labels_blocking(source) == {
        "output_probability": tuple(str(c) for c in order)}


def test_a_model_without_a_zipmap_output_is_not_rewritten(tmp_path: Path) -> None:
    path = write_ml_classifier(tmp_path / "tensors.onnx")

    assert not may_rewrite_blocking(path)
    assert not write_tensor_form_blocking(path, tmp_path / "unused.onnx")
    assert not (tmp_path / "unused.onnx").exists()


def test_may_rewrite_is_false_for_a_missing_or_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert not may_rewrite_blocking(tmp_path / "missing.onnx")
    assert not may_rewrite_blocking(tmp_path / "empty.onnx")


def zipmap_and_sequence() -> onnx.ModelProto:
    """A ZipMap output beside a sequence of tensors, which no rewrite makes a tensor."""
    nodes = [
        helper.make_node("ZipMap", ["x"], ["maps"], domain="ai.onnx.ml",
                         classlabels_strings=["a", "b"]),
        helper.make_node("SequenceConstruct", ["x", "x"], ["pieces"]),
    ]
    graph = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_value_info("maps", helper.make_sequence_type_proto(
            helper.make_map_type_proto(TensorProto.STRING,
                                       helper.make_tensor_type_proto(TensorProto.FLOAT, [])))),
         helper.make_value_info("pieces", helper.make_sequence_type_proto(
             helper.make_tensor_type_proto(TensorProto.FLOAT, ["N", 2])))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("ai.onnx.ml", 3)])


def test_an_output_left_without_a_tensor_form_is_refused_by_name() -> None:
    with pytest.raises(NoTensorForm) as caught:
        tensor_form(zipmap_and_sequence())

    assert "output 'pieces' has type seq(tensor(float))" in str(caught.value)
    assert "one model per target" in str(caught.value)


def test_a_graph_with_no_default_opset_gets_one_for_its_identity() -> None:
    model = zipmap_and_sequence()
    del model.graph.node[1]
    del model.graph.output[1]
    del model.opset_import[0]

    assert tensor_form(model)

    assert ("", 13) in [(o.domain, o.version) for o in model.opset_import]
    assert [n.op_type for n in model.graph.node] == ["Identity"]
    session = ort.InferenceSession(model.SerializeToString())
    x = np.array([[0.25, 0.75]], np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x)


def test_the_refusals_say_which_converter_option_avoids_them() -> None:
    zipmap = no_tensor_form("output", "p", "seq(map(int64,tensor(float)))")
    assert "output 'p' has type seq(map(int64,tensor(float)))" in zipmap
    assert "'zipmap': False" in zipmap
    assert "zipmap=False" in zipmap
    assert "DictVectorizer" in no_tensor_form("input", "d", "map(string,tensor(float))")


def test_type_names_are_written_as_onnxruntime_writes_them() -> None:
    proto = helper.make_sequence_type_proto(helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    assert type_name(proto) == "seq(map(int64,tensor(float)))"


def test_a_zipmap_model_loads_rewritten_and_never_through_the_weights_cache(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    spec = ModelConfig(name="m", path=export_logistic(tmp_path / "m.onnx",
                                                      np.array(["x", "y"])))
    backend = OnnxBackend(cache)
    backend.prepare_blocking(spec)

    plan = backend.load_plan_blocking(spec, backend.file_sizes_blocking(spec))
    instance = backend.load_blocking(spec)
    assert isinstance(instance, OnnxInstance)
    closing.append(instance)
    backend.background_blocking(spec)

    assert (plan.path, plan.background) == ("rewritten", False)
    assert [(o.name, o.datatype, o.shape) for o in instance.metadata.outputs] == [
        ("output_label", "BYTES", (-1,)), ("output_probability", "FP32", (-1, 2))]
    got = instance.run_blocking({"X": X}, None)["output_probability"]
    maps = ort.InferenceSession(str(spec.path)).run(None, {"X": X})[1]
    np.testing.assert_array_equal(got, [[row["x"], row["y"]] for row in maps])
    assert not cache.exists() or not any(cache.iterdir())
    assert not any(scratch.iterdir())  # the rewritten file went once the session loaded


def test_a_zipmap_model_too_large_for_the_mark_check_loads_rewritten_after_all(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A large forest is not read for the mark before its first load: that load finds the
    # sequence output, reads the file, and loads it rewritten; the next plans know it.
    monkeypatch.setattr(ml_outputs, "EXTERNAL_SCAN_LIMIT", 100)
    spec = ModelConfig(name="m", path=export_logistic(tmp_path / "m.onnx",
                                                      np.array(["x", "y"])))
    backend = OnnxBackend(cache)
    backend.prepare_blocking(spec)
    assert backend.load_plan_blocking(spec, backend.file_sizes_blocking(spec)).path == "default"

    instance = backend.load_blocking(spec)
    assert isinstance(instance, OnnxInstance)
    closing.append(instance)
    backend.background_blocking(spec)

    assert instance.metadata.output("output_probability") is not None
    assert instance.run_blocking({"X": X}, None)["output_probability"].shape == (len(X), 2)
    assert backend.load_plan_blocking(spec, backend.file_sizes_blocking(spec)).path == \
        "rewritten"
    assert not cache.exists() or not any(cache.iterdir())  # no entry of the ZipMap file


def test_a_large_file_whose_output_has_no_tensor_form_still_fails_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ml_outputs, "EXTERNAL_SCAN_LIMIT", 10)
    model = zipmap_and_sequence()
    del model.graph.node[0]
    del model.graph.output[0]
    path = tmp_path / "sequence.onnx"
    onnx.save(model, str(path))
    spec = ModelConfig(name="s", path=path)
    backend = OnnxBackend(None)
    backend.prepare_blocking(spec)

    with pytest.raises(NoTensorForm, match="output 'pieces' has type seq"):
        backend.load_blocking(spec)
