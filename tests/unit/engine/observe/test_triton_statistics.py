"""Triton's statistics extension: events in, exact numbers out
(engine/observe/triton_statistics.py), the same
numbers as Triton's JSON and protobuf (api/triton_statistics.py), and the service's lookup by
name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format
from onnx_models import write_mlp

from snoozeml.api.triton_statistics import statistics_json, statistics_proto
from snoozeml.config.settings import parse_config
from snoozeml.engine.events import BatchRun, EventBus, RequestFinished
from snoozeml.engine.observe.triton_statistics import (
    BatchStatistics,
    Duration,
    ModelStatistics,
    Statistics,
)
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.service import EXTENSIONS, InferenceService
from snoozeml.errors import ModelNotFound
from snoozeml.operations import Operation

WALL = 1_700_000_000.25  # seconds since the epoch


def infer_finished(model: str | None, outcome: str, seconds: float,
                   protocol: str = "http") -> RequestFinished:
    status = {"ok": 200, "cancelled": 499, "invalid_input": 400}.get(outcome, 503)
    return RequestFinished(Operation.INFER, protocol, model, outcome, status, seconds)


def fed(*events: object) -> Statistics:
    statistics = Statistics(["m", "other"], wall=lambda: WALL)
    bus = EventBus()
    statistics.subscribe(bus)
    for event in events:
        bus.publish(event)  # type: ignore[arg-type]
    return statistics


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


# --- on the wire ------------------------------------------------------------------------------


def sample() -> ModelStatistics:
    return fed(
        BatchRun("m", 0, 3, (0.001, 0.002), 0.004, False),
        infer_finished("m", "ok", 0.010),
        infer_finished("m", "ok", 0.010),
        infer_finished("m", "queue_full", 0.0005),
    ).model("m", "1")


def test_the_json_has_tritons_shape() -> None:
    assert statistics_json([sample()]) == {"model_stats": [{
        "name": "m",
        "version": "1",
        "last_inference": 1_700_000_000_250,
        "inference_count": 3,
        "execution_count": 1,
        "inference_stats": {
            "success": {"count": 2, "ns": 20_000_000},
            "fail": {"count": 1, "ns": 500_000},
            "queue": {"count": 2, "ns": 3_000_000},
            "compute_input": {"count": 0, "ns": 0},
            "compute_infer": {"count": 2, "ns": 8_000_000},
            "compute_output": {"count": 0, "ns": 0},
            "cache_hit": {"count": 0, "ns": 0},
            "cache_miss": {"count": 0, "ns": 0},
        },
        "batch_stats": [{
            "batch_size": 3,
            "compute_input": {"count": 0, "ns": 0},
            "compute_infer": {"count": 1, "ns": 4_000_000},
            "compute_output": {"count": 0, "ns": 0},
        }],
        "memory_usage": [],
        "response_stats": {},
    }]}


def test_the_protobuf_carries_the_same_numbers_as_the_json() -> None:
    message = statistics_proto([sample()])
    as_dict = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)

    def numbers(value: object, key: str = "") -> object:
        # protobuf's JSON writes uint64 as strings; compare numbers with numbers.
        if isinstance(value, dict):
            return {k: numbers(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [numbers(v) for v in value]
        return int(value) if isinstance(value, str) and key not in ("name", "version") else value

    assert numbers(as_dict) == statistics_json([sample()])


def test_the_protobuf_decodes_with_tritonclients_own_messages() -> None:
    from tritonclient.grpc import service_pb2 as triton

    decoded = triton.ModelStatisticsResponse.FromString(
        statistics_proto([sample()]).SerializeToString())
    (stats,) = decoded.model_stats
    assert (stats.name, stats.version, stats.inference_count, stats.execution_count) == (
        "m", "1", 3, 1)
    assert stats.last_inference == 1_700_000_000_250
    assert (stats.inference_stats.success.count, stats.inference_stats.fail.count) == (2, 1)
    assert stats.inference_stats.compute_infer.ns == 8_000_000
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(3, 1)]


# --- the service ------------------------------------------------------------------------------


@pytest.fixture
def service(tmp_path: Path) -> Iterator[InferenceService]:
    for name in ("a", "b"):
        write_mlp(tmp_path / f"{name}.onnx", dims=(4, 2))
    config = parse_config({"models": [
        {"name": "a", "path": str(tmp_path / "a.onnx")},
        {"name": "b", "path": str(tmp_path / "b.onnx")},
    ]}, source=tmp_path / "models.toml")
    manager = ModelManager(config)
    yield InferenceService(manager)
    manager.loader.shutdown()


def test_the_service_answers_for_one_model_or_every_configured_one(
    service: InferenceService,
) -> None:
    service.events.publish(BatchRun("b", 0, 2, (0.001,), 0.002, False))
    assert [s.name for s in service.statistics()] == ["a", "b"]  # loaded or not
    assert [s.name for s in service.statistics("")] == ["a", "b"]
    (b,) = service.statistics("b")
    assert (b.name, b.version, b.inference_count, b.execution_count) == ("b", "1", 2, 1)
    assert service.statistics("b", "1") == (b,)


def test_an_unknown_model_or_version_is_not_found(service: InferenceService) -> None:
    with pytest.raises(ModelNotFound):
        service.statistics("missing")
    with pytest.raises(ModelNotFound):
        service.statistics("a", "7")


def test_server_metadata_lists_the_extension() -> None:
    assert "statistics" in EXTENSIONS
