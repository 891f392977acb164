"""The operation table (snoozeml/operations.py) against what the transports really serve: every
HTTP route and every gRPC method maps to exactly one operation, and every route or method an
operation lists exists. Adding a route or an RPC without an entry fails here."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from starlette.routing import Match, Route

from snoozeml.api.boundary import RequestBoundary
from snoozeml.api.grpc.modelmesh import ModelRuntimeServicer
from snoozeml.api.grpc.service import HealthServicer, InferenceServicer, ReflectionServicer
from snoozeml.api.http.fastpath import INFER_PATH
from snoozeml.api.http.rest import SERVED_ELSEWHERE, create_app
from snoozeml.config.settings import parse_config
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.service import InferenceService
from snoozeml.operations import OPERATIONS, Operation, operation_for_rpc
from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import model_runtime_pb2 as mm


@pytest.fixture
def service(tmp_path: Path) -> Iterator[InferenceService]:
    manager = ModelManager(parse_config({}, source=tmp_path / "models.toml"))
    yield InferenceService(manager)
    manager.loader.shutdown()


def table_routes() -> list[tuple[str, str]]:
    return [route for spec in OPERATIONS.values() for route in spec.http]


def app_routes(service: InferenceService) -> set[tuple[str, str]]:
    app = create_app(service, RequestBoundary(service.events), 1024)
    return {
        (method, route.path)
        for route in app.routes if isinstance(route, Route)
        for method in route.methods if method != "HEAD"
    }


def concrete(path: str) -> str:
    return path.replace("{name}", "some-model").replace("{version}", "7")


def test_no_route_belongs_to_two_operations() -> None:
    twice = [route for route, count in Counter(table_routes()).items() if count > 1]
    assert twice == []


def test_the_app_serves_exactly_the_table_routes_but_inference(
    service: InferenceService,
) -> None:
    expected = {route for operation, spec in OPERATIONS.items()
                if operation not in SERVED_ELSEWHERE for route in spec.http}
    assert app_routes(service) == expected


def test_the_inference_fast_path_serves_exactly_the_infer_routes(
    service: InferenceService,
) -> None:
    infer = OPERATIONS[Operation.INFER].http
    assert infer
    for method, path in infer:
        assert method == "POST"
        match = INFER_PATH.match(concrete(path))
        assert match is not None, path
        assert match["name"] == "some-model"
    others = [path for method, path in table_routes() if (method, path) not in infer]
    assert [p for p in others if INFER_PATH.match(concrete(p))] == []
    # Nothing the app serves is shadowed by the fast path in front of it.
    assert [p for _, p in app_routes(service) if INFER_PATH.match(concrete(p))] == []


def _grpc_methods() -> Iterator[tuple[str, str]]:
    """(full method name, servicer attribute) of every RPC the daemon registers."""
    for service in (
        pb.DESCRIPTOR.services_by_name["GRPCInferenceService"],
        health_pb2.DESCRIPTOR.services_by_name["Health"],
        reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
        mm.DESCRIPTOR.services_by_name["ModelRuntime"],
    ):
        for method in service.methods:
            yield f"/{service.full_name}/{method.name}", method.name


SERVICERS = (InferenceServicer, HealthServicer, ReflectionServicer, ModelRuntimeServicer)


def test_every_grpc_method_has_exactly_one_operation_and_the_table_lists_no_other() -> None:
    served = dict(_grpc_methods())
    listed = [rpc for spec in OPERATIONS.values() for rpc in spec.grpc]
    assert sorted(listed) == sorted(served)  # each once, none missing, none extra


@pytest.mark.parametrize(("rpc", "attribute"), list(_grpc_methods()))
def test_each_rpc_handler_runs_as_its_tables_operation(rpc: str, attribute: str) -> None:
    owners = [servicer for servicer in SERVICERS if attribute in vars(servicer)]
    assert len(owners) == 1, f"{rpc} is implemented by {owners}"
    handler = vars(owners[0])[attribute]
    assert handler.operation is operation_for_rpc(rpc)


def test_every_operation_is_reachable_or_declared_for_later() -> None:
    unreachable = {op for op, spec in OPERATIONS.items() if not spec.http and not spec.grpc}
    assert unreachable == set()
    assert set(OPERATIONS) == set(Operation)


# A model-scoped operation that, without a name, answers for every model.
EVERY_MODEL = {"/v2/models/stats", "/v1/models"}
# OpenAI's request names its model in the JSON, and so do the rerank routes' (or leave it
# out when the daemon has one reranker).
MODEL_IN_BODY = {"/v1/embeddings", "/v1/rerank", "/v2/rerank", "/rerank"}


def test_the_every_model_routes_are_not_taken_for_a_model_named_like_them(
    service: InferenceService,
) -> None:
    app = create_app(service, RequestBoundary(service.events), 1024)
    scope = {"type": "http", "method": "GET", "path": "/v2/models/stats", "path_params": {}}
    first = next(route for route in app.routes if route.matches(scope)[0] is Match.FULL)
    assert isinstance(first, Route)
    assert first.path == "/v2/models/stats"


@pytest.mark.parametrize("operation", list(Operation))
def test_model_scoped_operations_name_the_model_in_their_routes(operation: Operation) -> None:
    spec = OPERATIONS[operation]
    for _, path in spec.http:
        if path in EVERY_MODEL | MODEL_IN_BODY:
            assert spec.model_scoped, path
            continue
        assert ("{name}" in path) is spec.model_scoped, path
    assert all(re.fullmatch(r"/[\w.]+/\w+", rpc) for rpc in spec.grpc)
