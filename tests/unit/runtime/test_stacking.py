"""merge_inputs, split_outputs and run_stacked_blocking: a batched run gives every request
exactly its solo result.

Requests share one schema (input names, dtypes, trailing shapes: what batch_key groups on) and
differ in their row counts, zero included. The "model" is a row-wise function of the inputs,
so merging, running once and splitting must equal running each request alone. Values are small
integers, so float sums are exact and the comparison can be exact too.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snoozeml.engine.batching.policy import batch_key
from snoozeml.runtime.base import Unsplittable
from snoozeml.runtime.stacking import (
    merge_inputs,
    run_stacked_blocking,
    split_outputs,
    stack_rows,
)

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
    stacked = run_stacked_blocking(lambda inputs, _: row_wise_model(inputs), requests, None)
    assert len(parts) == len(stacked) == len(requests)
    for inputs, part, run_part in zip(requests, parts, stacked, strict=True):
        solo = row_wise_model(inputs)
        for answer in (part, run_part):
            assert answer.keys() == solo.keys()
            for name, expected in solo.items():
                assert answer[name].dtype == expected.dtype
                assert answer[name].shape == expected.shape
                np.testing.assert_array_equal(answer[name], expected)


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
    with pytest.raises(Unsplittable, match="'bad'"):
        split_outputs(outputs, rows)
    assert len(split_outputs({"good": outputs["good"]}, rows)) == len(rows)


def test_split_refuses_a_scalar_output_of_a_batch() -> None:
    with pytest.raises(Unsplittable):
        split_outputs({"y": np.float32(3.0) * np.ones((), np.float32)}, [1, 2])


def test_a_batch_of_one_is_passed_through_untouched() -> None:
    inputs = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert merge_inputs([inputs]) is inputs
    outputs = {"y": np.zeros((7,), dtype=np.float32)}  # a single request owns every output
    [part] = split_outputs(outputs, [2])
    assert part is outputs


@pytest.mark.parametrize("rows", [[0, 0], [0, 3, 0], [2, 0, 1]])
def test_requests_with_no_rows_get_empty_outputs_of_the_right_shape(rows: list[int]) -> None:
    requests = [{"x": np.ones((n, 2), dtype=np.float32) * i} for i, n in enumerate(rows)]
    parts = split_outputs(row_wise_model(merge_inputs(requests)), rows)
    for count, part in zip(rows, parts, strict=True):
        assert part["x_affine"].shape == (count, 2)
        assert part["total"].shape == (count,)


# --- run_stacked_blocking -------------------------------------------------------------------


class Recorder:
    """A run function that records what it was given and answers `row_wise_model`'s outputs
    (or `answer`, when set)."""

    def __init__(self, answer: Arrays | None = None) -> None:
        self.answer = answer
        self.calls: list[tuple[Arrays, Sequence[str] | None]] = []

    def __call__(self, inputs: Arrays, outputs: Sequence[str] | None) -> Arrays:
        self.calls.append((inputs, outputs))
        return row_wise_model(inputs) if self.answer is None else self.answer


def test_a_single_request_runs_as_it_is_without_a_copy() -> None:
    inputs = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    answer = {"y": np.zeros((7,), dtype=np.float32)}  # not split: the request owns it all
    run = Recorder(answer)

    [part] = run_stacked_blocking(run, [inputs], ["y"])

    assert part is answer
    [(given, outputs)] = run.calls
    assert given is inputs
    assert given["x"] is inputs["x"]
    assert outputs == ["y"]


def test_several_requests_run_once_and_get_their_own_rows() -> None:
    requests = [{"x": np.full((n, 2), i, dtype=np.int64)} for i, n in enumerate([2, 1, 3])]
    run = Recorder()

    parts = run_stacked_blocking(run, requests, ("x_affine",))

    [(merged, outputs)] = run.calls
    assert merged["x"].shape == (6, 2)
    assert outputs == ("x_affine",)
    for i, (inputs, part) in enumerate(zip(requests, parts, strict=True)):
        np.testing.assert_array_equal(part["x_affine"], inputs["x"] * 2 + 1)
        assert set(part["x_affine"].reshape(-1)) == {2 * i + 1}


def test_a_model_whose_output_ignores_the_batch_is_unsplittable() -> None:
    requests = [{"x": np.ones((n, 2), dtype=np.float32)} for n in (1, 2)]
    run = Recorder({"y": np.zeros((1, 4), dtype=np.float32)})  # one row for three

    with pytest.raises(Unsplittable, match="'y'"):
        run_stacked_blocking(run, requests, None)


def test_scalar_inputs_cannot_be_stacked() -> None:
    requests = [{"n": np.array(3, dtype=np.int64)}, {"n": np.array(4, dtype=np.int64)}]
    run = Recorder()

    with pytest.raises(Unsplittable, match="'n'"):
        run_stacked_blocking(run, requests, None)
    assert run.calls == []


# --- stack_rows: the copy that keeps the GIL --------------------------------------------------


@pytest.mark.parametrize(
    "arrays",
    [
        [np.arange(512, dtype=np.float32).reshape(1, 512) + i for i in range(30)],
        [np.array([[True, False]]), np.array([[False, False], [True, True]])],
        [np.arange(6, dtype=">i4").reshape(3, 2), np.arange(2, dtype=">i4").reshape(1, 2)],
        [np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2], np.ones((1, 3))],  # a strided view
        [np.array([["a"], ["bc"]], dtype=object), np.array([["déf"]], dtype=object)],
        [np.array(["ab", "c"]), np.array(["xyz"])],
        [np.array(["2026-12-01"], dtype="M8[D]"), np.array(["2026-12-02"], dtype="M8[D]")],
        [np.zeros((0, 4), np.int16), np.zeros((0, 4), np.int16)],
        [np.zeros((2, 1), np.dtype([])), np.zeros((1, 1), np.dtype([]))],  # items of zero bytes
    ],
    ids=["float32-rows", "bool", "big-endian", "strided", "strings", "unicode", "dates", "empty",
         "zero-itemsize"],
)
def test_stack_rows_equals_numpy_concatenate(arrays: list[np.ndarray]) -> None:
    got, want = stack_rows(arrays), np.concatenate(arrays)
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert got.flags.c_contiguous
    assert got.flags.writeable
    assert got.flags.aligned
    assert not any(np.shares_memory(got, a) for a in arrays)  # a copy: requests stay their own


@pytest.mark.parametrize(
    "arrays",
    [
        [np.ones(3, np.float32), np.float32(1.0).reshape(())],  # a scalar among 1-D rows
        [np.ones((1, 3), np.float32), np.ones((1, 4), np.float32)],  # rows of different widths
    ],
    ids=["scalar", "widths"],
)
def test_stack_rows_refuses_what_numpy_refuses(arrays: list[np.ndarray]) -> None:
    with pytest.raises(ValueError, match="dimension") as numpy_error:
        np.concatenate(arrays)
    with pytest.raises(ValueError, match="dimension") as ours:
        stack_rows(arrays)
    assert str(ours.value) == str(numpy_error.value)


def test_stack_rows_keeps_the_gil_while_it_copies() -> None:
    """numpy's concatenate lets go of the GIL for every row over 500 elements; a worker that
    lets go waits for the busy event loop to give it back. While stack_rows copies 64 such
    rows, a thread that wants the GIL all the time must not get it once (the switch interval is
    raised past the call, so only a release could let it in)."""
    arrays = [np.full((1, 2048), i, dtype=np.float32) for i in range(64)]
    turns = [0]
    stop = threading.Event()
    started = threading.Event()

    def want_the_gil() -> None:
        started.set()
        while not stop.is_set():
            turns[0] += 1
            time.sleep(0)  # lets go of the GIL, then waits to take it back

    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    rival = threading.Thread(target=want_the_gil, daemon=True)
    try:
        rival.start()
        started.wait()
        before = turns[0]
        stacked = stack_rows(arrays)
        after = turns[0]
    finally:
        stop.set()
        rival.join()
        sys.setswitchinterval(interval)
    assert after == before
    np.testing.assert_array_equal(stacked, np.concatenate(arrays))
