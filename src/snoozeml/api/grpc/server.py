"""The gRPC server: grpc core's options for `[server]`'s limits, and the servicers of
api/grpc/service.py registered behind one handler that parses requests inside the request
boundary."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from snoozeml.api.boundary import RequestBoundary
from snoozeml.api.grpc.codec import parse_or_malformed
from snoozeml.api.grpc.service import HealthServicer, InferenceServicer, ReflectionServicer
from snoozeml.config.settings import ServerConfig
from snoozeml.engine.service import InferenceService
from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc


class ParsedInBoundary(grpc.GenericRpcHandler):
    """The handlers the generated `add_*_to_server` functions register (it stands in for the
    server there), each with a request deserializer that returns Malformed instead of raising
    (grpc_codec.parse_or_malformed): bytes that are no message are then the request
    boundary's INVALID_ARGUMENT, not grpcio's UNKNOWN with a traceback in the log."""

    def __init__(self) -> None:
        self._generic: list[grpc.GenericRpcHandler] = []
        # Known methods only, so it stays small whatever names clients call.
        self._methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        """The same handlers come as generic ones too (and grpc.aio ignores these)."""

    def service(
        self, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = details.method
        handler = self._methods.get(method)
        if handler is not None:
            return handler
        for generic in self._generic:
            found: Any = generic.service(details)
            if found is not None:
                if found.request_deserializer is not None:
                    found = found._replace(
                        request_deserializer=parse_or_malformed(found.request_deserializer))
                self._methods[method] = found
                return found  # type: ignore[no-any-return]
        return None


def _reflection_pool() -> Any:
    """Our descriptors live in a private pool (see `make proto`); reflection answers from it,
    so the health and reflection services' own files are added there too."""
    pool = pb.DESCRIPTOR.pool
    for file in (health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        try:
            pool.FindFileByName(file.name)
        except KeyError:
            pool.AddSerializedFile(file.serialized_pb)
    return pool


def create_grpc_server(
    service: InferenceService, boundary: RequestBoundary, config: ServerConfig
) -> grpc.aio.Server:
    max_message_size = config.grpc_max_message_size
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_message_size),
        ("grpc.max_send_message_length", max_message_size),
        ("grpc.so_reuseport", 0),
        *limit_options(config),
    ])
    handlers = ParsedInBoundary()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        InferenceServicer(service, boundary, max_message_size), handlers
    )
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(service, boundary), handlers)
    names = (
        pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        ReflectionServicer(names, _reflection_pool(), boundary), handlers
    )
    server.add_generic_rpc_handlers((handlers,))
    return server


def limit_options(config: ServerConfig) -> list[tuple[str, int]]:
    """gRPC core's channel arguments for `[server]`'s gRPC limits (docs/security.md)."""

    def ms(seconds: float) -> int:
        return max(1, round(seconds * 1000))

    return [
        # Metadata past the soft limit is refused at random up to the hard one; both the
        # same: every call past it is refused (RESOURCE_EXHAUSTED), none under it.
        ("grpc.max_metadata_size", config.grpc_max_metadata_size),
        ("grpc.absolute_max_metadata_size", config.grpc_max_metadata_size),
        ("grpc.max_concurrent_streams", config.grpc_max_concurrent_streams),
        # The server's pings find peers that vanished (an open Watch would hold for ever),
        # idle connections too, with no cap on pings between data. A ping with no answer is
        # given up on after ping_timeout (keepalive_timeout alone waits for the peer to send
        # something first, so a silent peer would be kept for grpc's default minute).
        ("grpc.keepalive_time_ms", ms(config.grpc_keepalive_time)),
        ("grpc.keepalive_timeout_ms", ms(config.grpc_keepalive_timeout)),
        ("grpc.http2.ping_timeout_ms", ms(config.grpc_keepalive_timeout)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # A client's ping sooner than this after the last is a strike, on an idle connection
        # too (permit_without_calls; else idle ones may ping every 2 h only); past two
        # strikes, GOAWAY ENHANCE_YOUR_CALM "too_many_pings". Data the server sends
        # forgives strikes.
        ("grpc.http2.min_ping_interval_without_data_ms", ms(config.grpc_keepalive_min_time)),
        ("grpc.http2.max_ping_strikes", 2),
    ]
