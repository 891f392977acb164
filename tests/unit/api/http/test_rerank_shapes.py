"""The rerank routes' pure parts (api/http/rerank_shapes.py): Cohere's, Jina's and TEI's requests
parsed and refused field by field, scores as the float64 sigmoid of the logits, the order and
top_n, each API's answer and error shapes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from snoozeml.api.boundary import answer_for
from snoozeml.api.http.rerank_shapes import (
    BadField,
    NoDocuments,
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
from snoozeml.errors import BackendError, ModelNotFound, QueueFull, RequestTooLarge

# --- Cohere's and Jina's request ----------------------------------------------------------------


def test_a_cohere_request_with_strings_takes_every_field() -> None:
    request = parse_cohere({"model": "ms-marco", "query": "q", "documents": ["a", "b", "c"],
                            "top_n": 2, "return_documents": True, "max_tokens_per_doc": 512,
                            "max_chunks_per_doc": 4, "priority": 3}, 10)
    assert request == RerankRequest(
        model="ms-marco", query="q", texts=["a", "b", "c"],
        documents=[{"text": "a"}, {"text": "b"}, {"text": "c"}], top_n=2, return_documents=True,
        max_tokens=512)


def test_documents_as_objects_are_scored_by_their_text_and_come_back_whole() -> None:
    documents = [{"text": "a", "title": "A"}, "b"]
    request = parse_cohere({"query": "q", "documents": documents}, 10)
    assert request.texts == ["a", "b"]
    assert request.documents == [{"text": "a", "title": "A"}, {"text": "b"}]
    assert (request.model, request.top_n, request.return_documents) == (None, None, False)


def test_nulls_are_the_defaults() -> None:
    request = parse_cohere({"query": "q", "documents": ["a"], "model": None, "top_n": None,
                            "return_documents": None, "rank_fields": None,
                            "max_tokens_per_doc": None}, 10)
    assert (request.model, request.top_n, request.return_documents, request.max_tokens) == \
        (None, None, False, None)
    assert parse_cohere({"query": "q", "documents": ["a"], "rank_fields": ["text"]}, 1)


@pytest.mark.parametrize(("body", "param"), [
    ({"documents": ["a"]}, "query"),
    ({"query": "", "documents": ["a"]}, "query"),
    ({"query": 7, "documents": ["a"]}, "query"),
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": "a"}, "documents"),
    ({"query": "q", "documents": [1]}, "documents"),
    ({"query": "q", "documents": [{"title": "no text"}]}, "documents"),
    ({"query": "q", "documents": [{"text": 3}]}, "documents"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": 1.5}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": True}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
    ({"query": "q", "documents": ["a"], "model": ""}, "model"),
    ({"query": "q", "documents": ["a"], "model": ["m"]}, "model"),
    ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 2.5}, "max_tokens_per_doc"),
    ({"query": "q", "documents": ["a"], "max_chunks_per_doc": -1}, "max_chunks_per_doc"),
    ({"query": "q", "documents": ["a"], "rank_fields": ["title"]}, "rank_fields"),
])
def test_a_wrong_cohere_field_is_refused_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadField) as raised:
        parse_cohere(body, 10)
    assert raised.value.param == param
    assert not isinstance(raised.value, NoDocuments)


@pytest.mark.parametrize("body", [[], "query", None, 3])
def test_a_body_that_is_not_an_object_is_refused(body: object) -> None:
    with pytest.raises(BadField, match="JSON object"):
        parse_cohere(body, 10)
    with pytest.raises(BadField, match="JSON object"):
        parse_tei(body, 10)


def test_no_documents_and_too_many_are_refused_apart() -> None:
    with pytest.raises(NoDocuments, match="'documents' must not be empty"):
        parse_cohere({"query": "q", "documents": []}, 10)
    with pytest.raises(BadField, match="has 11 items; this server takes at most 10") as raised:
        parse_cohere({"query": "q", "documents": ["a"] * 11}, 10)
    assert not isinstance(raised.value, NoDocuments)
    assert parse_cohere({"query": "q", "documents": ["a"] * 10}, 10).texts == ["a"] * 10


# --- TEI's request ------------------------------------------------------------------------------


def test_a_tei_request_takes_every_field() -> None:
    request = parse_tei({"query": "q", "texts": ["a", "b"], "raw_scores": True,
                         "return_text": True, "truncate": True,
                         "truncation_direction": "Right", "model": "m"}, 10)
    assert request == RerankRequest(model="m", query="q", texts=["a", "b"],
                                    documents=["a", "b"], raw_scores=True,
                                    return_documents=True)
    plain = parse_tei({"query": "q", "texts": ["a"]}, 10)
    assert (plain.model, plain.raw_scores, plain.return_documents) == (None, False, False)


@pytest.mark.parametrize(("body", "param"), [
    ({"texts": ["a"]}, "query"),
    ({"query": "q"}, "texts"),
    ({"query": "q", "texts": [{"text": "a"}]}, "texts"),  # TEI takes strings only
    ({"query": "q", "texts": ["a"], "raw_scores": 1}, "raw_scores"),
    ({"query": "q", "texts": ["a"], "return_text": "true"}, "return_text"),
    ({"query": "q", "texts": ["a"], "truncate": "no"}, "truncate"),
    ({"query": "q", "texts": ["a"], "truncation_direction": "left"}, "truncation_direction"),
    ({"query": "q", "texts": ["a"] * 11}, "texts"),
])
def test_a_wrong_tei_field_is_refused_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadField) as raised:
        parse_tei(body, 10)
    assert raised.value.param == param


def test_empty_tei_texts_are_no_documents() -> None:
    with pytest.raises(NoDocuments, match="'texts' must not be empty"):
        parse_tei({"query": "q", "texts": []}, 10)


# --- scores and order ---------------------------------------------------------------------------


def test_relevance_is_the_float64_sigmoid_of_each_logit() -> None:
    logits = np.array([[0.0], [2.0], [-3.5], [40.0], [-800.0], [800.0]], dtype=np.float32)
    with np.errstate(over="ignore"):  # the naive formula: exp(800) is inf, and 1/inf is 0
        expected = 1.0 / (1.0 + np.exp(-logits.astype(np.float64).reshape(-1)))
    scores = relevance(logits)
    assert scores.dtype == np.float64
    np.testing.assert_allclose(scores, expected, rtol=1e-15, atol=0)
    # What CrossEncoder computes, in float32, agrees to the reference's tolerance.
    reference = torch.sigmoid(torch.from_numpy(logits[:4].reshape(-1))).numpy()
    np.testing.assert_allclose(scores[:4], reference, atol=1e-6)
    assert np.isfinite(scores).all()


def test_logits_that_float32_rounds_to_one_keep_their_order_in_float64() -> None:
    # A float16 model's large logits: float32's sigmoid says 1.0 for all three.
    logits = np.array([17.0, 19.0, 18.0], dtype=np.float16).astype(np.float32)
    assert (torch.sigmoid(torch.from_numpy(logits)).numpy() == 1.0).all()
    scores = relevance(logits)
    assert len(set(scores.tolist())) == 3
    assert scores.max() < 1.0
    assert ranked(scores, None) == [1, 2, 0]


def test_ranked_is_best_first_ties_in_document_order_and_top_n_cuts() -> None:
    scores = np.array([0.2, 0.9, 0.5, 0.9, 0.1])
    assert ranked(scores, None) == [1, 3, 2, 0, 4]
    assert ranked(scores, 2) == [1, 3]
    assert ranked(scores, 100) == [1, 3, 2, 0, 4]  # more than there are: every one
    assert ranked(np.array([-1.5, 3.0, -np.inf, np.inf]), None) == [3, 1, 0, 2]  # raw logits


def test_a_nan_score_is_the_models_fault_naming_the_documents() -> None:
    with pytest.raises(BackendError, match=r"documents \[1, 3\] NaN"):
        ranked(np.array([0.1, np.nan, 0.3, np.nan]), None)


# --- answers ------------------------------------------------------------------------------------


def test_cohere_answers_results_best_first_with_meta_and_jinas_usage() -> None:
    request = parse_cohere({"query": "q", "documents": ["a", {"text": "b", "id": 7}, "c"],
                            "return_documents": True}, 10)
    scores = np.array([0.25, 0.75, 0.5])
    answer = cohere_answer(request, "ms-marco", scores, ranked(scores, 2), 42, "id-1", "2")
    assert answer == {
        "id": "id-1",
        "results": [{"index": 1, "relevance_score": 0.75, "document": {"text": "b", "id": 7}},
                    {"index": 2, "relevance_score": 0.5, "document": {"text": "c"}}],
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
        "model": "ms-marco",
        "usage": {"total_tokens": 42},
    }
    bare = cohere_answer(parse_cohere({"query": "q", "documents": ["a"] * 250}, 1000),
                         "m", np.zeros(250), [0], 0, "id-2", "1")
    assert bare["results"] == [{"index": 0, "relevance_score": 0.0}]  # no document unasked
    assert bare["meta"]["billed_units"] == {"search_units": 3}  # 100 documents a unit
    uncounted = cohere_answer(request, "m", scores, [0], None, "id-3", "1")
    assert "usage" not in uncounted  # a model that does not count its tokens


def test_tei_answers_a_bare_array_with_text_when_asked() -> None:
    scores = np.array([-1.0, 2.5])
    with_text = parse_tei({"query": "q", "texts": ["a", "b"], "return_text": True}, 10)
    assert tei_answer(with_text, scores, [1, 0]) == [
        {"index": 1, "score": 2.5, "text": "b"}, {"index": 0, "score": -1.0, "text": "a"}]
    plain = parse_tei({"query": "q", "texts": ["a", "b"]}, 10)
    assert tei_answer(plain, scores, [1, 0]) == [{"index": 1, "score": 2.5},
                                                 {"index": 0, "score": -1.0}]


# --- errors -------------------------------------------------------------------------------------


def test_cohere_errors_carry_the_message_and_jinas_detail() -> None:
    answer = answer_for(BadField("'query' must be a non-empty string", "query"))
    assert answer.http_status == 400
    assert cohere_error_body(answer) == {"message": "'query' must be a non-empty string",
                                         "detail": "'query' must be a non-empty string"}


@pytest.mark.parametrize(("exc", "status", "kind"), [
    (BadField("'query' must be a non-empty string", "query"), 422, "Validation"),
    (BadField("'texts' has 11 items", "texts"), 422, "Validation"),
    (NoDocuments("'texts' must not be empty", "texts"), 400, "Empty"),
    (NotAReranker("model 'm' does not rerank"), 400, "Validation"),
    (ModelNotFound("model 'm' not found"), 404, "Validation"),
    (RequestTooLarge("request body is larger than 64 MiB"), 413, "Validation"),
    (QueueFull("the queue is full"), 503, "Overloaded"),
    (BackendError("the model raised"), 500, "Backend"),
])
def test_tei_errors_have_teis_status_and_kind(exc: Exception, status: int, kind: str) -> None:
    assert tei_error(exc, answer_for(exc)) == (status, {"error": str(exc), "error_type": kind})
