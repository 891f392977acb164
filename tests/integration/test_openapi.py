"""The OpenAPI document (src/snoozeml/api/openapi/document.py) against the daemon it describes:
exactly the
HTTP routes of the operation table, both ways (a GET route is a GET and a HEAD operation),
each operation under its table name; a valid OpenAPI 3.0 document that schemathesis loads
whole; every error answer the error body; and served, as built, at /openapi.json.
test_fuzz_http.py checks the real answers against it."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from daemon import Daemon
from openapi_spec_validator import validate
from schemathesis.core.result import Err

from snoozeml.api.openapi.document import document
from snoozeml.operations import OPERATIONS, Operation

METHODS = ("get", "head", "post", "put", "patch", "delete", "options", "trace")
DOCUMENT = document()


def documented() -> dict[tuple[str, str], dict[str, Any]]:
    """(METHOD, path) -> operation object, every one in the document."""
    return {(method.upper(), path): operation
            for path, item in DOCUMENT["paths"].items()
            for method, operation in item.items() if method in METHODS}


def table_routes() -> dict[tuple[str, str], Operation]:
    routes = {}
    for operation, spec in OPERATIONS.items():
        for method, path in spec.http:
            routes[(method, path)] = operation
            if method == "GET":  # every GET route answers HEAD too
                routes[("HEAD", path)] = operation
    return routes


def test_the_document_describes_exactly_the_routes_of_the_operation_table() -> None:
    in_document, in_table = set(documented()), set(table_routes())
    assert sorted(in_table - in_document) == [], "routes the document leaves out"
    assert sorted(in_document - in_table) == [], "documented routes that do not exist"


def test_each_documented_operation_is_its_routes_operation_in_the_table() -> None:
    table = table_routes()
    for route, operation in documented().items():
        assert operation["x-operation"] == table[route].value, route
        assert operation["operationId"].startswith(table[route].value), route


def test_operation_ids_are_unique() -> None:
    ids = [operation["operationId"] for operation in documented().values()]
    assert len(ids) == len(set(ids))


def test_the_document_is_valid_openapi() -> None:
    validate(DOCUMENT)  # raises with the offending path


def test_schemathesis_loads_every_operation() -> None:
    schema = schemathesis.openapi.from_dict(DOCUMENT)
    results = list(schema.get_all_operations())
    failed = [result.err() for result in results if isinstance(result, Err)]
    assert failed == []
    assert len(results) == len(documented())


# The operations whose errors are another API's object than OIP's or OpenAI's.
ERROR_KINDS = {"rerank": "RerankError", "tei_rerank": "TeiError"}
# Answers with a 503 status that are not errors: "not ready" is the answer asked for.
NOT_READY = {"server_ready", "model_ready"}


def test_every_error_answer_is_the_error_object_and_every_get_answers_head() -> None:
    for (method, path), operation in documented().items():
        if method == "HEAD":
            continue
        # OpenAI's clients read OpenAI's error object on its routes; Cohere's and TEI's
        # theirs on the rerank routes.
        kind = ERROR_KINDS.get(operation["x-operation"],
                               "OpenAIError" if path.startswith("/v1/") else "Error")
        error = {"$ref": f"#/components/schemas/{kind}"}
        for status, response in operation["responses"].items():
            if int(status) >= 400 and operation["x-operation"] not in NOT_READY:
                assert response["content"]["application/json"]["schema"] == error, \
                    (method, path, status)
        if method == "GET":
            head = DOCUMENT["paths"][path]["head"]["responses"]
            assert set(head) == set(operation["responses"]), path
            assert all("content" not in response for response in head.values()), path


def test_probes_need_no_credentials_and_everything_else_documents_the_refusals() -> None:
    table = table_routes()
    for route, operation in documented().items():
        public = OPERATIONS[table[route]].access.value == "probe"
        assert (operation.get("security") == []) is public, route
        assert ({"401", "403"} <= set(operation["responses"])) is not public, route


KEY = "snz_openapi-readonly"


@pytest.fixture(scope="module")
def daemon(module_serve: Any) -> Daemon:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return module_serve(  # type: ignore[no-any-return]
        f'[auth]\napi_keys = [{{ name = "docs", role = "readonly", sha256 = "{digest}" }}]\n')


def test_the_daemon_serves_the_document_at_openapi_json_to_a_reader(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        response = client.get("/openapi.json", headers={"X-API-Key": KEY})
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.content == orjson.dumps(DOCUMENT)
        head = client.head("/openapi.json", headers={"X-API-Key": KEY})
        assert (head.status_code, head.content) == (200, b"")
        refused = client.get("/openapi.json")
        assert (refused.status_code, refused.json()) == (401, {"error": "missing credentials"})
