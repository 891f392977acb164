"""OpenAI-compatible embeddings: `POST /v1/embeddings`, `GET /v1/models` and `/v1/models/{name}`
(which list the rerankers too, api/http/rerank.py).

An embeddings request is Open Inference Protocol inference in another shape: its strings become
the model's BYTES `text` input (token ids, its `input_ids` and `attention_mask`), in pieces of
one batch's worth of rows (api/http/pieces.py), each submitted through `InferenceService.infer`
like any OIP request. So a cold model loads on the first call, the pieces of many calls (and OIP
requests for the same model) share batches, and the request counts in the same metrics and
status. The model answers each row's `embedding` and `token_count`; this module shortens them
to the requested `dimensions`, encodes them as floats or base64 and counts the usage.

Errors on these routes have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`,
with the statuses of the rest of the API (docs/embeddings.md).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response

from snoozeml.api.boundary import CALL, ErrorAnswer
from snoozeml.api.codec import parse_json
from snoozeml.api.http.body import read_body
from snoozeml.api.http.pieces import infer_pieces, piece_rows
from snoozeml.api.http.rerank import reranks
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.capabilities import TEXT, TOKEN_COUNT, Capabilities
from snoozeml.engine.requests.request import InferInput, InferRequest, RequestedOutput
from snoozeml.engine.service import InferenceService
from snoozeml.errors import InvalidInput, ModelNotFound
from snoozeml.operations import Operation

EMBEDDING = "embedding"
OPENAI_OPERATIONS = frozenset({Operation.EMBEDDINGS, Operation.OPENAI_MODELS})
OWNED_BY = "snoozeml"


class BadParam(InvalidInput):
    """A 400 that names the request field at fault (OpenAI's `param`)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class NotAnEmbeddingModel(ModelNotFound):
    """A model that exists but does not embed: a 404 on these routes, as OpenAI answers a
    model it does not serve."""


def error_body(exc: BaseException, answer: ErrorAnswer) -> dict[str, Any]:
    """OpenAI's error object for a failed call on these routes."""
    status = answer.http_status
    code: str | None = None
    param = getattr(exc, "param", None)
    if status == 401:
        kind, code = "authentication_error", "invalid_api_key"
    elif status == 403:
        kind = "permission_error"
    elif status == 404:
        kind, code, param = "invalid_request_error", "model_not_found", param or "model"
    elif status < 500 and status != 429:
        kind = "invalid_request_error"
    else:
        kind = "server_error"
    return {"error": {"message": answer.message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True, slots=True)
class Inputs:
    texts: list[str] | None  # strings, or
    ids: list[list[int]] | None  # token id lists

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.ids or [])


def parse_input(value: object, max_inputs: int) -> Inputs:
    """OpenAI's `input`: a string, a list of strings, a list of token ids, or a list of lists
    of token ids; never empty, never mixed."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise BadParam("'input' must be a non-empty string, a non-empty list of strings, a "
                       "list of token ids or a list of lists of token ids", "input")
    if len(value) > max_inputs:
        raise BadParam(f"'input' has {len(value)} items; this server takes at most "
                       f"{max_inputs} per request ([server] max_embedding_inputs)", "input")
    if all(isinstance(v, str) for v in value):
        for i, text in enumerate(value):
            if not text:
                raise BadParam(f"'input'[{i}] is an empty string", "input")
        return Inputs(texts=cast(list[str], value), ids=None)
    if all(_is_id(v) for v in value):
        return Inputs(texts=None, ids=[cast(list[int], value)])
    if all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            if not ids:
                raise BadParam(f"'input'[{i}] is an empty list of token ids", "input")
            if not all(_is_id(v) for v in ids):
                raise BadParam(f"'input'[{i}] must hold only non-negative integer token ids",
                               "input")
        return Inputs(texts=None, ids=cast(list[list[int]], value))
    raise BadParam("'input' mixes kinds: send strings, token ids, or lists of token ids, "
                   "one kind per request", "input")


def _is_id(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**63


def parse_dimensions(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise BadParam("'dimensions' must be a positive integer", "dimensions")
    return value


def parse_encoding(value: object) -> str:
    if value is None:
        return "float"
    if value not in ("float", "base64"):
        raise BadParam("'encoding_format' must be \"float\" or \"base64\"", "encoding_format")
    return str(value)


class Embeddings:
    """The handlers of the OpenAI routes, on one InferenceService."""

    def __init__(self, service: InferenceService, max_request_size: int, max_inputs: int) -> None:
        self.service = service
        self.max_request_size = max_request_size
        self.max_inputs = max_inputs

    # --- /v1/models -----------------------------------------------------------------------

    def _model_json(self, name: str, capabilities: list[str]) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(self.service.started_at),
                "owned_by": OWNED_BY, "capabilities": capabilities}

    def _uses(self, name: str) -> list[str]:
        """What the model does on the routes beside OIP's: "embeddings", "rerank"."""
        capabilities = self.service.capabilities(name)
        return [use for use, can in (("embeddings", capabilities.embeddings),
                                     ("rerank", reranks(capabilities))) if can]

    def _embedding_model(self, name: str) -> Capabilities:
        """What the model can do (the service reads it once per model); a 404 unless it
        embeds."""
        capabilities = self.service.capabilities(name)
        if not capabilities.embeddings:
            raise NotAnEmbeddingModel(
                f"model {name!r} does not produce embeddings: serve a feature-extraction model "
                "with tokenize = true (docs/embeddings.md)")
        return capabilities

    async def models(self, request: Request) -> Response:
        """The models that embed or rerank, each with what it does."""
        name = request.path_params.get("name")
        if name is not None:
            uses = self._uses(name)
            if not uses:
                raise NotAnEmbeddingModel(f"model {name!r} neither produces embeddings nor "
                                          "reranks (docs/embeddings.md, docs/rerankers.md)")
            return _json(self._model_json(name, uses))
        listed = ((name, self._uses(name)) for name in self.service.model_names())
        return _json({"object": "list",
                      "data": [self._model_json(name, uses) for name, uses in listed if uses]})

    # --- /v1/embeddings -------------------------------------------------------------------

    async def embeddings(self, request: Request) -> Response:
        body = await read_body(request.scope, request.receive, self.max_request_size)
        doc = parse_json(body)
        if not isinstance(doc, dict):
            raise InvalidInput("request body must be a JSON object")
        name = doc.get("model")
        if not isinstance(name, str) or not name:
            raise BadParam("'model' must be the name of a model this server serves", "model")
        request.scope[CALL].model = name  # for the request log and metrics
        inputs = parse_input(doc.get("input"), self.max_inputs)
        dimensions = parse_dimensions(doc.get("dimensions"))
        encoding = parse_encoding(doc.get("encoding_format"))
        capabilities = self._embedding_model(name)
        # Loaded first: a model whose settings cannot be worked out fails its load, and the
        # answer is that load error (503), not this request's fault.
        metadata = await self.service.model_metadata(name)
        settings = self.service.embedding_settings(name)
        width = _check_model(metadata, name, inputs)
        if width > 0:  # refused before the model runs when the metadata says the width
            _check_dimensions(dimensions, width, name, settings.matryoshka)
        rows = piece_rows(len(inputs), capabilities.max_batch_size)
        if inputs.texts is not None:
            pieces = [_text_request(inputs.texts[i:i + rows])
                      for i in range(0, len(inputs.texts), rows)]
        else:
            ids = _truncated(inputs.ids or [], settings.max_length, settings.truncate)
            token_types = any(spec.name == "token_type_ids" for spec in metadata.inputs)
            pieces = [_ids_request(ids[i:i + rows], token_types)
                      for i in range(0, len(ids), rows)]
        embeddings, counts = await self._run(name, pieces)
        if width <= 0:  # now the answer says it
            width = embeddings.shape[1]
            _check_dimensions(dimensions, width, name, settings.matryoshka)
        if dimensions is not None and dimensions < width:
            embeddings = embeddings[:, :dimensions]
            if settings.normalize:
                norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
                embeddings = embeddings / np.maximum(norms, 1e-12)
        tokens = int(counts.sum())
        return _json({
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": _encoded(row, encoding)}
                     for i, row in enumerate(embeddings)],
            "model": name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        })

    async def _run(self, name: str, pieces: Sequence[InferRequest]) -> tuple[np.ndarray,
                                                                               np.ndarray]:
        """Every piece through the model at once (they may share batches); in order."""
        embeddings: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        for response in await infer_pieces(self.service, name, pieces):
            outputs = {out.name: out.data for out in response.outputs}
            embeddings.append(np.asarray(outputs[EMBEDDING], dtype=np.float32))
            counts.append(np.asarray(outputs[TOKEN_COUNT], dtype=np.int64))
        return np.concatenate(embeddings), np.concatenate(counts)


