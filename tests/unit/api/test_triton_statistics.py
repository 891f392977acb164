"""Triton's statistics extension on the wire (api/triton_statistics.py): the numbers the
events gave, as Triton's JSON and as its protobuf, which tritonclient's own messages decode."""

from __future__ import annotations

from google.protobuf import json_format
from statistics_feed import fed, infer_finished

from snoozeml.api.triton_statistics import statistics_json, statistics_proto
from snoozeml.engine.events import BatchRun
from snoozeml.engine.observe.triton_statistics import ModelStatistics


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
