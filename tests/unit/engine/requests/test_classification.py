"""The classification extension's formatter: each row's k best classes as Triton writes them,
"score:index:label", from real numpy tensors of every numeric datatype."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from snoozeml.datatypes import ModelMetadata, TensorSpec
from snoozeml.engine.requests.classification import (
    check_classifiable,
    class_count,
    classified,
    top_classes,
)
from snoozeml.engine.requests.request import InferOutput, RequestedOutput
from snoozeml.errors import InvalidInput


def strings(array: np.ndarray) -> list[Any]:
    return np.vectorize(lambda value: value.decode(), otypes=[object])(array).tolist()


@pytest.mark.parametrize(("scores", "datatype", "k", "labels", "expected"), [
    # Floats print as printf's %f, like std::to_string(float).
    ([[0.1, 0.984375, 0.2]], "FP32", 2, ("ant", "bee", "cat"),
     [["0.984375:1:bee", "0.200000:2:cat"]]),
    # No labels: "score:index".
    ([[0.1, 0.984375, 0.2]], "FP32", 1, (), [["0.984375:1"]]),
    # k past the class count gives every class, best first.
    ([[3.0, -1.5]], "FP64", 10, ("a", "b"), [["3.000000:0:a", "-1.500000:1:b"]]),
    # Equal scores: the lower index first.
    ([[0.5, 0.7, 0.7, 0.5]], "FP32", 4, (),
     [["0.700000:1", "0.700000:2", "0.500000:0", "0.500000:3"]]),
    # One row per batch row.
    ([[1, 2], [4, 3]], "FP32", 1, ("x", "y"), [["2.000000:1:y"], ["4.000000:0:x"]]),
    # Integers print as integers, with no fraction.
    ([[7, -3, 9]], "INT32", 2, (), [["9:2", "7:0"]]),
    ([[2**64 - 1, 2**64 - 2, 0]], "UINT64", 2, (),
     [[f"{2**64 - 1}:0", f"{2**64 - 2}:1"]]),
    ([[-128, 127, 0]], "INT8", 3, (), [["127:1", "0:2", "-128:0"]]),
    # Ties between integers keep the lower index first too, the most negative included.
    ([[-(2**63), 5, -(2**63), 5]], "INT64", 4, (),
     [["5:1", "5:3", f"{-(2**63)}:0", f"{-(2**63)}:2"]]),
    # FP16: its value exactly, as %f.
    ([[0.333251953125, 0.5]], "FP16", 2, (), [["0.500000:1", "0.333252:0"]]),
    # NaN ranks last; infinities print as printf prints them.
    ([[float("nan"), float("-inf"), float("inf")]], "FP32", 3, (),
     [["inf:2", "-inf:1", "nan:0"]]),
    # A label index past the labels, or an empty label, leaves the label out.
    ([[0.1, 0.2, 0.3]], "FP32", 3, ("a", ""), [["0.300000:2", "0.200000:1", "0.100000:0:a"]]),
])
def test_each_row_gives_its_k_best_classes_as_triton_writes_them(
    scores: list[list[float]], datatype: str, k: int, labels: tuple[str, ...],
    expected: list[list[str]],
) -> None:
    dtype = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT32": np.int32,
             "UINT64": np.uint64, "INT8": np.int8, "INT64": np.int64}[datatype]
    result = top_classes(np.array(scores, dtype=dtype), datatype, k, labels)

    assert result.dtype == object
    assert strings(result) == expected


def test_a_vector_without_a_batch_dimension_gives_k_strings() -> None:
    result = top_classes(np.array([0.25, 0.75], np.float32), "FP32", 1, ("off", "on"))

    assert result.shape == (1,)
    assert strings(result) == ["0.750000:1:on"]


def test_the_classes_of_a_row_are_its_elements_after_the_first_dimension_flattened() -> None:
    scores = np.array([[[0.1, 0.9], [0.8, 0.2]]], np.float32)  # [1, 2, 2]: four classes

    result = top_classes(scores, "FP32", 2, ("a", "b", "c", "d"))

    assert result.shape == (1, 2)
    assert strings(result) == [["0.900000:1:b", "0.800000:2:c"]]


def test_bf16_scores_are_read_from_their_16_bit_words() -> None:
    values = np.array([[1.5, -2.0, 3.0]], np.float32)
    words = (values.view(np.uint32) >> 16).astype(np.uint16)

    assert strings(top_classes(words, "BF16", 2)) == [["3.000000:2", "1.500000:0"]]


def test_no_rows_give_no_strings_of_the_right_shape() -> None:
    result = top_classes(np.zeros((0, 5), np.float32), "FP32", 3)

    assert result.shape == (0, 3)


@pytest.mark.parametrize("value", [1, 3, 2**63 - 1])
def test_a_class_count_of_at_least_one_is_taken(value: int) -> None:
    assert class_count(value, "y") == value


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "3", None, [3]])
def test_any_other_class_count_is_the_requests_400(value: object) -> None:
    with pytest.raises(InvalidInput) as refused:
        class_count(value, "y")

    assert str(refused.value) == (
        "output 'y': parameter 'classification' must be an integer of at least 1 (how many "
        f"classes to return), got {value!r}")


@pytest.mark.parametrize("datatype", ["BYTES", "BOOL"])
def test_an_output_that_is_not_numeric_cannot_be_classified(datatype: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_classifiable("label", datatype)

    assert str(refused.value) == (f"output 'label' is {datatype}: the classification "
                                  "extension ranks numeric outputs only")


def test_only_the_outputs_asked_for_are_classified_with_their_own_labels() -> None:
    metadata = ModelMetadata("m", "onnx", (), (
        TensorSpec("logits", "FP32", (-1, 2), labels=("no", "yes")),
        TensorSpec("probabilities", "FP32", (-1, 2)),
    ))
    logits = np.array([[0.5, 2.0]], np.float32)
    outputs = [InferOutput("logits", "FP32", (1, 2), logits),
               InferOutput("probabilities", "FP32", (1, 2), logits)]
    wanted = [RequestedOutput("logits", {"classification": 2}, 2),
              RequestedOutput("probabilities")]

    result = classified(wanted, outputs, metadata)

    assert [(o.name, o.datatype, o.shape) for o in result] == [
        ("logits", "BYTES", (1, 2)), ("probabilities", "FP32", (1, 2))]
    assert strings(result[0].data) == [["2.000000:1:yes", "0.500000:0:no"]]
    assert result[1] is outputs[1]
    assert classified(None, outputs, metadata) is outputs
