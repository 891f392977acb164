"""merge_inputs and split_outputs: a batched run gives every request exactly its solo result.

Requests share one schema (input names, dtypes, trailing shapes: what batch_key groups on) and
differ in their row counts, zero included. The "model" is a row-wise function of the inputs,
so merging, running once and splitting must equal running each request alone. Values are small
integers, so float sums are exact and the comparison can be exact too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snoozeml.engine.batching import batch_key, merge_inputs, split_outputs

Arrays = dict[str, np.ndarray]
Schema = dict[str, tuple[np.dtype[np.generic], tuple[int, ...]]]

DTYPES = [np.dtype(t) for t in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8)]
NAMES = ["a", "b", "c"]

schemas = st.dictionaries(
    keys=st.sampled_from(NAMES),
    values=st.tuples(
        st.sampled_from(DTYPES),
        st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple),
    ),
    min_size=1,
    max_size=3,
)


def make_inputs(schema: Schema, rows: int, rng: np.random.Generator) -> Arrays:
    return {
        name: rng.integers(0, 8, size=(rows, *trailing)).astype(dtype)
        for name, (dtype, trailing) in schema.items()
    }


def row_wise_model(inputs: Arrays) -> Arrays:
    """Stands in for a model: every output row depends only on the same row of the inputs."""
    outputs: Arrays = {}
    total: np.ndarray | None = None
    for name in sorted(inputs):
        array = inputs[name]
        outputs[f"{name}_affine"] = array * 2 + 1
        row_sum = array.astype(np.float64).sum(axis=tuple(range(1, array.ndim)))
        outputs[f"{name}_sum"] = row_sum
        total = row_sum if total is None else total + row_sum
    assert total is not None
    outputs["total"] = total  # a row-wise function of every input together
    return outputs


@settings(max_examples=150, deadline=None)
@given(
    schema=schemas,
    rows=st.lists(st.integers(0, 5), min_size=1, max_size=8),
    seed=st.integers(0, 2**32 - 1),
)
def test_merge_run_split_gives_each_request_its_solo_result(
    schema: Schema, rows: list[int], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    requests = [make_inputs(schema, count, rng) for count in rows]
    # Requests with one schema share a batch key, whatever their row counts.
    keys = {batch_key(inputs, None)[0] for inputs in requests}
    assert len(keys) == 1
    assert None not in keys
    assert [batch_key(inputs, None)[1] for inputs in requests] == rows

    merged = merge_inputs(requests)
    for name, (dtype, trailing) in schema.items():
        assert merged[name].shape == (sum(rows), *trailing)
        assert merged[name].dtype == dtype

    parts = split_outputs(row_wise_model(merged), rows)
    assert parts is not None
    assert len(parts) == len(requests)
    for inputs, part in zip(requests, parts, strict=True):
        solo = row_wise_model(inputs)
        assert part.keys() == solo.keys()
        for name, expected in solo.items():
            assert part[name].dtype == expected.dtype
            assert part[name].shape == expected.shape
            np.testing.assert_array_equal(part[name], expected)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(st.integers(0, 5), min_size=2, max_size=8),
    off_by=st.integers(-3, 3).filter(lambda n: n != 0),
    trailing=st.lists(st.integers(1, 3), max_size=2).map(tuple),
)
def test_split_refuses_an_output_whose_first_dimension_is_not_the_batch(
    rows: list[int], off_by: int, trailing: tuple[int, ...]
) -> None:
    total = sum(rows)
    wrong = max(total + off_by, 0)
    if wrong == total:
        wrong = total + 1
    outputs = {
        "good": np.zeros((total, *trailing), dtype=np.float32),
        "bad": np.zeros((wrong, *trailing), dtype=np.float32),
    }
    assert split_outputs(outputs, rows) is None
    assert split_outputs({"good": outputs["good"]}, rows) is not None


def test_split_refuses_a_scalar_output_of_a_batch() -> None:
    assert split_outputs({"y": np.float32(3.0) * np.ones((), np.float32)}, [1, 2]) is None


def test_a_batch_of_one_is_passed_through_untouched() -> None:
    inputs = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert merge_inputs([inputs]) is inputs
    outputs = {"y": np.zeros((7,), dtype=np.float32)}  # a single request owns every output
    parts = split_outputs(outputs, [2])
    assert parts is not None
    assert parts[0] is outputs


@pytest.mark.parametrize("rows", [[0, 0], [0, 3, 0], [2, 0, 1]])
def test_requests_with_no_rows_get_empty_outputs_of_the_right_shape(rows: list[int]) -> None:
    requests = [{"x": np.ones((n, 2), dtype=np.float32) * i} for i, n in enumerate(rows)]
    parts = split_outputs(row_wise_model(merge_inputs(requests)), rows)
    assert parts is not None
    for count, part in zip(rows, parts, strict=True):
        assert part["x_affine"].shape == (count, 2)
        assert part["total"].shape == (count,)
