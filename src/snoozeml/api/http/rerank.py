"""The rerank routes: Cohere's `POST /v1/rerank` and `/v2/rerank` (Jina's shape too), and Text
Embeddings Inference's `POST /rerank`, on a cross-encoder the daemon serves.

A rerank request is Open Inference Protocol inference in another shape: each document is one
row of the model's BYTES `text` (the query) and `text_pair` (the document) inputs, in pieces of
one batch's worth of rows (api/http/pieces.py) through `InferenceService.infer`. So a cold
model loads on the first call, the documents of many calls (and OIP requests for the same
model) share batches, a request of more documents than `max_batch_size` is split rather than
refused, and the request counts in the same metrics, statistics and status. The model answers
each row's `logits` (one label: the relevance logit); this module turns them into scores and
the order, and writes each API's answer (api/http/rerank_shapes.py). Cohere's
`max_tokens_per_doc` goes as `text_pair`'s OIP parameter `max_tokens`: the model cuts each
document to its first tokens before queueing (runtime/text/pairs.py).

Which models rerank it asks the service (`capabilities`); the loaded model's metadata has the
last word. Errors come in each API's own shape (docs/rerankers.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response

from snoozeml.api.boundary import CALL, ErrorAnswer
from snoozeml.api.codec import parse_json
from snoozeml.api.http.body import read_body
from snoozeml.api.http.pieces import infer_pieces, piece_rows
from snoozeml.api.http.rerank_shapes import (
    BadField,
    NotAReranker,
    RerankRequest,
    cohere_answer,
    cohere_error_body,
    parse_cohere,
    parse_tei,
    ranked,
    relevance,
    tei_answer,
    tei_error,
)
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.capabilities import (
    MAX_TOKENS,
    TEXT,
    TEXT_PAIR,
    TOKEN_COUNT,
    Capabilities,
)
from snoozeml.engine.requests.request import InferInput, InferRequest, RequestedOutput
from snoozeml.engine.service import InferenceService
from snoozeml.errors import ModelNotFound
from snoozeml.operations import Operation

LOGITS = "logits"
COHERE_OPERATIONS = frozenset({Operation.RERANK})
TEI_OPERATIONS = frozenset({Operation.TEI_RERANK})
HOW_TO = "serve a sequence-classification model (a cross-encoder) with tokenize = true " \
         "(docs/rerankers.md)"


def reranks(capabilities: Capabilities) -> bool:
    """Whether a model is one the rerank routes take: it scores text pairs with one label
    (or its labels are not known before it loads)."""
    return capabilities.reranks and capabilities.num_labels in (None, 1)


class Reranking:
    """The handlers of the rerank routes, on one InferenceService."""

    def __init__(self, service: InferenceService, max_request_size: int,
                 max_documents: int) -> None:
        self.service = service
        self.max_request_size = max_request_size
        self.max_documents = max_documents

    async def cohere(self, request: Request) -> Response:
        """`POST /v1/rerank` and `/v2/rerank`: Cohere's answer, with Jina's `usage`."""
        rerank = parse_cohere(await self._json(request), self.max_documents)
        name, logits, tokens = await self._logits(request, rerank)
        scores = relevance(logits)
        version = "2" if request.scope["path"].startswith("/v2/") else "1"
        return _json(cohere_answer(rerank, name, scores, ranked(scores, rerank.top_n), tokens,
                                   str(uuid.uuid4()), version))

    async def tei(self, request: Request) -> Response:
        """`POST /rerank`: TEI's bare array of ranks (logits with `raw_scores`)."""
        rerank = parse_tei(await self._json(request), self.max_documents)
        _, logits, _ = await self._logits(request, rerank)
        scores = np.asarray(logits, dtype=np.float64) if rerank.raw_scores \
            else relevance(logits)
        return _json(tei_answer(rerank, scores, ranked(scores, None)))

    async def _json(self, request: Request) -> object:
        return parse_json(await read_body(request.scope, request.receive,
                                          self.max_request_size))

    def _reranker(self, name: str | None) -> str:
        """The model the request names (ModelNotFound; NotAReranker), or the daemon's one
        reranker when it names none."""
        if name is not None:
            capabilities = self.service.capabilities(name)
            if not capabilities.reranks:
                raise NotAReranker(f"model {name!r} does not rerank: {HOW_TO}")
            if not reranks(capabilities):
                raise _labelled(name, capabilities.num_labels)
            return name
        found = [model for model in self.service.model_names()
                 if reranks(self.service.capabilities(model))]
        if len(found) == 1:
            return found[0]
        if not found:
            raise ModelNotFound(f"no model on this server reranks: {HOW_TO}")
        raise BadField(f"name the model ('model'): this server has {len(found)} rerankers, "
                       f"{', '.join(repr(model) for model in found)}", "model")

    async def _logits(self, request: Request,
                      rerank: RerankRequest) -> tuple[str, np.ndarray, int | None]:
        """The model's name, each document's logit (in order) and the tokens the pairs
        took (None when the model does not count them: no `token_count` output)."""
        if rerank.model is not None:
            request.scope[CALL].model = rerank.model  # for the request log and metrics
        name = self._reranker(rerank.model)
        request.scope[CALL].model = name
        capabilities = self.service.capabilities(name)
        # Loaded first: its metadata says whether it takes pairs and how many labels it has.
        counts = _check_model(await self.service.model_metadata(name), name)
        rows = piece_rows(len(rerank.texts), capabilities.max_batch_size)
        pieces = [_pair_request(rerank.query, rerank.texts[i:i + rows], counts,
                                rerank.max_tokens)
                  for i in range(0, len(rerank.texts), rows)]
        logits: list[np.ndarray] = []
        tokens = 0 if counts else None
        for response in await infer_pieces(self.service, name, pieces):
            outputs = {out.name: out.data for out in response.outputs}
            logits.append(np.asarray(outputs[LOGITS]))
            if tokens is not None:
                tokens += int(np.asarray(outputs[TOKEN_COUNT], dtype=np.int64).sum())
        every = np.concatenate(logits)
        width = every.shape[-1] if every.ndim == 2 else 1
        if every.ndim > 2 or width != 1:
            raise _labelled(name, width)
        return name, every.reshape(-1), tokens


