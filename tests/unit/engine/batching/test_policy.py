"""The pure batching policy: collect_batch, batch_key and batching_blocker.

Pending requests hold real asyncio futures, created on a fresh (not running) event loop;
`now` is a plain number, so no test waits for anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from snoozeml.datatypes import ModelMetadata, TensorSpec
from snoozeml.engine.batching.policy import (
    BatchPolicy,
    Decision,
    Pending,
    batch_key,
    batching_blocker,
    collect_batch,
)

ON = BatchPolicy(max_batch_size=32, max_delay=0.005)
NO_DELAY = BatchPolicy(max_batch_size=32, max_delay=0.0)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class Queue:
    """Builds Pending requests on `loop`: `q.add(rows, at=...)` appends one and returns it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: list[Pending] = []

    def add(
        self,
        rows: int = 1,
        *,
        at: float = 0.0,
        width: int = 3,
        dtype: type[np.generic] = np.float32,
        name: str = "x",
        outputs: tuple[str, ...] | None = None,
        deadline: float | None = None,
        alone: bool = False,
    ) -> Pending:
        inputs = {name: np.zeros((rows, width), dtype=dtype)}
        key, counted = batch_key(inputs, outputs)
        pending = Pending(
            None if alone else key, counted, inputs, outputs, at, deadline,
            self.loop.create_future(),
        )
        self.items.append(pending)
        return pending


@pytest.fixture
def q(loop: asyncio.AbstractEventLoop) -> Queue:
    return Queue(loop)


def drain(queue: Sequence[Pending], now: float, policy: BatchPolicy) -> list[list[Pending]]:
    """Every batch collect_batch hands out, in order, taking each out of the queue as the
    batch loop does (for a queue whose requests are all due)."""
    remaining = list(queue)
    batches: list[list[Pending]] = []
    while remaining:
        decision = collect_batch(remaining, now, policy)
        assert decision.batch, decision
        batches.append(decision.batch)
        taken = {id(p) for p in (*decision.batch, *decision.expired, *decision.dropped)}
        remaining = [p for p in remaining if id(p) not in taken]
    return batches


# --- nothing to do ----------------------------------------------------------------------


def test_an_empty_queue_means_idle_until_something_arrives() -> None:
    assert collect_batch([], 0.0, ON) == Decision([], [], [], None)


# --- max_delay ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "wait"),
    [(0.0, 0.005), (0.001, 0.004), (0.004, 0.001)],
)
def test_a_lone_request_waits_out_the_rest_of_max_delay(q: Queue, now: float, wait: float) -> None:
    q.add(at=0.0)
    decision = collect_batch(q.items, now, ON)
    assert decision.batch == []
    assert decision.wait == pytest.approx(wait)
    assert decision.expired == decision.dropped == []


@pytest.mark.parametrize("now", [0.005, 0.006, 10.0])
def test_once_the_oldest_has_waited_max_delay_the_batch_goes(q: Queue, now: float) -> None:
    first = q.add(at=0.0)
    second = q.add(at=0.003)
    decision = collect_batch(q.items, now, ON)
    assert decision.batch == [first, second]
    assert decision.wait is None


def test_the_wait_counts_from_the_oldest_request_not_the_newest(q: Queue) -> None:
    q.add(at=0.0)
    q.add(at=0.004)
    decision = collect_batch(q.items, 0.004, ON)
    assert decision.batch == []
    assert decision.wait == pytest.approx(0.001)


# --- full batches -----------------------------------------------------------------------


def test_a_full_batch_goes_at_once_without_waiting_for_max_delay(q: Queue) -> None:
    slow = BatchPolicy(max_batch_size=32, max_delay=60.0)
    requests = [q.add(8, at=0.0) for _ in range(4)]
    decision = collect_batch(q.items, 0.0, slow)
    assert decision.batch == requests
    assert sum(p.rows for p in decision.batch) == 32


def test_a_request_that_would_overflow_the_batch_waits_for_the_next_one(q: Queue) -> None:
    slow = BatchPolicy(max_batch_size=32, max_delay=60.0)
    first, second, third = q.add(12), q.add(12), q.add(12)
    assert collect_batch(q.items, 0.0, slow).batch == [first, second]
    decision = collect_batch([third], 0.0, slow)
    assert decision.batch == []
    assert decision.wait == pytest.approx(60.0)


