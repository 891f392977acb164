"""The pure parts of the OpenAI routes (api/http/openai.py): the request's `input`, the pieces a
request is split into, and the error object each status gets."""

from __future__ import annotations

import pytest

from snoozeml.api.boundary import answer_for
from snoozeml.api.http.openai import BadParam, error_body, parse_input
from snoozeml.auth.authenticator import PermissionDenied, Unauthenticated
from snoozeml.errors import BackendError, InvalidInput, ModelNotFound, QueueFull


def test_each_kind_of_input_is_read_as_itself() -> None:
    assert parse_input("one", 10).texts == ["one"]
    assert parse_input(["a", "b"], 10).texts == ["a", "b"]
    assert parse_input([101, 7, 102], 10).ids == [[101, 7, 102]]
    assert parse_input([[101, 102], [101, 5, 102]], 10).ids == [[101, 102], [101, 5, 102]]
    assert len(parse_input(["x"] * 10, 10)) == 10


@pytest.mark.parametrize("value", [
    "", [], None, 7, {"text": "x"}, ["a", ""], ["a", 1], [1, True], [[1], [2, "3"]], [[]],
    [-1], [2**63], [1.0], ["x"] * 11,
])
def test_bad_inputs_are_400s_naming_input(value: object) -> None:
    with pytest.raises(BadParam) as raised:
        parse_input(value, 10)
    assert raised.value.param == "input"


@pytest.mark.parametrize(("exc", "status", "kind", "code", "param"), [
    (BadParam("bad", "input"), 400, "invalid_request_error", None, "input"),
    (InvalidInput("bad"), 400, "invalid_request_error", None, None),
    (Unauthenticated("missing"), 401, "authentication_error",
     "invalid_api_key", None),
    (PermissionDenied("denied", "app"), 403, "permission_error", None, None),
    (ModelNotFound("unknown model 'x'"), 404, "invalid_request_error", "model_not_found",
     "model"),
    (QueueFull("full", retry_after=1.0), 503, "server_error", None, None),
    (BackendError("boom"), 500, "server_error", None, None),
])
def test_each_error_gets_openais_object(
    exc: Exception, status: int, kind: str, code: str | None, param: str | None,
) -> None:
    answer = answer_for(exc)
    body = error_body(exc, answer)

    assert answer.http_status == status
    assert body == {"error": {"message": answer.message, "type": kind, "param": param,
                              "code": code}}