def _check_dimensions(dimensions: int | None, width: int, name: str, matryoshka: bool) -> None:
    if dimensions is None or dimensions == width:
        return
    if dimensions > width:
        raise BadParam(f"'dimensions' is {dimensions}; model {name!r} makes embeddings of "
                       f"{width}", "dimensions")
    if not matryoshka:
        raise BadParam(f"model {name!r} does not support 'dimensions' (its embeddings have "
                       f"{width}); set matryoshka = true in its entry if it was trained for "
                       "shorter ones", "dimensions")


def _check_model(metadata: ModelMetadata, name: str, inputs: Inputs) -> int:
    """The model's embedding width (-1: its metadata does not say); a 400 when it cannot take
    these inputs."""
    outputs = {spec.name: spec for spec in metadata.outputs}
    takes = {spec.name for spec in metadata.inputs}
    if EMBEDDING not in outputs or TOKEN_COUNT not in outputs:
        raise NotAnEmbeddingModel(f"model {name!r} has no '{EMBEDDING}' output: it does not "
                                  "produce embeddings")
    wanted = TEXT if inputs.texts is not None else "input_ids"
    if wanted not in takes:
        raise BadParam(f"model {name!r} does not take "
                       f"{'text' if inputs.texts is not None else 'token ids'}", "input")
    return int(outputs[EMBEDDING].shape[-1])


