"""The rerank routes on the real daemon: Cohere's `/v1/rerank` and `/v2/rerank` through the
`cohere` SDK's Client and ClientV2, Jina's and TEI's shapes over httpx, all on a small real
cross-encoder (tests/support/cross_encoder_models.py) and held to sentence-transformers'
`CrossEncoder(folder).predict` in this process; the documents through the model's batching
queue; every refusal in its API's own shape, and bad input that never takes the daemon down.
`max_tokens_per_doc` is held to CrossEncoder on each document cut at the end of its first
tokens, by the Hugging Face tokenizer's own offsets."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
import torch
import transformers
from cross_encoder_models import build_cross_encoder, save_cross_encoder
from daemon import Daemon
from oip_http import status_of
from sentence_transformers import CrossEncoder
from torch_models import MINILM

INFER_KEY = "snz_rerank-inference"
READ_KEY = "snz_rerank-readonly"
ADMIN_KEY = "snz_rerank-admin"
MAX_BATCH = 4

QUERY = "How do cats spend their day?"
DOCUMENTS = [
    "Cats sleep for twelve to sixteen hours a day, mostly in short naps.",
    "The stock market closed higher on Friday after a volatile week.",
    "A kitten plays with a ball of yarn before curling up to sleep.",
    "Photosynthesis turns light into chemical energy in plants.",
    "Domestic cats groom themselves for a large part of their waking hours.",
    "The train to Lyon leaves at nine from platform four.",
    "Ein Hund läuft durch den Park und jagt einen Ball.",
    "Long " + "and winding " * 300 + "road.",  # past the 512 tokens a pair may have
]

CONFIG = """
[server]
max_request_size = "8MiB"

[auth]
api_keys = [
  {{ name = "app", role = "inference", sha256 = "{infer}" }},
  {{ name = "dashboard", role = "readonly", sha256 = "{read}" }},
  {{ name = "operator", role = "admin", sha256 = "{admin}" }},
]

[[models]]
name = "reranker"
path = "reranker"
tokenize = true
[models.batching]
max_batch_size = {max_batch}
max_delay = "20ms"

[[models]]
name = "nli"
path = "nli"
tokenize = true

