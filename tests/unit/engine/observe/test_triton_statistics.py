"""Triton's statistics extension in the engine (engine/observe/triton_statistics.py): events in,
exact numbers out. (The same numbers on the wire: tests/unit/api/test_triton_statistics.py;
the service's lookup by name: tests/unit/engine/test_service.py.)"""

from __future__ import annotations

from statistics_feed import fed, infer_finished

from snoozeml.engine.events import BatchRun, RequestFinished
from snoozeml.engine.observe.triton_statistics import BatchStatistics, Duration, ModelStatistics
from snoozeml.operations import Operation


def test_a_model_without_traffic_has_zeros() -> None:
    zero = Duration(0, 0)
    assert fed().model("m", "1") == ModelStatistics(
        name="m", version="1", last_inference_ms=0, inference_count=0, execution_count=0,
        success=zero, fail=zero, queue=zero, compute_input=zero, compute_infer=zero,
        compute_output=zero, batches=(),
    )


def test_requests_and_runs_are_summed_as_triton_counts_them() -> None:
    stats = fed(
        # Three requests in one run of 5 rows, then one request of 1 row alone.
        BatchRun("m", 0, 5, (0.002, 0.004, 0.001), 0.010, False),
        BatchRun("m", 1, 1, (0.003,), 0.005, True),
        BatchRun("m", 0, 2, (0.5,), 0.25, False, ok=False),  # failed: no run figure
        infer_finished("m", "ok", 0.020),
        infer_finished("m", "ok", 0.030, "grpc"),
        infer_finished("m", "ok", 0.040),
        infer_finished("m", "ok", 0.007, "grpc"),
        infer_finished("m", "invalid_input", 0.001),
        infer_finished("m", "backend_error", 0.250),
        infer_finished("m", "cancelled", 9.0),  # the client left: neither
        infer_finished("m", "unauthenticated", 0.0001),  # refused before the model: neither
        infer_finished("m", "forbidden", 0.0001),
        infer_finished("m", "not_found", 0.0001),  # a version it lacks: not the model's
    ).model("m", "1")
    assert stats.success == Duration(4, 97_000_000)
    assert stats.fail == Duration(2, 251_000_000)
    assert stats.queue == Duration(4, 10_000_000)  # each request's own wait
    assert stats.compute_infer == Duration(4, 3 * 10_000_000 + 5_000_000)  # the run, per request
    assert stats.compute_input == stats.compute_output == Duration(0, 0)
    assert stats.inference_count == 6  # rows
    assert stats.execution_count == 2  # runs
    assert stats.last_inference_ms == 1_700_000_000_250
    assert stats.batches == (
        BatchStatistics(1, Duration(), Duration(1, 5_000_000), Duration()),
        BatchStatistics(5, Duration(), Duration(1, 10_000_000), Duration()),
    )


def test_runs_of_one_size_add_up() -> None:
    stats = fed(
        BatchRun("m", 0, 1, (0.001,), 0.002, False),
        BatchRun("m", 0, 1, (0.001,), 0.003, False),
    ).model("m", "1")
    assert stats.batches == (BatchStatistics(1, Duration(), Duration(2, 5_000_000), Duration()),)


def test_other_models_operations_and_unknown_names_are_not_counted() -> None:
    statistics = fed(
        BatchRun("other", 0, 1, (0.001,), 0.002, False),
        BatchRun("nobody", 0, 1, (0.001,), 0.002, False),  # not configured: ignored
        infer_finished("nobody", "not_found", 0.001),
        infer_finished(None, "invalid_input", 0.001),
        RequestFinished(Operation.MODEL_METADATA, "http", "m", "ok", 200, 0.001),
        RequestFinished(Operation.MODEL_READY, "grpc", "m", "unavailable", 503, 0.001),
    )
    m = statistics.model("m", "1")
    assert (m.success, m.fail, m.execution_count) == (Duration(), Duration(), 0)
    assert statistics.model("other", "1").execution_count == 1
    assert statistics.model("nobody", "1").execution_count == 0  # kept nowhere