def test_a_batch_stops_at_max_batch_size_rows_even_with_more_queued(q: Queue) -> None:
    requests = [q.add(1) for _ in range(40)]
    batches = drain(q.items, 0.0, NO_DELAY)
    assert batches == [requests[:32], requests[32:]]


# --- zero delay -------------------------------------------------------------------------


def test_zero_delay_dispatches_a_lone_request_at_once(q: Queue) -> None:
    only = q.add(at=5.0)
    decision = collect_batch(q.items, 5.0, NO_DELAY)
    assert decision.batch == [only]
    assert decision.wait is None


def test_zero_delay_still_takes_everything_already_queued(q: Queue) -> None:
    requests = [q.add(2, at=i * 0.001) for i in range(5)]
    assert collect_batch(q.items, 0.005, NO_DELAY).batch == requests


# --- batching disabled ------------------------------------------------------------------


@pytest.mark.parametrize("max_batch_size", [0, 1])
def test_disabled_batching_runs_one_request_at_a_time_in_arrival_order(
    q: Queue, max_batch_size: int
) -> None:
    off = BatchPolicy(max_batch_size=max_batch_size, max_delay=1.0)
    assert not off.enabled
    requests = [q.add(1), q.add(3), q.add(1)]
    assert collect_batch(q.items, 0.0, off) == Decision([requests[0]], [], [], None)
    assert drain(q.items, 0.0, off) == [[p] for p in requests]


def test_a_request_with_no_batch_key_runs_alone(q: Queue) -> None:
    loner = q.add(alone=True)
    other = q.add()
    assert drain(q.items, 0.0, NO_DELAY) == [[loner], [other]]


# --- shape grouping ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "different",
    [
        {"width": 5},
        {"dtype": np.float64},
        {"name": "features"},
        {"outputs": ("y",)},
    ],
    ids=["trailing-dims", "dtype", "input-name", "requested-outputs"],
)
def test_requests_that_differ_never_share_a_batch(q: Queue, different: dict[str, object]) -> None:
    a1 = q.add(at=0.0)
    b1 = q.add(at=0.001, **different)  # type: ignore[arg-type]
    a2 = q.add(at=0.002)
    b2 = q.add(at=0.003, **different)  # type: ignore[arg-type]
    assert drain(q.items, 1.0, ON) == [[a1, a2], [b1, b2]]


def test_the_same_requested_outputs_do_share_a_batch(q: Queue) -> None:
    a = q.add(outputs=("y",))
    b = q.add(outputs=("y",))
    assert collect_batch(q.items, 0.0, NO_DELAY).batch == [a, b]


# --- fairness ---------------------------------------------------------------------------


def test_the_oldest_request_decides_which_group_goes_first(q: Queue) -> None:
    old = q.add(at=0.0, width=5)
    crowd = [q.add(at=0.001) for _ in range(10)]
    assert collect_batch(q.items, 1.0, ON).batch == [old]
    assert drain(q.items, 1.0, ON) == [[old], crowd]


def test_interleaved_groups_are_served_oldest_first_and_none_starves(q: Queue) -> None:
    widths = [3, 5, 7, 3, 5, 3, 7, 7]
    requests = [q.add(at=i * 0.001, width=w) for i, w in enumerate(widths)]
    batches = drain(q.items, 1.0, ON)
    assert [[p.inputs["x"].shape[1] for p in batch] for batch in batches] == [
        [3, 3, 3], [5, 5], [7, 7, 7]
    ]
    assert sorted(id(p) for batch in batches for p in batch) == sorted(map(id, requests))


def test_a_younger_group_waits_while_the_oldest_group_is_waiting_for_company(q: Queue) -> None:
    q.add(at=0.0, width=5)
    q.add(8, at=0.001)  # could go on its own, but the oldest request is waiting for company
    decision = collect_batch(q.items, 0.002, ON)
    assert decision.batch == []
    assert decision.wait == pytest.approx(0.003)


# --- oversized requests -----------------------------------------------------------------