def _labelled(name: str, labels: int | None) -> NotAReranker:
    return NotAReranker(f"model {name!r} has {labels} labels; the rerank routes take a model "
                        "with one (a cross-encoder's relevance logit)")


def _check_model(metadata: ModelMetadata, name: str) -> bool:
    """Whether the loaded model counts tokens; NotAReranker when it does not take text pairs
    or answers more than one logit a row."""
    takes = {spec.name for spec in metadata.inputs}
    outputs = {spec.name: spec for spec in metadata.outputs}
    if TEXT not in takes or TEXT_PAIR not in takes or LOGITS not in outputs:
        raise NotAReranker(f"model {name!r} does not take text pairs ('{TEXT}' and "
                           f"'{TEXT_PAIR}') or has no '{LOGITS}' output: {HOW_TO}")
    shape = outputs[LOGITS].shape
    if len(shape) == 2 and shape[-1] > 1:
        raise _labelled(name, shape[-1])
    return TOKEN_COUNT in outputs


def _pair_request(query: str, texts: Sequence[str], counts: bool,
                  max_tokens: int | None = None) -> InferRequest:
    """One piece: the query beside each of its documents (each cut to its first `max_tokens`
    tokens when given)."""
    queries = np.full(len(texts), query, dtype=object)
    documents = np.empty(len(texts), dtype=object)
    documents[:] = texts
    outputs = [RequestedOutput(LOGITS)] + ([RequestedOutput(TOKEN_COUNT)] if counts else [])
    cap = {} if max_tokens is None else {MAX_TOKENS: max_tokens}
    return InferRequest([InferInput(TEXT, "BYTES", (len(texts),), queries),
                         InferInput(TEXT_PAIR, "BYTES", (len(texts),), documents, cap)],
                        outputs)


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def cohere_error_response(exc: BaseException, answer: ErrorAnswer) -> Response:
    return Response(orjson.dumps(cohere_error_body(answer)), status_code=answer.http_status,
                    media_type="application/json", headers=answer.http_headers())


def tei_error_response(exc: BaseException, answer: ErrorAnswer) -> Response:
    status, body = tei_error(exc, answer)
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers=answer.http_headers())
