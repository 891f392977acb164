"""ONNX text models against the real daemon: all-MiniLM-L6-v2 exported to ONNX (the Hub's
`onnx/model.onnx` layout, tokenizer and sentence-transformers files in the folder above),
served with `tokenize = true`. Every reference comes from this process: sentence-transformers'
own `encode`, its tokenizer, and its transformer's hidden states pooled here."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
from daemon import Daemon
from oip_http import index_of, output, status_of
from onnx_models import write_mlp
from onnx_text_models import minilm_onnx
from sentence_transformers import SentenceTransformer
from torch_models import MINILM, SENTENCES, text_body, tokens_body

# Past the 256 tokens of MiniLM's sentence_bert_config.json: truncated, like the library does.
LONG = " ".join(["Every proposal was reviewed in detail, weighing its cost, its risk and the "
                 "benefit to the people who would use the new service."] * 12)
MAX_LENGTH = 256

CONFIG = """
[server]
idle_timeout = "never"

[[models]]
name = "minilm"
path = "{hub}/onnx/model.onnx"
device = "cpu"
tokenize = true

# Batches go out when full (8 rows) or after 2 s: the concurrent requests of a test all share
# one batch, whatever the scheduling of this machine.
[[models]]
name = "minilm-batched"
path = "{hub}/onnx/model.onnx"
device = "cpu"
tokenize = true
[models.batching]
max_batch_size = 8
max_delay = "2s"

[[models]]
name = "minilm-strict"
path = "{hub}/onnx/model.onnx"
device = "cpu"
tokenize = true
truncate = false

# A graph in a folder of its own, with its tokenizer named by the entry.
[[models]]
name = "minilm-keyed"
path = "bare/model.onnx"
device = "cpu"
tokenize = true
tokenizer = "{hub}/tokenizer.json"

[[models]]
name = "minilm-cls"
path = "{hub}/onnx/model.onnx"
device = "cpu"
tokenize = true
pooling = "cls"
normalize = false

[[models]]
name = "minilm-max"
path = "{hub}/onnx/model.onnx"
device = "cpu"
tokenize = true
pooling = "max"

[[models]]
name = "minilm-last"
path = "{hub}/onnx/model.onnx"
device = "cpu"
tokenize = true
pooling = "last"

[[models]]
name = "minilm-model"
path = "{hub}/onnx/model.onnx"
device = "cpu"
tokenize = true
pooling = "model"

[[models]]
name = "no-tokenizer"
path = "bare/model.onnx"
device = "cpu"
tokenize = true

[[models]]
name = "no-token-inputs"
path = "mlp.onnx"
device = "cpu"
tokenize = true
tokenizer = "{hub}/tokenizer.json"
"""


@dataclass
class Served:
    daemon: Daemon
    client: httpx.Client
    st: Any  # SentenceTransformer


@pytest.fixture(scope="module")
def served(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    graph = minilm_onnx(tmp_path_factory)
    folder = tmp_path_factory.mktemp("onnx-text")
    (folder / "bare").mkdir()
    try:  # the same graph, in a folder without a tokenizer
        os.link(graph, folder / "bare" / "model.onnx")
    except OSError:
        shutil.copy(graph, folder / "bare" / "model.onnx")
    write_mlp(folder / "mlp.onnx")
    daemon = module_serve(CONFIG.format(hub=graph.parent.parent), directory=folder)
    st = SentenceTransformer(str(MINILM), device="cpu")
    assert st.max_seq_length == MAX_LENGTH
    with httpx.Client(base_url=daemon.url, timeout=120) as client:
        yield Served(daemon, client, st)


def infer(served: Served, name: str, body: dict[str, Any]) -> dict[str, Any]:
    response = served.client.post(f"/v2/models/{name}/infer", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def counts_of(served: Served, texts: Sequence[str]) -> list[int]:
    """Each text's tokens, special tokens included, as sentence-transformers truncates."""
    encoded = served.st.tokenizer(list(texts), truncation=True, max_length=MAX_LENGTH)
    return [len(ids) for ids in encoded["input_ids"]]


def hidden_alone(served: Served, text: str) -> np.ndarray:
    """[tokens, 384]: the hidden states of sentence-transformers' transformer, one text."""
    encoded = served.st.tokenizer([text], truncation=True, max_length=MAX_LENGTH,
                                  return_tensors="pt")
    with torch.inference_mode():
        return np.asarray(served.st[0].auto_model(**encoded).last_hidden_state[0].numpy())