def test_a_request_larger_than_max_batch_size_runs_alone(q: Queue) -> None:
    big = q.add(40, at=0.0)
    small = q.add(1, at=0.0)
    assert collect_batch(q.items, 0.0, ON).batch == [big]  # at once: it cannot grow
    assert drain(q.items, 1.0, ON) == [[big], [small]]


@pytest.mark.parametrize("rows", [32, 33, 500])
def test_a_lone_request_that_fills_a_batch_by_itself_goes_without_waiting(
    q: Queue, rows: int
) -> None:
    big = q.add(rows, at=0.0)
    assert collect_batch(q.items, 0.0, ON) == Decision([big], [], [], None)


def test_a_request_of_exactly_max_batch_size_runs_alone_without_waiting(q: Queue) -> None:
    exact = q.add(32, at=0.0)
    q.add(1, at=0.0)
    decision = collect_batch(q.items, 0.0, ON)
    assert decision.batch == [exact]


def test_a_big_request_behind_a_small_one_sends_the_small_one_on_its_way(q: Queue) -> None:
    small = q.add(1, at=0.0)
    big = q.add(40, at=0.001)
    assert collect_batch(q.items, 0.001, ON).batch == [small]
    assert drain(q.items, 0.001, ON) == [[small], [big]]


# --- expired and abandoned requests -----------------------------------------------------


@pytest.mark.parametrize("deadline", [0.5, 1.0])
def test_a_request_past_its_deadline_expires_and_is_not_run(q: Queue, deadline: float) -> None:
    late = q.add(at=0.0, deadline=deadline)
    fine = q.add(at=0.0)
    decision = collect_batch(q.items, 1.0, ON)
    assert decision.expired == [late]
    assert decision.batch == [fine]
    assert decision.dropped == []


def test_a_request_before_its_deadline_is_batched(q: Queue) -> None:
    timely = q.add(at=0.0, deadline=1.5)
    decision = collect_batch(q.items, 1.0, ON)
    assert decision.batch == [timely]
    assert decision.expired == []


def test_only_expired_requests_leave_the_loop_idle(q: Queue) -> None:
    late = [q.add(at=0.0, deadline=0.1), q.add(at=0.0, deadline=0.2)]
    assert collect_batch(q.items, 1.0, ON) == Decision([], late, [], None)


def test_a_cancelled_request_is_dropped_and_not_run(q: Queue) -> None:
    gone = q.add(at=0.0)
    kept = q.add(at=0.0)
    gone.future.cancel()
    decision = collect_batch(q.items, 1.0, ON)
    assert decision.dropped == [gone]
    assert decision.batch == [kept]


def test_an_already_answered_request_is_dropped(q: Queue) -> None:
    answered = q.add(at=0.0)
    answered.future.set_result({})
    assert collect_batch(q.items, 1.0, ON) == Decision([], [], [answered], None)


def test_a_dropped_oldest_request_does_not_hold_back_the_next(q: Queue) -> None:
    gone = q.add(at=0.0, width=5)
    nxt = q.add(at=0.001)
    gone.future.cancel()
    decision = collect_batch(q.items, 0.002, ON)
    assert decision.dropped == [gone]
    assert decision.batch == []
    assert decision.wait == pytest.approx(0.004)  # max_delay from the new oldest, `nxt`
    assert nxt not in decision.dropped


# --- the wait and deadlines -------------------------------------------------------------


def test_the_wait_ends_at_the_nearest_deadline_when_it_comes_before_max_delay(q: Queue) -> None:
    patient = BatchPolicy(max_batch_size=32, max_delay=1.0)
    q.add(at=0.0)
    q.add(at=0.0, width=5, deadline=0.3)  # another group's deadline counts too
    q.add(at=0.0, deadline=0.6)
    decision = collect_batch(q.items, 0.1, patient)
    assert decision.batch == []
    assert decision.wait == pytest.approx(0.2)


def test_a_deadline_after_max_delay_does_not_shorten_the_wait(q: Queue) -> None:
    q.add(at=0.0, deadline=10.0)
    decision = collect_batch(q.items, 0.0, ON)
    assert decision.wait == pytest.approx(0.005)


