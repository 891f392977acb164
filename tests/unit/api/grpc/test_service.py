"""grpc.health.v1 Watch against a real InferenceService, with the drain landing mid-write.

A drain that begins while a Watch is writing its previous status cannot be timed from outside
the process (the window is the write itself), so this drives the servicer directly: its
context stands in for grpc's, and its `write` starts the drain the way SIGTERM would while
that write is in flight.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from grpc_health.v1 import health_pb2
from onnx_models import write_mlp

from snoozeml.api.boundary import RequestBoundary
from snoozeml.api.grpc.service import HealthServicer
from snoozeml.config.settings import parse_config
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.service import InferenceService

Status = health_pb2.HealthCheckResponse.ServingStatus


class DrainOnFirstWrite:
    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.sent: list[int] = []

    async def write(self, message: health_pb2.HealthCheckResponse) -> None:
        self.sent.append(message.status)
        if len(self.sent) == 1:
            self.service.start_draining()
        await asyncio.sleep(0)


def test_a_drain_that_begins_during_a_write_still_sends_not_serving_before_the_end(
    tmp_path: Path,
) -> None:
    write_mlp(tmp_path / "mlp.onnx")
    config = parse_config(
        {"models": [{"name": "mlp", "path": "mlp.onnx"}]}, source=tmp_path / "models.toml"
    )

    async def scenario() -> tuple[list[int], list[int]]:
        sent = []
        for service_name in ("", "mlp"):
            service = InferenceService(ModelManager(config))
            context = DrainOnFirstWrite(service)
            request = health_pb2.HealthCheckRequest(service=service_name)
            servicer = HealthServicer(service, RequestBoundary(service.events))
            await asyncio.wait_for(servicer.Watch(request, context), 10)
            sent.append(context.sent)
        return sent[0], sent[1]

    server, model = asyncio.run(scenario())
    # The server's stream reports the drain, then ends; the model's status did not change.
    assert server == [Status.SERVING, Status.NOT_SERVING]
    assert model == [Status.SERVING]