async def _post_all(url: str, posts: Sequence[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(posts))
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        return list(await asyncio.gather(*(http.post(path, json=body) for path, body in posts)))


# --- text in, sentence-transformers' embeddings out -------------------------------------------


def test_text_gets_the_sentence_transformers_embeddings_and_the_tokenizer_counts(
    served: Served,
) -> None:
    texts = [*SENTENCES, LONG]

    body = infer(served, "minilm", text_body(texts))

    expected = served.st.encode(texts, normalize_embeddings=True)
    embeddings = output(body, "embedding")
    np.testing.assert_allclose(embeddings, expected, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    counts = counts_of(served, texts)
    assert output(body, "token_count").tolist() == counts
    assert counts[-1] == MAX_LENGTH  # the long text was cut, specials included
    assert output(body, "last_hidden_state").shape == (len(texts), MAX_LENGTH, 384)


def test_the_openai_client_gets_the_same_embeddings_from_the_onnx_model(served: Served) -> None:
    texts = [*SENTENCES[:3], LONG]
    with openai.OpenAI(base_url=f"{served.daemon.url}/v1", api_key="none",
                       max_retries=0) as client:
        response = client.embeddings.create(model="minilm", input=texts)
        listed = [model.id for model in client.models.list().data]

    embeddings = np.asarray([item.embedding for item in response.data])
    np.testing.assert_allclose(embeddings, served.st.encode(texts, normalize_embeddings=True),
                               atol=1e-4)
    assert response.usage.prompt_tokens == sum(counts_of(served, texts))
    # Every ONNX entry with tokenize = true is listed; the one that cannot take text included,
    # as /v1/models reads the entries only (its calls get the load error).
    assert {"minilm", "minilm-batched"} <= set(listed)


def test_metadata_offers_text_or_token_ids_and_the_embedding_outputs(served: Served) -> None:
    response = served.client.get("/v2/models/minilm")

    assert response.status_code == 200, response.text
    inputs = {spec["name"]: (spec["datatype"], spec["shape"]) for spec in response.json()["inputs"]}
    assert inputs == {"input_ids": ("INT64", [-1, -1]), "attention_mask": ("INT64", [-1, -1]),
                      "token_type_ids": ("INT64", [-1, -1]), "text": ("BYTES", [-1])}
    outputs = {spec["name"]: (spec["datatype"], spec["shape"])
               for spec in response.json()["outputs"]}
    assert outputs == {"last_hidden_state": ("FP32", [-1, -1, 384]),
                       "sentence_embedding": ("FP32", [-1, 384]),
                       "embedding": ("FP32", [-1, 384]), "token_count": ("INT64", [-1])}


def test_concurrent_text_requests_share_one_batch_and_each_answers_as_it_would_alone(
    served: Served,
) -> None:
    # Eight rows in six requests, short and long mixed: one batch padded to the longest.
    groups = [[SENTENCES[0]], [SENTENCES[5]], [SENTENCES[1], SENTENCES[2]], [SENTENCES[3]],
              [SENTENCES[4], SENTENCES[6]], [SENTENCES[7]]]
    before = dict(status_of(served.client, "minilm-batched")["batching"])

    responses = asyncio.run(_post_all(served.daemon.url, [
        ("/v2/models/minilm-batched/infer", text_body(group)) for group in groups]))

    after = dict(status_of(served.client, "minilm-batched")["batching"])
    assert after["requests"] - before["requests"] == len(groups)
    assert after["batches"] - before["batches"] == 1, after
    assert after["largest_batch"] > 1
    for group, response in zip(groups, responses, strict=True):
        assert response.status_code == 200, response.text
        alone = infer(served, "minilm", text_body(group))
        for name in ("embedding", "token_count", "last_hidden_state"):
            batched = output(response.json(), name)
            # Token-level outputs are cut to the request's own longest row, not the batch's.
            assert batched.shape == output(alone, name).shape, name
            np.testing.assert_allclose(batched, output(alone, name), atol=1e-5)
        np.testing.assert_allclose(output(response.json(), "embedding"),
                                   served.st.encode(group, normalize_embeddings=True), atol=1e-4)


def test_token_ids_give_the_embedding_of_the_same_text(served: Served) -> None:
    texts = [SENTENCES[0], SENTENCES[3]]
    encoded = served.st.tokenizer(texts, padding=True, return_tensors="np")
    ids, mask = encoded["input_ids"].astype(np.int64), encoded["attention_mask"].astype(np.int64)

    # Without token_type_ids: the graph takes them, and gets zeros.
    by_ids = infer(served, "minilm", tokens_body(ids, mask, ("embedding", "token_count")))
    by_text = infer(served, "minilm", text_body(texts))

    np.testing.assert_allclose(output(by_ids, "embedding"), output(by_text, "embedding"),
                               atol=1e-5)
    assert output(by_ids, "token_count").tolist() == mask.sum(axis=1).tolist()
    assert [o["name"] for o in by_ids["outputs"]] == ["embedding", "token_count"]


def test_a_request_with_no_rows_gets_empty_outputs(served: Served) -> None:
    body = infer(served, "minilm", {
        "inputs": [{"name": "text", "shape": [0], "datatype": "BYTES", "data": []}],
        "outputs": [{"name": "embedding"}, {"name": "token_count"}]})

    assert output(body, "embedding").shape == (0, 384)
    assert output(body, "token_count").shape == (0,)


def test_text_too_long_without_truncation_is_a_400_naming_the_row(served: Served) -> None:
    response = served.client.post("/v2/models/minilm-strict/infer",
                                  json=text_body([SENTENCES[0], LONG]))

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "row 1" in error
    assert f"{MAX_LENGTH} tokens" in error
    short = infer(served, "minilm-strict", text_body([SENTENCES[0]]))
    np.testing.assert_allclose(output(short, "embedding"),
                               served.st.encode([SENTENCES[0]], normalize_embeddings=True),
                               atol=1e-4)


def test_a_tokenizer_named_by_the_entry_serves_the_same_embeddings(served: Served) -> None:
    texts = [SENTENCES[1], LONG]

    keyed = infer(served, "minilm-keyed", text_body(texts))

    # Its sentence-transformers files, beside that tokenizer, set 256 tokens and normalising.
    np.testing.assert_allclose(output(keyed, "embedding"),
                               served.st.encode(texts, normalize_embeddings=True), atol=1e-4)
    assert output(keyed, "token_count").tolist() == counts_of(served, texts)


def _pooled(hidden: np.ndarray, pooling: str) -> np.ndarray:
    if pooling == "cls":
        return hidden[0]
    if pooling == "max":
        return hidden.max(axis=0)
    if pooling == "last":
        return hidden[-1]
    return hidden.mean(axis=0)


@pytest.mark.parametrize(("name", "pooling", "normalize"), [
    ("minilm-cls", "cls", False), ("minilm-max", "max", True), ("minilm-last", "last", True),
    ("minilm-model", "mean", True),  # the graph's own sentence_embedding: mean, normalised
])
def test_each_pooling_serves_the_in_process_pooling_of_the_hidden_states(
    served: Served, name: str, pooling: str, normalize: bool
) -> None:
    # Rows of different lengths in one request: padding must not reach the pooling.
    texts = [SENTENCES[3], SENTENCES[2], SENTENCES[0]]

    body = infer(served, name, {**text_body(texts), "outputs": [{"name": "embedding"}]})

    expected = np.stack([_pooled(hidden_alone(served, text), pooling) for text in texts])
    if normalize:
        expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(output(body, "embedding"), expected, atol=1e-4)
    mean = output(infer(served, "minilm", text_body(texts)), "embedding")
    assert (name == "minilm-model") == np.allclose(output(body, "embedding"), mean, atol=1e-4)


# --- models that cannot take text -------------------------------------------------------------


@pytest.mark.parametrize(("name", "message"), [
    ("no-tokenizer", "tokenize = true but {folder}/bare/tokenizer.json does not exist"),
    ("no-token-inputs", "tokenize = true needs a graph that takes 'input_ids'"),
])
def test_a_model_that_cannot_take_text_goes_failed_saying_why(
    served: Served, name: str, message: str
) -> None:
    expected = message.format(folder=served.daemon.config.parent)

    response = served.client.post(f"/v2/models/{name}/infer", json=text_body(["hello"]))

    assert response.status_code == 503, response.text
    assert expected in response.json()["error"]
    entry = index_of(served.client)[name]
    assert entry["state"] == "FAILED"
    assert expected in entry["reason"]
