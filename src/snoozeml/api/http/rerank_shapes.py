"""The rerank routes' requests, scores, answers and errors, as each API writes them (pure: no
model, no web framework; api/http/rerank.py runs them).

- Cohere's `POST /v1/rerank` and `/v2/rerank` (Jina's `/v1/rerank` is the same shape):
  `model`, `query`, `documents` (strings, or objects with a `text`), `top_n`,
  `return_documents`, `max_tokens_per_doc` (each document cut to its first tokens, as the
  model's `text_pair` parameter `max_tokens` cuts it), `max_chunks_per_doc` (checked, not
  used: a document is never split into chunks); answered with `id`, `results` (`index`,
  `relevance_score`, and `document` when asked) best first, `meta`, and Jina's `model` and
  `usage`. Errors are `{"message": ...}`, with Jina's `detail` beside it (Jina's clients read it).
- Text Embeddings Inference's `POST /rerank`: `query`, `texts`, `raw_scores`, `return_text`,
  `truncate`, `truncation_direction`; answered with a bare array of `index`, `score` and
  `text` when asked, best first. Errors are `{"error": ..., "error_type": ...}`, 422 for a
  request that does not validate, 400 for an empty `texts`, as TEI answers.

Scores are the sigmoid of each document's one logit, computed in float64 (what CrossEncoder,
TEI and Cohere return; a float16 model's logits never round to a tie at 1.0), or the logits
themselves with TEI's `raw_scores`. Ties keep the documents' order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from snoozeml.api.boundary import ErrorAnswer
from snoozeml.errors import BackendError, InvalidInput, QueueFull

# How many documents make one of Cohere's search units (its meta.billed_units).
DOCUMENTS_PER_SEARCH_UNIT = 100


class BadField(InvalidInput):
    """A request field of the wrong type or value: a 400 (TEI: 422), naming the field."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class NoDocuments(BadField):
    """An empty list of documents: a 400 on every route (TEI's `Empty`)."""


class NotAReranker(InvalidInput):
    """A model that exists but does not rerank (or has more than one label): a 400."""


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """A rerank request, whichever API's shape it came in."""

    model: str | None  # None: the daemon's one reranker
    query: str
    texts: list[str]  # what is scored, one per document
    documents: list[Any]  # as sent (Cohere's objects keep their fields), one per text
    top_n: int | None = None  # None: every document
    return_documents: bool = False
    raw_scores: bool = False  # TEI: the logits, not their sigmoid
    max_tokens: int | None = None  # Cohere's max_tokens_per_doc; None: the whole document


# --- parsing ------------------------------------------------------------------------------


def parse_cohere(doc: object, max_documents: int) -> RerankRequest:
    """Cohere's (and Jina's) request; BadField naming the field at fault."""
    body = _object(doc)
    texts, documents = _documents(body.get("documents"), "documents", max_documents)
    rank_fields = body.get("rank_fields")
    if rank_fields is not None and rank_fields != ["text"]:
        raise BadField("'rank_fields' other than [\"text\"] is not supported: each document "
                       "is ranked by its 'text'", "rank_fields")
    _positive(body.get("max_chunks_per_doc"), "max_chunks_per_doc")  # checked, not used
    return RerankRequest(
        model=_model(body.get("model")), query=_query(body.get("query")), texts=texts,
        documents=documents, top_n=_positive(body.get("top_n"), "top_n"),
        return_documents=_flag(body.get("return_documents"), "return_documents"),
        max_tokens=_positive(body.get("max_tokens_per_doc"), "max_tokens_per_doc"))


def parse_tei(doc: object, max_documents: int) -> RerankRequest:
    """Text Embeddings Inference's request (with SnoozeML's `model`); BadField naming the
    field at fault."""
    body = _object(doc)
    texts = body.get("texts")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadField("'texts' must be a list of strings", "texts")
    _check_count(len(texts), "texts", max_documents)
    _flag(body.get("truncate"), "truncate")  # the model's entry decides (truncate, max_length)
    direction = body.get("truncation_direction")
    if direction not in (None, "right", "Right"):
        raise BadField("'truncation_direction' must be \"right\": texts are cut at their end",
                       "truncation_direction")
    return RerankRequest(
        model=_model(body.get("model")), query=_query(body.get("query")), texts=texts,
        documents=list(texts), raw_scores=_flag(body.get("raw_scores"), "raw_scores"),
        return_documents=_flag(body.get("return_text"), "return_text"))


def _object(doc: object) -> Mapping[str, Any]:
    if not isinstance(doc, dict):
        raise BadField("request body must be a JSON object", None)
    return doc


