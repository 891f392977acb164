"""The one request boundary, seen from inside a real daemon: the daemon runs in this process (on
ephemeral ports, its real HTTP and gRPC listeners), real clients call every operation over both
transports, and a subscriber of the daemon's event bus checks that each call ends in exactly one
`RequestFinished` naming its operation, protocol, model and outcome. Also the fixes that came
with the boundary: Retry-After's gRPC trailers, a gzip repository-index body, versions from the
model."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from onnx_models import write_corrupt_model, write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.events import EngineEvent, RequestFinished
from snoozeml.operations import Operation
from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc
from snoozeml.server import Daemon

Seen = tuple[Operation, str, str | None, str, int]


class Recorder:
    """Every RequestFinished, and a way to wait for one that matches."""

    def __init__(self) -> None:
        self.events: list[RequestFinished] = []
        self._arrived = asyncio.Event()

    def __call__(self, event: EngineEvent) -> None:
        assert isinstance(event, RequestFinished)
        self.events.append(event)
        self._arrived.set()

    def take(self) -> list[Seen]:
        taken = [(e.operation, e.protocol, e.model, e.outcome, e.status) for e in self.events]
        self.events.clear()
        return taken

    async def until(self, operation: Operation, outcome: str) -> None:
        while not any(e.operation is operation and e.outcome == outcome for e in self.events):
            self._arrived.clear()
            await asyncio.wait_for(self._arrived.wait(), 30)  # a guard, not a measurement


@asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[tuple[Daemon, Recorder]]:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    write_corrupt_model(tmp_path / "broken.onnx")
    config = parse_config({
        "server": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "log_level": "error"},
        "models": [{"name": "mlp", "path": "mlp.onnx"}, {"name": "broken", "path": "broken.onnx"}],
    }, source=tmp_path / "models.toml")
    daemon = Daemon(config)
    recorder = Recorder()
    daemon.events.subscribe(recorder, [RequestFinished])
    task = asyncio.create_task(daemon.run())
    try:
        await asyncio.wait_for(daemon.started.wait(), 60)
        yield daemon, recorder
    finally:
        daemon.request_shutdown("SIGTERM")
        assert await asyncio.wait_for(task, 60) == 0


def infer_body(rows: int = 1) -> dict[str, object]:
    return {"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32",
                        "data": np.ones((rows, 4), np.float32).ravel().tolist()}]}


def grpc_infer(model: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend(
        [1.0] * 4)
    return request


OK = "ok"
Op = Operation


def test_every_http_operation_ends_in_one_event_with_its_outcome(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[Seen], dict[str, object]]:
        async with running(tmp_path) as (daemon, recorder), httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{daemon.http_port}", timeout=60
        ) as http:
            answers: dict[str, object] = {}
            assert (await http.get("/v2/health/live")).status_code == 200
            assert (await http.get("/health/ready")).status_code == 200
            assert (await http.get("/v2")).status_code == 200
            meta = await http.get("/v2/models/mlp")
            answers["versions"] = meta.json()["versions"]
            assert (await http.get("/v2/models/mlp/versions/1/ready")).status_code == 200
            assert (await http.post("/v2/models/mlp/infer", json=infer_body())).status_code == 200
            assert (await http.post("/v2/models/mlp/infer", content=b"{")).status_code == 400
            assert (await http.post("/v2/models/nope/infer", json=infer_body())).status_code == 404
            broken = await http.post("/v2/models/broken/infer", json=infer_body())
            answers["broken"] = (broken.status_code, broken.headers.get("retry-after"))
            index = await http.post(
                "/v2/repository/index", content=gzip.compress(orjson.dumps({"ready": True})),
                headers={"content-encoding": "gzip", "content-type": "application/json"})
            answers["index"] = [entry["name"] for entry in index.json()]
            assert (await http.post("/v2/repository/models/mlp/unload")).status_code == 200
            assert (await http.post("/v2/repository/models/mlp/load")).status_code == 200
            assert (await http.get("/admin/status")).status_code == 200
            assert (await http.get("/no/such/path")).status_code == 404  # not an operation
            return recorder.take(), answers

    seen, answers = asyncio.run(scenario())
    assert seen == [
        (Op.SERVER_LIVE, "http", None, OK, 200),
        (Op.SERVER_READY, "http", None, OK, 200),
        (Op.SERVER_METADATA, "http", None, OK, 200),
        (Op.MODEL_METADATA, "http", "mlp", OK, 200),
        (Op.MODEL_READY, "http", "mlp", OK, 200),
        (Op.INFER, "http", "mlp", OK, 200),
        (Op.INFER, "http", "mlp", "invalid_input", 400),
        (Op.INFER, "http", "nope", "not_found", 404),
        (Op.INFER, "http", "broken", "unavailable", 503),
        (Op.REPOSITORY_INDEX, "http", None, OK, 200),
        (Op.REPOSITORY_UNLOAD, "http", "mlp", OK, 200),
        (Op.REPOSITORY_LOAD, "http", "mlp", OK, 200),
        (Op.ADMIN_STATUS, "http", None, OK, 200),
    ]
    assert answers["versions"] == ["1"]
    status, retry_after = answers["broken"]  # type: ignore[misc]
    assert status == 503
    assert int(retry_after) >= 1
    assert answers["index"] == ["mlp"]  # the gzip body was read: ready models only


def test_every_grpc_operation_ends_in_one_event_with_its_outcome(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[Seen], dict[str, object]]:
        async with running(tmp_path) as (daemon, recorder), grpc.aio.insecure_channel(
            f"127.0.0.1:{daemon.grpc_port}"
        ) as channel:
            answers: dict[str, object] = {}
            oip = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            health = health_pb2_grpc.HealthStub(channel)
            await oip.ServerLive(pb.ServerLiveRequest())
            await oip.ServerReady(pb.ServerReadyRequest())
            await oip.ServerMetadata(pb.ServerMetadataRequest())
            meta = await oip.ModelMetadata(pb.ModelMetadataRequest(name="mlp"))
            answers["versions"] = list(meta.versions)
            await oip.ModelReady(pb.ModelReadyRequest(name="mlp"))
            await oip.ModelInfer(grpc_infer("mlp"))
            with pytest.raises(grpc.aio.AioRpcError) as broken:
                await oip.ModelInfer(grpc_infer("broken"))
            answers["broken"] = (broken.value.code(), dict(broken.value.trailing_metadata()))
            await oip.RepositoryIndex(pb.RepositoryIndexRequest())
            await oip.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="mlp"))
            await oip.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="mlp"))
            await health.Check(health_pb2.HealthCheckRequest(service=""))
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await health.Check(health_pb2.HealthCheckRequest(service="nope"))
            answers["unknown"] = unknown.value.code()
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            listed = [r async for r in reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]))]
            answers["services"] = sorted(
                s.name for s in listed[0].list_services_response.service)
            await recorder.until(Op.REFLECTION, OK)
            watch = health.Watch(health_pb2.HealthCheckRequest(service="mlp"))
            answers["watch"] = (await watch.read()).status
            watch.cancel()
            await recorder.until(Op.HEALTH, "cancelled")
            return recorder.take(), answers

    seen, answers = asyncio.run(scenario())
    assert seen == [
        (Op.SERVER_LIVE, "grpc", None, OK, 200),
        (Op.SERVER_READY, "grpc", None, OK, 200),
        (Op.SERVER_METADATA, "grpc", None, OK, 200),
        (Op.MODEL_METADATA, "grpc", "mlp", OK, 200),
        (Op.MODEL_READY, "grpc", "mlp", OK, 200),
        (Op.INFER, "grpc", "mlp", OK, 200),
        (Op.INFER, "grpc", "broken", "unavailable", 503),
        (Op.REPOSITORY_INDEX, "grpc", None, OK, 200),
        (Op.REPOSITORY_UNLOAD, "grpc", "mlp", OK, 200),
        (Op.REPOSITORY_LOAD, "grpc", "mlp", OK, 200),
        (Op.HEALTH, "grpc", None, OK, 200),
        (Op.HEALTH, "grpc", "nope", "not_found", 404),
        (Op.REFLECTION, "grpc", None, OK, 200),
        (Op.HEALTH, "grpc", "mlp", "cancelled", 499),
    ]
    assert answers["versions"] == ["1"]
    code, trailers = answers["broken"]  # type: ignore[misc]
    assert code is grpc.StatusCode.UNAVAILABLE
    seconds = int(trailers["retry-after"])
    assert seconds >= 1
    assert trailers["grpc-retry-pushback-ms"] == str(seconds * 1000)
    assert answers["unknown"] is grpc.StatusCode.NOT_FOUND
    assert answers["services"] == [
        "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
        "inference.GRPCInferenceService",
    ]
    assert answers["watch"] == health_pb2.HealthCheckResponse.SERVING
