"""Triton's statistics extension on the wire: the engine's typed statistics
(engine/observe/triton_statistics.py) as Triton's JSON (HTTP) and as its ModelStatisticsResponse
(gRPC).

The JSON has the shape tritonclient.http reads, and the field names of the protobuf message, so
the two transports answer alike (but for protobuf's JSON writing its uint64 fields as strings).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from snoozeml.engine.observe.triton_statistics import Duration, ModelStatistics
from snoozeml.proto import inference_pb2 as pb


def _duration_json(duration: Duration) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}


def statistics_json(models: Iterable[ModelStatistics]) -> dict[str, Any]:
    return {"model_stats": [
        {
            "name": stats.name,
            "version": stats.version,
            "last_inference": stats.last_inference_ms,
            "inference_count": stats.inference_count,
            "execution_count": stats.execution_count,
            "inference_stats": {
                "success": _duration_json(stats.success),
                "fail": _duration_json(stats.fail),
                "queue": _duration_json(stats.queue),
                "compute_input": _duration_json(stats.compute_input),
                "compute_infer": _duration_json(stats.compute_infer),
                "compute_output": _duration_json(stats.compute_output),
                "cache_hit": _duration_json(Duration()),
                "cache_miss": _duration_json(Duration()),
            },
            "batch_stats": [
                {
                    "batch_size": batch.batch_size,
                    "compute_input": _duration_json(batch.compute_input),
                    "compute_infer": _duration_json(batch.compute_infer),
                    "compute_output": _duration_json(batch.compute_output),
                }
                for batch in stats.batches
            ],
            "memory_usage": [],
            "response_stats": {},
        }
        for stats in models
    ]}


def _duration_proto(duration: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=duration.count, ns=duration.ns)


def statistics_proto(models: Iterable[ModelStatistics]) -> pb.ModelStatisticsResponse:
    return pb.ModelStatisticsResponse(model_stats=[
        pb.ModelStatistics(
            name=stats.name,
            version=stats.version,
            last_inference=stats.last_inference_ms,
            inference_count=stats.inference_count,
            execution_count=stats.execution_count,
            inference_stats=pb.InferStatistics(
                success=_duration_proto(stats.success),
                fail=_duration_proto(stats.fail),
                queue=_duration_proto(stats.queue),
                compute_input=_duration_proto(stats.compute_input),
                compute_infer=_duration_proto(stats.compute_infer),
                compute_output=_duration_proto(stats.compute_output),
                cache_hit=pb.StatisticDuration(),
                cache_miss=pb.StatisticDuration(),
            ),
            batch_stats=[
                pb.InferBatchStatistics(
                    batch_size=batch.batch_size,
                    compute_input=_duration_proto(batch.compute_input),
                    compute_infer=_duration_proto(batch.compute_infer),
                    compute_output=_duration_proto(batch.compute_output),
                )
                for batch in stats.batches
            ],
        )
        for stats in models
    ])