def _model(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadField("'model' must be the name of a model this server serves", "model")
    return value


def _query(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise BadField("'query' must be a non-empty string", "query")
    return value


def _documents(value: object, field: str,
               max_documents: int) -> tuple[list[str], list[Any]]:
    """Strings, or objects with a string `text` (Cohere's and Jina's documents)."""
    if not isinstance(value, list):
        raise BadField(f"'{field}' must be a list of strings or of objects with a 'text'",
                       field)
    _check_count(len(value), field, max_documents)
    texts: list[str] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            texts.append(item["text"])
        else:
            raise BadField(f"'{field}'[{i}] must be a string or an object with a string "
                           "'text'", field)
    documents = [item if isinstance(item, dict) else {"text": item} for item in value]
    return texts, documents


def _check_count(count: int, field: str, max_documents: int) -> None:
    if count == 0:
        raise NoDocuments(f"'{field}' must not be empty", field)
    if count > max_documents:
        raise BadField(f"'{field}' has {count} items; this server takes at most "
                       f"{max_documents} per request ([server] max_rerank_documents)", field)


def _positive(value: object, field: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise BadField(f"'{field}' must be a positive integer", field)
    return value


def _flag(value: object, field: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadField(f"'{field}' must be true or false", field)
    return value


# --- scores and order -----------------------------------------------------------------------


def relevance(logits: np.ndarray) -> np.ndarray:
    """Each document's relevance in [0, 1]: the sigmoid of its one logit, in float64."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    # exp of a negative number only: never overflows, and 1.0 only for logits past ~37.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def ranked(scores: np.ndarray, top_n: int | None) -> list[int]:
    """The documents' indices, best score first (equal scores in the documents' order), the
    first `top_n` (None: all). A NaN score is the model's fault: a 500 naming the documents."""
    nan = np.flatnonzero(np.isnan(scores))
    if nan.size:
        raise BackendError(f"the model scored documents {nan[:10].tolist()} NaN")
    order = np.argsort(-scores, kind="stable")[:top_n]  # top_n None: every one
    return [int(index) for index in order]


# --- answers --------------------------------------------------------------------------------


def cohere_answer(request: RerankRequest, name: str, scores: np.ndarray, order: Sequence[int],
                  tokens: int | None, answer_id: str, api_version: str) -> dict[str, Any]:
    """Cohere's answer (`api_version` "1" or "2"), with Jina's `model` and `usage` (the
    pairs' tokens; left out when the model does not count them)."""
    results = []
    for index in order:
        result: dict[str, Any] = {"index": index, "relevance_score": float(scores[index])}
        if request.return_documents:
            result["document"] = request.documents[index]
        results.append(result)
    units = math.ceil(len(request.texts) / DOCUMENTS_PER_SEARCH_UNIT)
    answer = {
        "id": answer_id,
        "results": results,
        "meta": {"api_version": {"version": api_version},
                 "billed_units": {"search_units": units}},
        "model": name,
    }
    if tokens is not None:
        answer["usage"] = {"total_tokens": tokens}
    return answer


def tei_answer(request: RerankRequest, scores: np.ndarray,
               order: Sequence[int]) -> list[dict[str, Any]]:
    """Text Embeddings Inference's answer: the ranks, best first."""
    ranks = []
    for index in order:
        rank: dict[str, Any] = {"index": index, "score": float(scores[index])}
        if request.return_documents:
            rank["text"] = request.texts[index]
        ranks.append(rank)
    return ranks


# --- errors ---------------------------------------------------------------------------------


def cohere_error_body(answer: ErrorAnswer) -> dict[str, Any]:
    """Cohere's error object; `detail` is Jina's (its clients raise with it)."""
    return {"message": answer.message, "detail": answer.message}


def tei_error(exc: BaseException, answer: ErrorAnswer) -> tuple[int, dict[str, Any]]:
    """TEI's status and error object for a failure. A request that does not validate is a 422
    there; an empty `texts` stays a 400 (`Empty`), as do a body that is not JSON and a model
    that does not rerank; every other answer keeps its status."""
    status = answer.http_status
    if isinstance(exc, NoDocuments):
        kind = "Empty"
    elif isinstance(exc, BadField):
        status, kind = 422, "Validation"
    elif isinstance(exc, QueueFull):
        kind = "Overloaded"
    elif status == 503:
        kind = "Unhealthy"
    elif status >= 500:
        kind = "Backend"
    else:
        kind = "Validation"
    return status, {"error": answer.message, "error_type": kind}
