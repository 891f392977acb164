"""A batch of text rows in runs by length (runtime/text/by_length.py): how rows are cut into
runs under a token budget, and that the runs' outputs come back in the batch's row order, each
row computed on its own tokens only."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from snoozeml.runtime.base import Arrays
from snoozeml.runtime.text.by_length import default_budget, run_by_length, runs_by_length


@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), st.integers(1, 300))
def test_runs_cover_every_row_once_shortest_first_and_within_the_budget(
    counts: list[int], budget: int
) -> None:
    array = np.array(counts, dtype=np.int64)

    runs = runs_by_length(array, budget)

    assert sorted(np.concatenate(runs).tolist()) == list(range(len(counts)))
    lengths = [array[run].tolist() for run in runs]
    flat = [length for run in lengths for length in run]
    assert flat == sorted(flat)
    for number, run in enumerate(lengths):
        assert len(run) == 1 or len(run) * max(max(run), 1) <= budget
        if number + 1 < len(lengths):  # cut only where the next row would not fit
            assert (len(run) + 1) * max(lengths[number + 1][0], 1) > budget


def test_rows_of_equal_length_keep_their_order() -> None:
    runs = runs_by_length(np.array([5, 3, 5, 3, 5], dtype=np.int64), 100)

    assert [run.tolist() for run in runs] == [[1, 3, 0, 2, 4]]


def _padded(counts: list[int]) -> Arrays:
    width = max(counts)
    ids = np.zeros((len(counts), width), dtype=np.int64)
    for row, count in enumerate(counts):
        ids[row, :count] = np.arange(1, count + 1) * (row + 1)
    return {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)}


def test_a_batch_over_the_budget_runs_in_trimmed_runs_and_answers_in_row_order() -> None:
    counts = [9, 2, 7, 3, 8, 1, 5]
    feeds = _padded(counts)
    widths: list[tuple[int, int]] = []

    def run(part: Arrays) -> Arrays:
        widths.append(part["input_ids"].shape)
        ids, mask = part["input_ids"], part["attention_mask"]
        return {"sum": (ids * mask).sum(axis=1), "pair": np.stack([ids[:, 0], mask.sum(1)], 1)}

    results = run_by_length(feeds, np.array(counts, dtype=np.int64), 16, run)

    whole = run(feeds)
    assert widths[-1] == (7, 9)  # the whole batch, run again for the reference
    assert widths[:-1] == [(3, 3), (2, 7), (1, 8), (1, 9)]
    assert all(rows * width <= 16 or rows == 1 for rows, width in widths[:-1])
    for name in ("sum", "pair"):
        np.testing.assert_array_equal(results[name], whole[name])
        assert results[name].dtype == whole[name].dtype


def test_a_batch_within_the_budget_or_without_one_runs_whole_as_it_came() -> None:
    feeds = _padded([4, 1, 3])
    seen: list[Arrays] = []

    def run(part: Arrays) -> Arrays:
        seen.append(part)
        return {"ids": part["input_ids"]}

    counts = np.array([4, 1, 3], dtype=np.int64)
    assert run_by_length(feeds, counts, 12, run)["ids"] is feeds["input_ids"]
    assert run_by_length(feeds, counts, None, run)["ids"] is feeds["input_ids"]
    assert [part is feeds for part in seen] == [True, True]


def test_the_default_budget_is_wider_on_a_gpu() -> None:
    assert default_budget("cpu") == 512
    assert default_budget("cuda") == default_budget("cuda:1") == 16384
