"""check_request: a decoded request against the model's own metadata."""

from __future__ import annotations

import numpy as np
import pytest

from snoozeml.datatypes import ModelMetadata, TensorSpec
from snoozeml.engine.requests.request import InferInput, InferRequest, RequestedOutput
from snoozeml.engine.requests.validate import check_request
from snoozeml.errors import InvalidInput

META = ModelMetadata(
    name="clf",
    platform="onnxruntime_onnx",
    inputs=(
        TensorSpec("features", "FP32", (-1, 8)),
        TensorSpec("mask", "BOOL", (2, 3)),
    ),
    outputs=(
        TensorSpec("logits", "FP32", (-1, 3)),
        TensorSpec("probabilities", "FP32", (-1, 3)),
    ),
)


def features(shape: tuple[int, ...] = (4, 8), datatype: str = "FP32") -> InferInput:
    return InferInput("features", datatype, shape, np.zeros(shape, dtype=np.float32))


def mask(shape: tuple[int, ...] = (2, 3), name: str = "mask") -> InferInput:
    return InferInput(name, "BOOL", shape, np.zeros(shape, dtype=np.bool_))


def refused(request: InferRequest) -> str:
    with pytest.raises(InvalidInput) as info:
        check_request(request, META)
    return str(info.value)


@pytest.mark.parametrize("rows", [0, 1, 4, 1000])
def test_a_request_that_fits_passes_with_any_size_in_a_dynamic_dimension(rows: int) -> None:
    check_request(InferRequest([features((rows, 8)), mask()]), META)


def test_input_order_does_not_matter() -> None:
    check_request(InferRequest([mask(), features()]), META)


def test_requested_outputs_that_exist_pass() -> None:
    check_request(InferRequest([features(), mask()], [RequestedOutput("probabilities")]), META)


def test_an_unknown_input_is_named_with_the_expected_ones() -> None:
    message = refused(InferRequest([features(), mask(), mask(name="extra")]))
    assert message == "unknown input 'extra' for model 'clf'; expected ['features', 'mask']"


def test_a_missing_input_is_named_with_the_expected_ones() -> None:
    message = refused(InferRequest([features()]))
    assert message == "missing input 'mask' for model 'clf'; expected ['features', 'mask']"


def test_an_input_given_twice_is_refused() -> None:
    assert refused(InferRequest([features(), features(), mask()])) == (
        "input 'features' is given more than once"
    )


@pytest.mark.parametrize("datatype", ["FP64", "FP16", "INT64", "BYTES"])
def test_a_datatype_other_than_the_models_is_refused_naming_both(datatype: str) -> None:
    message = refused(InferRequest([features(datatype=datatype), mask()]))
    assert message == (
        f"input 'features': datatype {datatype} does not match the model's FP32"
    )


@pytest.mark.parametrize(
    ("tensor", "got", "want"),
    [
        (features((8,)), "[8]", "[-1, 8]"),  # rank too small
        (features((1, 2, 8)), "[1, 2, 8]", "[-1, 8]"),  # rank too large
        (features((4, 7)), "[4, 7]", "[-1, 8]"),  # fixed trailing dim
        (mask((3, 3)), "[3, 3]", "[2, 3]"),  # fixed leading dim
        (mask((2, 3, 1)), "[2, 3, 1]", "[2, 3]"),
    ],
)
def test_a_rank_or_fixed_dimension_mismatch_is_refused_showing_both_shapes(
    tensor: InferInput, got: str, want: str
) -> None:
    others = [t for t in (features(), mask()) if t.name != tensor.name]
    message = refused(InferRequest([tensor, *others]))
    assert message == (
        f"input '{tensor.name}': shape {got} does not match the model's {want} (-1 is any size)"
    )


def test_an_unknown_requested_output_is_named_with_the_known_ones() -> None:
    message = refused(InferRequest([features(), mask()], [RequestedOutput("embedding")]))
    assert message == (
        "unknown output 'embedding' for model 'clf'; expected ['logits', 'probabilities']"
    )


def test_an_output_requested_twice_is_refused() -> None:
    request = InferRequest([features(), mask()],
                           [RequestedOutput("logits"), RequestedOutput("logits")])
    assert refused(request) == "output 'logits' is requested more than once"


def test_a_numeric_output_may_be_classified_and_a_text_one_may_not() -> None:
    check_request(InferRequest([features(), mask()], [RequestedOutput("logits", {}, 2)]), META)
    meta = ModelMetadata("clf", "onnxruntime_onnx", META.inputs,
                         (*META.outputs, TensorSpec("label", "BYTES", (-1,))))
    request = InferRequest([features(), mask()], [RequestedOutput("label", {}, 1)])

    with pytest.raises(InvalidInput) as info:
        check_request(request, meta)

    assert str(info.value) == ("output 'label' is BYTES: the classification extension ranks "
                               "numeric outputs only")
