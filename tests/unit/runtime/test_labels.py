"""Class labels found at load: the entry's file (which must fit an output, or the load fails
saying why), an ONNX-ML classifier's own labels, a Hugging Face config.json's id2label; and
the loaded instance that carries them, run for real through onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from classifier_models import ANIMALS, write_labels, write_ml_classifier
from model_specs import onnx_spec
from onnx_models import write_classifier, write_mlp

from snoozeml.datatypes import ModelMetadata, TensorSpec
from snoozeml.runtime.labels import (
    LabelledInstance,
    LabelsError,
    class_count,
    find_labels_blocking,
    fit_file_labels,
    fit_found_labels,
    id2label,
    read_labels_file_blocking,
    with_labels_blocking,
)
from snoozeml.runtime.onnx.backend import OnnxBackend


def metadata(*outputs: TensorSpec) -> ModelMetadata:
    return ModelMetadata("m", "onnxruntime_onnx", (), outputs)


LOGITS = TensorSpec("logits", "FP32", (-1, 3))
HIDDEN = TensorSpec("hidden", "FP32", (-1, 16))
OPEN = TensorSpec("scores", "FP32", (-1, -1))
TEXT = TensorSpec("label", "BYTES", (-1,))


@pytest.mark.parametrize(("shape", "expected"), [
    ((-1, 3), 3), ((-1, 2, 4), 8), ((5,), 5), ((), 1), ((-1,), None), ((-1, -1), None),
    ((2, 3), 3),
])
def test_the_classes_of_an_output_are_its_dimensions_after_the_first(
    shape: tuple[int, ...], expected: int | None,
) -> None:
    assert class_count(TensorSpec("y", "FP32", shape)) == expected


def test_a_labels_file_goes_to_the_outputs_with_as_many_classes() -> None:
    fitted = fit_file_labels(metadata(HIDDEN, LOGITS, OPEN), ("a", "b", "c"), "labels.txt")

    assert fitted == {"logits": ("a", "b", "c")}


def test_a_labels_file_goes_to_open_class_counts_when_none_is_exact() -> None:
    fitted = fit_file_labels(metadata(HIDDEN, OPEN, TEXT), ("a", "b"), "labels.txt")

    assert fitted == {"scores": ("a", "b")}


def test_a_labels_file_that_fits_no_output_says_what_the_outputs_have() -> None:
    with pytest.raises(LabelsError) as failed:
        fit_file_labels(metadata(HIDDEN, LOGITS, TEXT), ("a", "b"), "/m/labels.txt")

    assert str(failed.value) == (
        "/m/labels.txt has 2 labels, but no output of model 'm' has 2 classes (hidden: 16, "
        "logits: 3); an output of shape [N, C] has C classes")


def test_the_model_files_labels_go_only_where_they_fit() -> None:
    classifier = {"logits": ("x", "y", "z"), "hidden": ("only", "two")}

    fitted = fit_found_labels(metadata(LOGITS, HIDDEN, OPEN, TEXT), classifier, ("p", "q", "r"))

    # The classifier's own where its count fits (or is open); id2label where exactly equal.
    assert fitted == {"logits": ("x", "y", "z")}
    assert fit_found_labels(metadata(LOGITS, HIDDEN, OPEN), {}, ("p", "q", "r")) == {
        "logits": ("p", "q", "r")}
    assert fit_found_labels(metadata(LOGITS), {}, ("p", "q")) == {}


@pytest.mark.parametrize(("config", "expected"), [
    ({"id2label": {"0": "neg", "1": "pos"}}, ("neg", "pos")),
    ({"id2label": {"1": "pos", "0": "neg", "2": "mixed"}}, ("neg", "pos", "mixed")),
    ({"id2label": {"0": "neg", "2": "pos"}}, None),  # a gap
    ({"id2label": {"zero": "neg"}}, None),
    ({"id2label": {}}, None),
    ({"num_labels": 2}, None),
    (["id2label"], None),
])
def test_id2label_gives_labels_by_index_only_when_its_keys_are_0_to_n(
    config: object, expected: tuple[str, ...] | None,
) -> None:
    assert id2label(config) == expected


def test_a_labels_file_is_one_label_per_line(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_text("cat\r\n  dog \n\neel\n\n\n", encoding="utf-8")

    assert read_labels_file_blocking(path) == ("cat", "dog", "", "eel")


@pytest.mark.parametrize(("content", "problem"), [
    (b"", "has no labels"),
    (b"\n\n", "has no labels"),
    (b"caf\xe9\n", "is not UTF-8 text (invalid continuation byte at byte 3)"),
])
def test_an_unusable_labels_file_says_why(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "labels.txt"
    path.write_bytes(content)

    with pytest.raises(LabelsError) as failed:
        read_labels_file_blocking(path)

    assert str(failed.value) == f"labels file {path} {problem}"


def test_an_onnx_ml_classifier_carries_its_own_labels(tmp_path: Path) -> None:
    for through in ("Identity", "Cast", None):
        path = write_ml_classifier(tmp_path / f"ml-{through}.onnx", through=through)
        instance = OnnxBackend(None).load_blocking(onnx_spec(path))

        found = find_labels_blocking(onnx_spec(path), instance.metadata)

        assert found == {"probabilities": ANIMALS}, through
        instance.close()


def test_config_json_beside_or_above_an_onnx_file_names_its_classes(tmp_path: Path) -> None:
    path = write_classifier(tmp_path / "hub" / "onnx" / "model.onnx")
    (tmp_path / "hub" / "config.json").write_text(json.dumps(
        {"id2label": {"0": "low", "1": "mid", "2": "high"}}))
    instance = OnnxBackend(None).load_blocking(onnx_spec(path))

    found = find_labels_blocking(onnx_spec(path), instance.metadata)

    assert found == {"logits": ("low", "mid", "high"), "probabilities": ("low", "mid", "high")}
    instance.close()


def test_a_labelled_instance_runs_as_the_loaded_one_and_names_its_classes(
    tmp_path: Path,
) -> None:
    path = write_classifier(tmp_path / "classifier.onnx")
    spec = onnx_spec(path).model_copy(update={
        "labels": write_labels(tmp_path / "labels.txt", ["low", "mid", "high"])})
    inner = OnnxBackend(None).load_blocking(spec)
    features = np.ones((2, 8), np.float32)
    expected = inner.run_blocking({"features": features}, ["logits"])["logits"]

    instance = with_labels_blocking(inner, spec)

    assert isinstance(instance, LabelledInstance)
    assert [spec.labels for spec in instance.metadata.outputs] == [("low", "mid", "high")] * 2
    got = instance.run_batch_blocking([{"features": features}], ["logits"])[0]["logits"]
    np.testing.assert_array_equal(got, expected)
    instance.close()


def test_a_model_without_labels_is_not_wrapped(tmp_path: Path) -> None:
    spec = onnx_spec(write_mlp(tmp_path / "mlp.onnx"))
    inner = OnnxBackend(None).load_blocking(spec)

    assert with_labels_blocking(inner, spec) is inner
    inner.close()


def test_labels_that_fit_no_output_fail_the_load_and_close_the_instance(
    tmp_path: Path,
) -> None:
    spec = onnx_spec(write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 5))).model_copy(update={
        "labels": write_labels(tmp_path / "labels.txt", ["a", "b", "c"])})
    inner = OnnxBackend(None).load_blocking(spec)

    with pytest.raises(LabelsError, match="has 3 labels, but no output of model 'mlp' has 3 "
                                          r"classes \(y: 5\)"):
        with_labels_blocking(inner, spec)

    # Closed: an OnnxInstance lets go of its onnxruntime session.
    with pytest.raises(AttributeError, match="_session"):
        inner.run_blocking({"x": np.ones((1, 4), np.float32)}, None)