def _text_request(texts: Sequence[str]) -> InferRequest:
    data = np.empty(len(texts), dtype=object)
    data[:] = texts
    return InferRequest([InferInput(TEXT, "BYTES", (len(texts),), data)], _OUTPUTS())


def _truncated(ids: list[list[int]], max_length: int, truncate: bool) -> list[list[int]]:
    for i, row in enumerate(ids):
        if len(row) > max_length and not truncate:
            raise BadParam(f"'input'[{i}] has {len(row)} tokens; the model takes at most "
                           f"{max_length} (truncate = false)", "input")
    return [row[:max_length] for row in ids]


def _ids_request(ids: Sequence[list[int]], token_types: bool) -> InferRequest:
    """Token ids padded to the longest row, with the mask saying which are real."""
    longest = max(len(row) for row in ids)
    matrix = np.zeros((len(ids), longest), dtype=np.int64)
    mask = np.zeros_like(matrix)
    for i, row in enumerate(ids):
        matrix[i, :len(row)] = row
        mask[i, :len(row)] = 1
    tensors = [InferInput("input_ids", "INT64", matrix.shape, matrix),
               InferInput("attention_mask", "INT64", mask.shape, mask)]
    if token_types:
        types = np.zeros_like(matrix)
        tensors.append(InferInput("token_type_ids", "INT64", types.shape, types))
    return InferRequest(tensors, _OUTPUTS())


def _OUTPUTS() -> list[RequestedOutput]:  # a fresh list for each request
    return [RequestedOutput(EMBEDDING), RequestedOutput(TOKEN_COUNT)]


def _encoded(row: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode("ascii")
    return row  # orjson writes a float32 array as its shortest round-tripping decimals


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
                    media_type="application/json")


def error_response(exc: BaseException, answer: ErrorAnswer) -> Response:
    return Response(orjson.dumps(error_body(exc, answer)), status_code=answer.http_status,
                    media_type="application/json", headers=answer.http_headers())