# --- batch_key --------------------------------------------------------------------------


def f32(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


def test_batch_key_counts_rows_along_axis_zero() -> None:
    key, rows = batch_key({"x": f32(7, 3)}, None)
    assert key is not None
    assert rows == 7


def test_batch_key_allows_zero_rows() -> None:
    key, rows = batch_key({"x": f32(0, 3)}, None)
    assert key is not None
    assert rows == 0
    assert key == batch_key({"x": f32(5, 3)}, None)[0]


def test_batch_key_ignores_the_row_count_and_the_order_of_inputs() -> None:
    one = batch_key({"a": f32(1, 2), "b": np.zeros((1, 4), dtype=np.int64)}, None)
    many = batch_key({"b": np.zeros((9, 4), dtype=np.int64), "a": f32(9, 2)}, None)
    assert one[0] == many[0]
    assert (one[1], many[1]) == (1, 9)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"x": f32(1, 3)}, {"x": f32(1, 4)}),
        ({"x": f32(1, 3)}, {"x": f32(1, 3, 1)}),
        ({"x": f32(1, 3)}, {"x": np.zeros((1, 3), dtype=np.float16)}),
        ({"x": f32(1, 3)}, {"y": f32(1, 3)}),
        ({"x": f32(1, 3)}, {"x": f32(1, 3), "y": f32(1, 3)}),
    ],
    ids=["trailing-dim", "rank", "dtype", "name", "extra-input"],
)
def test_batch_keys_differ_when_inputs_could_not_be_stacked(
    left: dict[str, np.ndarray], right: dict[str, np.ndarray]
) -> None:
    assert batch_key(left, None)[0] != batch_key(right, None)[0]


def test_batch_keys_differ_by_requested_outputs() -> None:
    inputs = {"x": f32(1, 3)}
    keys = {batch_key(inputs, outputs)[0] for outputs in (None, ("y",), ("z",), ("y", "z"))}
    assert len(keys) == 4


def test_inputs_that_disagree_on_their_rows_run_alone() -> None:
    key, rows = batch_key({"a": f32(2, 3), "b": f32(3, 3)}, None)
    assert key is None
    assert rows >= 1


def test_a_scalar_input_runs_alone() -> None:
    assert batch_key({"x": np.float32(1.0) * np.ones((), dtype=np.float32)}, None) == (None, 1)


# --- batching_blocker -------------------------------------------------------------------


def meta(inputs: Sequence[tuple[int, ...]], outputs: Sequence[tuple[int, ...]]) -> ModelMetadata:
    return ModelMetadata(
        "m", "onnxruntime_onnx",
        tuple(TensorSpec(f"in{i}", "FP32", s) for i, s in enumerate(inputs)),
        tuple(TensorSpec(f"out{i}", "FP32", s) for i, s in enumerate(outputs)),
    )


@pytest.mark.parametrize(
    ("inputs", "outputs"),
    [
        ([(-1, 3)], [(-1, 8)]),
        ([(-1,)], [(-1, 2, 2)]),
        ([(-1, -1), (-1, 4)], [(-1, -1), (-1,)]),
    ],
)
def test_a_model_with_dynamic_first_dimensions_can_be_batched(
    inputs: list[tuple[int, ...]], outputs: list[tuple[int, ...]]
) -> None:
    assert batching_blocker(meta(inputs, outputs)) is None


@pytest.mark.parametrize(
    ("inputs", "outputs", "reason"),
    [
        ([(2, 3)], [(2, 3)], "input 'in0' has a fixed first dimension (2)"),
        ([(-1, 3), (1, 3)], [(-1, 3)], "input 'in1' has a fixed first dimension (1)"),
        ([(-1, 3)], [(-1, 3), (4,)], "output 'out1' has a fixed first dimension (4)"),
        ([()], [(-1,)], "input 'in0' is a scalar"),
        ([(-1, 3)], [()], "output 'out0' is a scalar"),
    ],
)
def test_a_model_that_cannot_be_batched_says_why(
    inputs: list[tuple[int, ...]], outputs: list[tuple[int, ...]], reason: str
) -> None:
    assert batching_blocker(meta(inputs, outputs)) == reason