[[models]]
name = "minilm"
path = "{minilm}"
tokenize = true
"""


@dataclass
class Served:
    daemon: Daemon
    folder: Path
    http: httpx.Client
    reference: CrossEncoder

    def scores(self, documents: Sequence[str], query: str = QUERY,
               raw: bool = False) -> np.ndarray:
        """CrossEncoder's own scores: sigmoids, or (`raw`) the logits."""
        activation = torch.nn.Identity() if raw else None
        return np.asarray(self.reference.predict([(query, d) for d in documents],
                                                 activation_fn=activation))

    def client(self, cls: Any = cohere.Client, key: str = INFER_KEY) -> Any:
        return cls(api_key=key, base_url=self.daemon.url, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def served(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("rerank")
    save_cross_encoder(folder / "reranker", build_cross_encoder())
    torch.manual_seed(1)
    save_cross_encoder(folder / "nli", transformers.BertForSequenceClassification
                       .from_pretrained(str(MINILM), num_labels=3, local_files_only=True))
    digest = {name: hashlib.sha256(key.encode()).hexdigest()
              for name, key in (("infer", INFER_KEY), ("read", READ_KEY), ("admin", ADMIN_KEY))}
    daemon = module_serve(CONFIG.format(minilm=MINILM, max_batch=MAX_BATCH, **digest),
                          directory=folder)
    reference = CrossEncoder(str(folder / "reranker"), device="cpu")
    with httpx.Client(base_url=daemon.url, timeout=120,
                      headers={"Authorization": f"Bearer {INFER_KEY}"}) as http:
        yield Served(daemon, folder, http, reference)


def best_first(scores: np.ndarray) -> list[int]:
    return [int(i) for i in np.argsort(-scores, kind="stable")]


# --- the clients, against CrossEncoder ----------------------------------------------------------


def test_cohere_client_v1_ranks_as_cross_encoder_scores(served: Served) -> None:
    expected = served.scores(DOCUMENTS)

    answer = served.client().rerank(model="reranker", query=QUERY, documents=DOCUMENTS,
                                    return_documents=True)

    assert [r.index for r in answer.results] == best_first(expected)
    np.testing.assert_allclose([r.relevance_score for r in answer.results],
                               expected[best_first(expected)], atol=1e-5)
    assert [r.document.text for r in answer.results] == \
        [DOCUMENTS[i] for i in best_first(expected)]
    assert answer.meta.api_version.version == "1"
    assert answer.id


def test_cohere_client_v2_takes_top_n(served: Served) -> None:
    expected = served.scores(DOCUMENTS)

    answer = served.client(cohere.ClientV2).rerank(model="reranker", query=QUERY,
                                                   documents=DOCUMENTS, top_n=3)

    assert [r.index for r in answer.results] == best_first(expected)[:3]
    np.testing.assert_allclose([r.relevance_score for r in answer.results],
                               np.sort(expected)[::-1][:3], atol=1e-5)
    assert answer.meta.api_version.version == "2"


def test_jinas_shape_takes_objects_and_answers_documents_and_the_model(served: Served) -> None:
    body = {"model": "reranker", "query": QUERY, "top_n": 2, "return_documents": True,
            "documents": [{"text": d} for d in DOCUMENTS[:4]]}

    answer = served.http.post("/v1/rerank", json=body).json()

    expected = served.scores(DOCUMENTS[:4])
    top = best_first(expected)[:2]
    assert [(r["index"], r["document"]) for r in answer["results"]] == \
        [(i, {"text": DOCUMENTS[i]}) for i in top]
    assert answer["model"] == "reranker"
    # Jina's usage: the tokens of every pair the model ran, special tokens included.
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(MINILM))
    pairs = tokenizer([QUERY] * 4, DOCUMENTS[:4], truncation="longest_first", max_length=512)
    assert answer["usage"] == {"total_tokens": sum(len(ids) for ids in pairs["input_ids"])}


def test_teis_shape_implies_the_one_reranker_and_answers_raw_logits(served: Served) -> None:
    documents = DOCUMENTS[:5]

    scores = served.http.post("/rerank", json={"query": QUERY, "texts": documents}).json()
    raw = served.http.post("/rerank", json={"query": QUERY, "texts": documents,
                                            "raw_scores": True, "return_text": True}).json()

    expected, logits = served.scores(documents), served.scores(documents, raw=True)
    assert [r["index"] for r in scores] == best_first(expected)
    assert [set(r) for r in scores] == [{"index", "score"}] * 5
    np.testing.assert_allclose([r["score"] for r in scores], np.sort(expected)[::-1],
                               atol=1e-5)
    np.testing.assert_allclose([r["score"] for r in raw], np.sort(logits)[::-1], atol=1e-4)
    assert [r["text"] for r in raw] == [documents[r["index"]] for r in raw]


# --- max_tokens_per_doc -----------------------------------------------------------------------

CAP = 8  # fewer tokens than most DOCUMENTS have


def first_tokens(text: str, count: int) -> str:
    """The text up to the end of its `count`-th token, by the Hugging Face tokenizer's offsets."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(MINILM))
    offsets = tokenizer(text, add_special_tokens=False,
                        return_offsets_mapping=True)["offset_mapping"]
    return text if len(offsets) <= count else text[:offsets[count - 1][1]]


def test_max_tokens_per_doc_scores_each_document_by_its_first_tokens(served: Served) -> None:
    cut = [first_tokens(d, CAP) for d in DOCUMENTS]

    answer = served.client(cohere.ClientV2).rerank(model="reranker", query=QUERY,
                                                   documents=DOCUMENTS, max_tokens_per_doc=CAP)

    by_index = {r.index: r.relevance_score for r in answer.results}
    got = np.array([by_index[i] for i in range(len(DOCUMENTS))])
    np.testing.assert_allclose(got, served.scores(cut), atol=1e-5)
    longer = [i for i, d in enumerate(DOCUMENTS) if cut[i] != d]
    assert len(longer) >= 6
    assert np.all(np.abs(got[longer] - served.scores(DOCUMENTS)[longer]) > 1e-4)


def test_max_tokens_per_doc_counts_the_tokens_of_the_cut_pairs(served: Served) -> None:
    body = {"model": "reranker", "query": QUERY, "documents": DOCUMENTS[:4],
            "max_tokens_per_doc": CAP}

    answer = served.http.post("/v2/rerank", json=body).json()

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(MINILM))
    pairs = tokenizer([QUERY] * 4, [first_tokens(d, CAP) for d in DOCUMENTS[:4]])
    assert answer["usage"] == {"total_tokens": sum(len(ids) for ids in pairs["input_ids"])}


def test_max_tokens_per_doc_past_every_document_changes_nothing(served: Served) -> None:
    # Cohere's default, 4096: more tokens than the longest document, which max_length cuts.
    answer = served.http.post("/v1/rerank", json={"model": "reranker", "query": QUERY,
                                                  "documents": DOCUMENTS,
                                                  "max_tokens_per_doc": 4096}).json()

    by_index = {r["index"]: r["relevance_score"] for r in answer["results"]}
    np.testing.assert_allclose([by_index[i] for i in range(len(DOCUMENTS))],
                               served.scores(DOCUMENTS), atol=1e-5)


def test_a_huge_document_under_max_tokens_per_doc_answers_on_its_first_tokens(
    served: Served,
) -> None:
    huge = "The committee reviewed every proposal in detail. " * 140_000  # 7 MB
    body = {"model": "reranker", "query": QUERY, "documents": [huge, DOCUMENTS[0]],
            "max_tokens_per_doc": 16}

    response = served.http.post("/v2/rerank", json=body)

    assert response.status_code == 200, response.text
    by_index = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
    np.testing.assert_allclose([by_index[0], by_index[1]], served.scores(
        [first_tokens(huge[:2000], 16), first_tokens(DOCUMENTS[0], 16)]), atol=1e-5)


# --- one batching queue -----------------------------------------------------------------------


def test_more_documents_than_a_batch_are_split_and_come_back_in_order(served: Served) -> None:
    documents = [f"{DOCUMENTS[i % 7]} ({i})" for i in range(3 * MAX_BATCH + 1)]
    before = status_of(served.http, "reranker")["batching"]

    answer = served.http.post("/v1/rerank", json={"model": "reranker", "query": QUERY,
                                                  "documents": documents}).json()

    after = status_of(served.http, "reranker")["batching"]
    assert after["requests"] - before["requests"] == 4  # pieces of one batch's worth
    assert after["largest_batch"] <= MAX_BATCH
    by_index = {r["index"]: r["relevance_score"] for r in answer["results"]}
    np.testing.assert_allclose([by_index[i] for i in range(len(documents))],
                               served.scores(documents), atol=1e-5)


def test_documents_of_concurrent_requests_share_batches(served: Served) -> None:
    before = status_of(served.http, "reranker")["batching"]

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=served.daemon.url, timeout=120,
                                     headers={"Authorization": f"Bearer {INFER_KEY}"}) as http:
            return list(await asyncio.gather(*(
                http.post("/rerank", json={"model": "reranker", "query": QUERY, "texts": [d]})
                for d in DOCUMENTS[:6])))

    answers = asyncio.run(run())

    after = status_of(served.http, "reranker")["batching"]
    assert after["requests"] - before["requests"] == 6
    assert after["batches"] - before["batches"] < 6
    np.testing.assert_allclose([a.json()[0]["score"] for a in answers],
                               served.scores(DOCUMENTS[:6]), atol=1e-5)


def test_a_cold_reranker_loads_on_its_first_request(served: Served) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert served.http.post("/v2/repository/models/reranker/unload",
                            headers=admin).status_code == 200
    before = status_of(served.http, "reranker")
    assert before["state"] == "UNLOADED"

    answer = served.http.post("/v2/rerank", json={"model": "reranker", "query": QUERY,
                                                  "documents": DOCUMENTS[:2]})

    assert answer.status_code == 200, answer.text
    after = status_of(served.http, "reranker")
    assert (after["state"], after["loads"]) == ("READY", before["loads"] + 1)


def test_rerank_calls_are_counted_under_their_operation_and_model(served: Served) -> None:
    served.http.post("/rerank", json={"query": QUERY, "texts": ["count me"]})

    metrics = served.http.get("/metrics").text

    assert any(line.startswith("snooze_requests_total{") and 'operation="tei_rerank"' in line
               and 'model="reranker"' in line and 'code="200"' in line
               for line in metrics.splitlines())


def test_v1_models_says_what_each_model_does(served: Served) -> None:
    listed = served.http.get("/v1/models").json()["data"]

    assert [(m["id"], m["capabilities"]) for m in listed] == [
        ("reranker", ["rerank"]), ("minilm", ["embeddings"])]
    assert served.http.get("/v1/models/reranker").json()["capabilities"] == ["rerank"]
    assert served.http.get("/v1/models/nli").status_code == 404  # three labels: neither


# --- refusals, in each API's shape ------------------------------------------------------------


def test_the_cohere_client_raises_with_the_servers_message(served: Served) -> None:
    client = served.client()
    with pytest.raises(cohere.NotFoundError) as unknown:
        client.rerank(model="nope", query=QUERY, documents=["a"])
    with pytest.raises(cohere.BadRequestError) as embedder:
        client.rerank(model="minilm", query=QUERY, documents=["a"])
    with pytest.raises(cohere.BadRequestError) as labels:
        served.client(cohere.ClientV2).rerank(model="nli", query=QUERY, documents=["a"])
    with pytest.raises(cohere.UnauthorizedError):
        served.client(key="snz_wrong").rerank(model="reranker", query=QUERY, documents=["a"])
    with pytest.raises(cohere.ForbiddenError):
        served.client(key=READ_KEY).rerank(model="reranker", query=QUERY, documents=["a"])

    assert "model 'nope'" in unknown.value.body["message"]
    assert "does not rerank" in embedder.value.body["message"]
    assert "has 3 labels" in labels.value.body["detail"]  # Jina's clients read `detail`


@pytest.mark.parametrize(("body", "says"), [
    ({"model": "reranker", "query": QUERY, "documents": []}, "must not be empty"),
    ({"model": "reranker", "query": QUERY, "documents": ["a"], "top_n": 0}, "'top_n'"),
    ({"model": "reranker", "documents": ["a"]}, "'query'"),
    ({"model": "reranker", "query": QUERY, "documents": [{"title": "a"}]}, "'documents'[0]"),
    ({"model": "reranker", "query": QUERY, "documents": ["a"] * 10_000}, "at most 1000"),
])
def test_a_bad_cohere_request_is_a_400_saying_why(served: Served, body: dict[str, Any],
                                                    says: str) -> None:
    response = served.http.post("/v1/rerank", json=body)

    assert response.status_code == 400
    assert says in response.json()["message"]


@pytest.mark.parametrize(("body", "status", "kind"), [
    ({"query": QUERY, "texts": []}, 400, "Empty"),
    ({"texts": ["a"]}, 422, "Validation"),
    ({"query": QUERY, "texts": "a"}, 422, "Validation"),
    ({"query": QUERY, "texts": ["a"] * 10_000}, 422, "Validation"),
    ({"query": QUERY, "texts": ["a"], "model": "minilm"}, 400, "Validation"),
    ({"query": QUERY, "texts": ["a"], "model": "nope"}, 404, "Validation"),
])
def test_a_bad_tei_request_has_teis_status_and_error_type(
    served: Served, body: dict[str, Any], status: int, kind: str,
) -> None:
    response = served.http.post("/rerank", json=body)

    assert response.status_code == status
    assert response.json()["error_type"] == kind
    assert response.json()["error"]


def test_bad_bytes_and_huge_bodies_are_4xx_and_the_daemon_keeps_serving(served: Served) -> None:
    not_utf8 = b'{"model": "reranker", "query": "q", "documents": ["\xff\xfe"]}'
    lone_surrogate = b'{"model": "reranker", "query": "q", "documents": ["\\ud800"]}'
    huge = {"model": "reranker", "query": QUERY, "documents": ["word " * 2_000_000]}  # 10 MB
    for path in ("/v1/rerank", "/rerank"):
        for content in (not_utf8, lone_surrogate):
            response = served.http.post(path, content=content,
                                        headers={"Content-Type": "application/json"})
            assert response.status_code == 400, response.text
        too_large = served.http.post(path, json=huge)
        assert too_large.status_code == 413
    assert "exceeds the limit" in served.http.post("/v1/rerank", json=huge).json()["message"]

    long_document = "word " * 400_000  # 2 MB: scored on its first tokens, quickly
    answer = served.http.post("/v1/rerank", json={"model": "reranker", "query": QUERY,
                                                  "documents": [long_document, DOCUMENTS[0]]})
    assert answer.status_code == 200, answer.text
    by_index = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
    np.testing.assert_allclose([by_index[0], by_index[1]],
                               served.scores([long_document, DOCUMENTS[0]]), atol=1e-5)


def test_a_reranker_added_at_run_time_reranks_and_then_requests_must_name_one(
    served: Served,
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    save_cross_encoder(served.folder / "added", build_cross_encoder())
    added = served.http.post("/v2/repository/models/added/load", headers=admin, json={
        "parameters": {"path": str(served.folder / "added")}})
    assert added.status_code == 200, added.text
    try:
        cohere_answer = served.http.post("/v1/rerank", json={"query": QUERY,
                                                             "documents": ["a"]})
        tei_answer = served.http.post("/rerank", json={"query": QUERY, "texts": ["a"]})
        named = served.http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS,
                                                  "model": "added"})
    finally:
        served.http.post("/v2/repository/models/added/unload", headers=admin)

    assert cohere_answer.status_code == 400
    assert "'reranker', 'added'" in cohere_answer.json()["message"]
    assert (tei_answer.status_code, tei_answer.json()["error_type"]) == (422, "Validation")
    assert named.status_code == 200, named.text
    expected = served.scores(DOCUMENTS)  # the same weights as the configured one's
    assert [r["index"] for r in named.json()] == best_first(expected)
    np.testing.assert_allclose([r["score"] for r in named.json()], np.sort(expected)[::-1],
                               atol=1e-5)
    assert served.http.post("/rerank", json={"query": QUERY, "texts": ["a"]}).status_code == 200
