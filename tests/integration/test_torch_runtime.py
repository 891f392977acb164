"""The PyTorch runtime against the real daemon (issue 6): Hugging Face folders made here with
`transformers` and the real all-MiniLM-L6-v2 weights, plain state dicts with a module factory,
scale-to-zero of a 100 MB torch model, load failures that stay with their model, and a daemon
serving only ONNX that never loads torch. Every reference is computed in this process with
real torch and transformers; every served answer comes from a real `snooze serve`."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import safetensors.torch
import torch
import transformers
from daemon import Daemon
from oip_http import index_of, output, status_of
from onnx_models import reference_session, write_mlp
from torch_models import (
    BIG_BERT,
    MINILM,
    SENTENCES,
    SHORT_POSITIONS,
    TINY_BERT,
    forward,
    mean_pooled,
    save_bert,
    save_heads,
    save_state_dict,
    save_vit,
    text_body,
    token_rows,
    tokens_body,
)


async def _post_all(url: str, posts: Sequence[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(posts))
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        return list(await asyncio.gather(*(http.post(path, json=body) for path, body in posts)))


def post_concurrently(daemon: Daemon, posts: Sequence[tuple[str, dict[str, Any]]]
                      ) -> list[httpx.Response]:
    """Send every (path, body) at once, one connection each; responses in the same order."""
    responses = asyncio.run(_post_all(daemon.url, posts))
    for response in responses:
        assert response.status_code == 200, response.text
    return responses


def batching_of(client: httpx.Client, name: str) -> dict[str, Any]:
    return dict(status_of(client, name)["batching"])


# --- the daemon serving working models -------------------------------------------------------


@dataclass
class Served:
    daemon: Daemon
    client: httpx.Client
    bert: Any
    classifier: Any
    state_dict: torch.nn.Module
    vit: Any
    heads: torch.nn.Module
    short_bert: Any
    folder: Path


SERVED_CONFIG = """
[server]
idle_timeout = "never"

[[models]]
name = "bert"
path = "bert"
device = "cpu"

# The same folder with batches that go out when full (4 rows) or after 2 s: the concurrent
# requests of a test all share their batch, whatever the scheduling of this machine.
[[models]]
name = "bert-batched"
path = "bert"
device = "cpu"
[models.batching]
max_batch_size = 4
max_delay = "2s"

[[models]]
name = "minilm"
path = "{minilm}"
device = "cpu"
tokenize = true
[models.batching]
max_batch_size = 8
max_delay = "2s"

[[models]]
name = "bert-cls"
path = "bert"
device = "cpu"
pooling = "cls"
normalize = false

[[models]]
name = "vit"
path = "vit"
device = "cpu"

[[models]]
name = "two-heads"
path = "heads/weights.safetensors"
module = "heads:build"
inputs = [{{ name = "x", datatype = "FP32", shape = [-1, 8] }}]
outputs = [
    {{ name = "y", datatype = "FP32", shape = [-1, 3] }},
    {{ name = "z", datatype = "FP32", shape = [-1, 2] }},
]

# A model of 16 positions with a real tokenizer: longer texts are cut to what it can take.
[[models]]
name = "short-bert"
path = "short-bert"
device = "cpu"
tokenize = true

[[models]]
name = "classifier"
path = "classifier"
device = "cpu"

[[models]]
name = "mlp-state-dict"
path = "mlp/weights.safetensors"
module = "mymodel:build"
inputs = [{{ name = "x", datatype = "FP32", shape = [-1, 8] }}]
outputs = [{{ name = "y", datatype = "FP32", shape = [-1, 3] }}]

[[models]]
name = "mlp-state-dict-bf16"
path = "mlp/weights.safetensors"
module = "mymodel:build"
dtype = "bfloat16"
inputs = [{{ name = "x", datatype = "FP32", shape = [-1, 8] }}]
outputs = [{{ name = "y", datatype = "FP32", shape = [-1, 3] }}]
"""


@pytest.fixture(scope="module")
def served(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("torch-served")
    bert = save_bert(folder / "bert", **TINY_BERT)
    classifier = save_bert(folder / "classifier", transformers.BertForSequenceClassification,
                           seed=1, num_labels=3, **TINY_BERT)
    state_dict = save_state_dict(folder / "mlp")
    vit = save_vit(folder / "vit")
    heads = save_heads(folder / "heads")
    short_bert = save_bert(folder / "short-bert", **{
        **TINY_BERT, "vocab_size": 30522, "max_position_embeddings": SHORT_POSITIONS})
    shutil.copy(MINILM / "tokenizer.json", folder / "short-bert" / "tokenizer.json")
    daemon = module_serve(SERVED_CONFIG.format(minilm=MINILM), directory=folder)
    with httpx.Client(base_url=daemon.url, timeout=120) as client:
        yield Served(daemon, client, bert, classifier, state_dict, vit, heads, short_bert,
                     folder)


# --- Done means 1: a tiny random BERT made here ----------------------------------------------


def test_tiny_bert_serves_the_in_process_hidden_states_and_mean_pooled_normalised_embedding(
    served: Served,
) -> None:
    ids, mask = token_rows([7], width=7, seed=1)

    response = served.client.post("/v2/models/bert/infer", json=tokens_body(ids, mask))

    assert response.status_code == 200, response.text
    hidden = forward(served.bert, ids, mask).last_hidden_state.numpy()
    np.testing.assert_allclose(output(response.json(), "last_hidden_state"), hidden, atol=1e-5)
    np.testing.assert_allclose(output(response.json(), "embedding"), mean_pooled(hidden, mask),
                               atol=1e-5)


def test_concurrent_bert_requests_of_different_lengths_share_batches_and_match_in_process(
    served: Served,
) -> None:
    # Two padded widths (batched apart: equal trailing shapes only) and, within each, rows
    # whose attention masks cover different lengths (batched together).
    requests = [token_rows([3], 9, seed=2), token_rows([9, 5], 9, seed=3),
                token_rows([1], 9, seed=4),
                token_rows([4], 5, seed=5), token_rows([5], 5, seed=6),
                token_rows([2], 5, seed=7), token_rows([3], 5, seed=8)]
    before = batching_of(served.client, "bert-batched")

    responses = post_concurrently(served.daemon, [
        ("/v2/models/bert-batched/infer", tokens_body(ids, mask)) for ids, mask in requests
    ])

    for (ids, mask), response in zip(requests, responses, strict=True):
        hidden = forward(served.bert, ids, mask).last_hidden_state.numpy()
        np.testing.assert_allclose(output(response.json(), "last_hidden_state"), hidden,
                                   atol=1e-5)
        np.testing.assert_allclose(output(response.json(), "embedding"),
                                   mean_pooled(hidden, mask), atol=1e-5)
    after = batching_of(served.client, "bert-batched")
    batches = after["batches"] - before["batches"]
    assert after["requests"] - before["requests"] == len(requests)
    assert batches < len(requests), f"no batch held more than one request: {after}"
    assert after["largest_batch"] > 1


# --- Done means 2: the real all-MiniLM-L6-v2 with server-side tokenization -------------------


@pytest.fixture(scope="module")
def minilm_reference() -> tuple[Any, Any]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(MINILM), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(MINILM), local_files_only=True).eval()
    return tokenizer, model


def minilm_alone(reference: tuple[Any, Any], sentence: str) -> tuple[np.ndarray, np.ndarray]:
    """Hidden states [tokens, 384] and the normalised mean-pooled embedding of one sentence."""
    tokenizer, model = reference
    encoded = tokenizer([sentence], truncation=True, max_length=512, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**encoded).last_hidden_state.numpy()
    return hidden[0], mean_pooled(hidden, encoded["attention_mask"].numpy())[0]


def test_minilm_sentences_as_bytes_get_in_process_embeddings_in_one_shared_batch(
    served: Served, minilm_reference: tuple[Any, Any]
) -> None:
    # Eight rows in six requests, short and long mixed: one batch padded to the longest.
    groups = [[SENTENCES[0]], [SENTENCES[5]], [SENTENCES[1], SENTENCES[2]], [SENTENCES[3]],
              [SENTENCES[4], SENTENCES[6]], [SENTENCES[7]]]
    before = batching_of(served.client, "minilm")

    responses = post_concurrently(served.daemon, [
        ("/v2/models/minilm/infer", text_body(group)) for group in groups
    ])

    after = batching_of(served.client, "minilm")
    assert after["requests"] - before["requests"] == len(groups)
    assert after["batches"] - before["batches"] == 1, after
    served_rows: list[np.ndarray] = []
    expected_rows: list[np.ndarray] = []
    for group, response in zip(groups, responses, strict=True):
        alone = [minilm_alone(minilm_reference, sentence) for sentence in group]
        hidden = output(response.json(), "last_hidden_state")
        # Each request's hidden states are trimmed to its own longest row, not the batch's.
        assert hidden.shape == (len(group), max(h.shape[0] for h, _ in alone), 384)
        for row, (expected_hidden, _) in zip(hidden, alone, strict=True):
            tokens = expected_hidden.shape[0]
            np.testing.assert_allclose(row[:tokens], expected_hidden, atol=1e-4)
        served_rows.extend(output(response.json(), "embedding"))
        expected_rows.extend(embedding for _, embedding in alone)
    embeddings, expected = np.stack(served_rows), np.stack(expected_rows)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(embeddings @ embeddings.T, expected @ expected.T, atol=1e-4)
    np.testing.assert_allclose(embeddings, expected, atol=1e-4)
    # The similarities mean something: paraphrases are closer than unrelated sentences.
    row = {sentence: i for i, sentence in enumerate(s for group in groups for s in group)}
    similarity = embeddings @ embeddings.T
    cat, kitten, markets = row[SENTENCES[0]], row[SENTENCES[4]], row[SENTENCES[2]]
    assert similarity[cat, kitten] > similarity[cat, markets] + 0.2


def test_minilm_metadata_offers_text_or_token_ids(served: Served) -> None:
    response = served.client.get("/v2/models/minilm")

    assert response.status_code == 200, response.text
    inputs = {spec["name"]: spec for spec in response.json()["inputs"]}
    assert inputs["text"]["datatype"] == "BYTES"
    assert inputs["text"]["shape"] == [-1]
    assert inputs["input_ids"]["datatype"] == "INT64"
    outputs = {spec["name"]: spec["shape"] for spec in response.json()["outputs"]}
    assert outputs == {"last_hidden_state": [-1, -1, 384], "embedding": [-1, 384],
                       "token_count": [-1]}


def test_tokenizing_model_answers_400_naming_the_choices_to_a_request_with_neither(
    served: Served,
) -> None:
    response = served.client.post("/v2/models/minilm/infer", json={"inputs": [
        {"name": "attention_mask", "shape": [1, 3], "datatype": "INT64", "data": [1, 1, 1]}]})

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "['text'] or ['input_ids', 'attention_mask']" in error
    assert "['attention_mask']" in error  # what was sent


def ids(name: str, rows: list[list[int]]) -> dict[str, Any]:
    return {"name": name, "shape": [len(rows), len(rows[0])], "datatype": "INT64",
            "data": rows}


@pytest.mark.parametrize(("inputs", "message"), [
    ([ids("input_ids", [[101, 102, 103]]), ids("attention_mask", [[1, 1, 1], [1, 1, 1]])],
     "input 'attention_mask' has shape [2, 3]; it must match input_ids [1, 3]"),
    ([ids("input_ids", [[101, 10**6]]), ids("attention_mask", [[1, 1]])],
     "token id outside [0, 30522)"),
    ([ids("input_ids", [[101] * 513]), ids("attention_mask", [[1] * 513])],
     "has 513 tokens; the model takes at most 512"),
    ([ids("input_ids", [[101, 102]]), ids("attention_mask", [[1, 1]]),
      ids("token_type_ids", [[0, 5]])],
     "input 'token_type_ids' holds a type id outside [0, 2)"),
    ([{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]},
      ids("input_ids", [[101, 102]]), ids("attention_mask", [[1, 1]])],
     "send either 'text' or token ids, not both"),
])
def test_token_inputs_the_model_would_fail_on_get_400_before_queueing(
    served: Served, inputs: list[dict[str, Any]], message: str,
) -> None:
    response = served.client.post("/v2/models/minilm/infer", json={"inputs": inputs})

    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


@pytest.mark.parametrize("inputs", [
    [{"name": "text", "shape": [0], "datatype": "BYTES", "data": []}],
    [{"name": "input_ids", "shape": [0, 4], "datatype": "INT64", "data": []},
     {"name": "attention_mask", "shape": [0, 4], "datatype": "INT64", "data": []}],
], ids=["text", "token-ids"])
def test_a_request_with_no_rows_gets_empty_outputs(
    served: Served, inputs: list[dict[str, Any]]
) -> None:
    response = served.client.post("/v2/models/minilm/infer", json={"inputs": inputs})

    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["embedding"]["shape"] == [0, 384]
    assert outputs["embedding"]["data"] == []
    assert outputs["last_hidden_state"]["shape"][0] == 0


def test_text_that_is_not_utf8_is_a_400_and_its_batch_neighbours_are_served(
    served: Served,
) -> None:
    bad = b"\xff\xfe abc"
    header = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 4 + len(bad)}}]}).encode()
    content = header + len(bad).to_bytes(4, "little") + bad

    response = served.client.post("/v2/models/minilm/infer", content=content,
                                  headers={"Inference-Header-Content-Length": str(len(header))})

    assert response.status_code == 400, response.text
    assert response.json()["error"] == (
        "input 'text': element 0 is not valid UTF-8 (invalid start byte at byte 0)")
    good = served.client.post("/v2/models/minilm/infer", json={"inputs": [
        {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["abc"]}]})
    assert good.status_code == 200, good.text


def test_minilm_token_ids_give_the_same_embeddings_as_text(
    served: Served, minilm_reference: tuple[Any, Any]
) -> None:
    tokenizer, _ = minilm_reference
    # Eight rows each: a full batch goes out at once, without waiting for company.
    encoded = tokenizer(SENTENCES, padding=True, return_tensors="np")
    ids, mask = encoded["input_ids"].astype(np.int64), encoded["attention_mask"].astype(np.int64)

    by_ids, by_text = post_concurrently(served.daemon, [
        ("/v2/models/minilm/infer", tokens_body(ids, mask, outputs=["embedding"])),
        ("/v2/models/minilm/infer", text_body(SENTENCES)),
    ])

    np.testing.assert_allclose(output(by_ids.json(), "embedding"),
                               output(by_text.json(), "embedding"), atol=1e-5)
    expected = np.stack([minilm_alone(minilm_reference, s)[1] for s in SENTENCES])
    np.testing.assert_allclose(output(by_ids.json(), "embedding"), expected, atol=1e-4)


def test_cls_pooling_without_normalisation_serves_the_first_token_state(served: Served) -> None:
    ids, mask = token_rows([5, 2], width=5, seed=16)

    response = served.client.post("/v2/models/bert-cls/infer", json=tokens_body(ids, mask))

    assert response.status_code == 200, response.text
    hidden = forward(served.bert, ids, mask).last_hidden_state.numpy()
    np.testing.assert_allclose(output(response.json(), "embedding"), hidden[:, 0], atol=1e-5)


def test_text_longer_than_the_model_positions_is_truncated_to_them(served: Served) -> None:
    sentence = SENTENCES[2]  # about 25 tokens
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(served.folder / "short-bert" / "tokenizer.json"))
    encoded = tokenizer([sentence], truncation=True, max_length=SHORT_POSITIONS,
                        return_tensors="np")
    ids = encoded["input_ids"].astype(np.int64)
    mask = encoded["attention_mask"].astype(np.int64)
    assert len(tokenizer(sentence)["input_ids"]) > SHORT_POSITIONS  # premise: too long

    response = served.client.post("/v2/models/short-bert/infer", json=text_body([sentence]))

    assert response.status_code == 200, response.text
    hidden = forward(served.short_bert, ids, mask).last_hidden_state.numpy()
    assert output(response.json(), "last_hidden_state").shape == (1, SHORT_POSITIONS, 32)
    np.testing.assert_allclose(output(response.json(), "embedding"), mean_pooled(hidden, mask),
                               atol=1e-5)


# --- a text classifier, and Done means 3: a plain state dict with a module factory -----------


def test_sequence_classifier_serves_the_in_process_logits(served: Served) -> None:
    ids, mask = token_rows([6, 3], width=6, seed=9)

    response = served.client.post("/v2/models/classifier/infer", json=tokens_body(ids, mask))

    assert response.status_code == 200, response.text
    assert [o["name"] for o in response.json()["outputs"]] == ["logits"]
    expected = forward(served.classifier, ids, mask).logits.numpy()
    assert expected.shape == (2, 3)
    np.testing.assert_allclose(output(response.json(), "logits"), expected, atol=1e-5)


def test_state_dict_with_module_factory_serves_the_module_outputs(served: Served) -> None:
    x = np.random.default_rng(10).standard_normal((3, 8)).astype(np.float32)

    response = served.client.post("/v2/models/mlp-state-dict/infer", json={"inputs": [
        {"name": "x", "shape": [3, 8], "datatype": "FP32", "data": x.reshape(-1).tolist()}]})

    assert response.status_code == 200, response.text
    with torch.inference_mode():
        expected = served.state_dict(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(output(response.json(), "y"), expected, atol=1e-6)
    metadata = served.client.get("/v2/models/mlp-state-dict").json()
    assert metadata["platform"] == "pytorch_safetensors"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}]
    assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]


def test_a_state_dict_run_in_bfloat16_answers_its_declared_fp32(served: Served) -> None:
    x = np.random.default_rng(11).standard_normal((2, 8)).astype(np.float32)

    response = served.client.post("/v2/models/mlp-state-dict-bf16/infer", json={"inputs": [
        {"name": "x", "shape": [2, 8], "datatype": "FP32", "data": x.reshape(-1).tolist()}]})

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["outputs"][0]["datatype"] == "FP32"
    module = served.state_dict.to(torch.bfloat16)
    try:
        with torch.inference_mode():
            expected = module(torch.from_numpy(x).to(torch.bfloat16)).float().numpy()
    finally:
        served.state_dict.to(torch.float32)
    np.testing.assert_allclose(output(body, "y"), expected, atol=1e-6)


def test_image_classifier_serves_the_in_process_logits_for_pixel_values(served: Served) -> None:
    pixels = np.random.default_rng(17).standard_normal((2, 3, 32, 32)).astype(np.float32)

    response = served.client.post("/v2/models/vit/infer", json={"inputs": [
        {"name": "pixel_values", "shape": [2, 3, 32, 32], "datatype": "FP32",
         "data": pixels.reshape(-1).tolist()}]})

    assert response.status_code == 200, response.text
    with torch.inference_mode():
        expected = served.vit(pixel_values=torch.from_numpy(pixels)).logits.numpy()
    np.testing.assert_allclose(output(response.json(), "logits"), expected, atol=1e-5)
    metadata = served.client.get("/v2/models/vit").json()
    assert metadata["inputs"] == [
        {"name": "pixel_values", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]


def test_module_returning_a_dict_serves_each_declared_output_by_name(served: Served) -> None:
    x = np.random.default_rng(18).standard_normal((2, 8)).astype(np.float32)
    body = {"inputs": [{"name": "x", "shape": [2, 8], "datatype": "FP32",
                        "data": x.reshape(-1).tolist()}]}

    both = served.client.post("/v2/models/two-heads/infer", json=body)
    only_z = served.client.post("/v2/models/two-heads/infer",
                                json={**body, "outputs": [{"name": "z"}]})

    assert both.status_code == 200, both.text
    with torch.inference_mode():
        expected = served.heads(torch.from_numpy(x))
    assert [o["name"] for o in both.json()["outputs"]] == ["y", "z"]
    np.testing.assert_allclose(output(both.json(), "y"), expected["y"].numpy(), atol=1e-6)
    np.testing.assert_allclose(output(both.json(), "z"), expected["z"].numpy(), atol=1e-6)
    assert only_z.status_code == 200, only_z.text
    assert [o["name"] for o in only_z.json()["outputs"]] == ["z"]
    np.testing.assert_allclose(output(only_z.json(), "z"), expected["z"].numpy(), atol=1e-6)


# --- Done means 4: scale-to-zero of a torch model of 100 MB ---------------------------------


def test_idle_torch_model_gives_its_memory_back_and_returns_on_the_next_request(
    serve: Any, tmp_path: Path
) -> None:
    big = save_bert(tmp_path / "big", seed=3, **BIG_BERT)
    save_bert(tmp_path / "tiny", **TINY_BERT)
    daemon = serve("""
[server]
idle_timeout = "1s"

[[models]]
name = "big"
path = "big"
device = "cpu"

# Loaded first, so that torch and transformers are in memory before the big model's turn.
[[models]]
name = "tiny"
path = "tiny"
device = "cpu"
idle_timeout = "never"
""")
    with httpx.Client(base_url=daemon.url, timeout=120) as client:
        ids, mask = token_rows([6], width=6, seed=11)
        assert client.post("/v2/models/tiny/infer", json=tokens_body(ids, mask)).status_code == 200
        rss_cold = daemon.rss()

        mark = daemon.mark()
        response = client.post("/v2/models/big/infer", json=tokens_body(ids, mask))
        assert response.status_code == 200, response.text
        rss_loaded = daemon.rss()
        loaded = status_of(client, "big")
        # Premise: rss_loaded was read while the model was still loaded.
        assert loaded["state"] == "READY", loaded
        line = daemon.wait_for_log(r"model_loaded model=big ", start=mark)
        match = re.search(r" bytes=(\d+)", line)
        assert match, line
        measured = int(match.group(1))
        assert measured >= 100 * 10**6, f"the model should hold 100 MB, measured {measured}"
        assert rss_loaded - rss_cold >= 0.8 * measured

        daemon.wait_for_log(r"model_unloaded model=big reason=idle", start=mark)
        rss_unloaded = daemon.rss()

        assert rss_loaded - rss_unloaded >= 0.8 * measured, (
            f"RSS went from {rss_loaded} to {rss_unloaded}; the model measured {measured} bytes"
        )
        assert index_of(client)["big"]["state"] == "UNLOADED"

        again = daemon.mark()
        ids, mask = token_rows([8, 4], width=8, seed=12)
        response = client.post("/v2/models/big/infer", json=tokens_body(ids, mask))
        assert response.status_code == 200, response.text
        daemon.wait_for_log(r"model_loaded model=big ", start=again)
        hidden = forward(big, ids, mask).last_hidden_state.numpy()
        np.testing.assert_allclose(output(response.json(), "embedding"),
                                   mean_pooled(hidden, mask), atol=1e-5)
        assert status_of(client, "big")["loads"] == 2


# --- Done means 5: load failures stay with their model ---------------------------------------


FAILING_CONFIG = """
[[models]]
name = "unknown-type"
path = "unknown-type"

[[models]]
name = "no-image-head"
path = "bert"
task = "image-classification"

[[models]]
name = "wrong-module"
path = "plain/weights.safetensors"
module = "nosuch.module:factory"
inputs = [{ name = "x", datatype = "FP32", shape = [-1, 8] }]
outputs = [{ name = "y", datatype = "FP32", shape = [-1, 3] }]

[[models]]
name = "mismatched"
path = "mismatched/weights.safetensors"
module = "mymodel:build"
inputs = [{ name = "x", datatype = "FP32", shape = [-1, 8] }]
outputs = [{ name = "y", datatype = "FP32", shape = [-1, 3] }]

[[models]]
name = "no-factory"
path = "mismatched/weights.safetensors"
module = "mymodel:nosuch"
inputs = [{ name = "x", datatype = "FP32", shape = [-1, 8] }]
outputs = [{ name = "y", datatype = "FP32", shape = [-1, 3] }]

[[models]]
name = "not-a-module"
path = "plain/weights.safetensors"
module = "notamodule:build"
inputs = [{ name = "x", datatype = "FP32", shape = [-1, 8] }]
outputs = [{ name = "y", datatype = "FP32", shape = [-1, 3] }]

[[models]]
name = "no-config"
path = "no-config"

[[models]]
name = "no-tokenizer"
path = "bert"
tokenize = true

[[models]]
name = "bert"
path = "bert"
device = "cpu"

[[models]]
name = "mlp-onnx"
path = "mlp.onnx"

[[models]]
name = "hf-missing"
path = "hf-missing"

[[models]]
name = "hf-shapes"
path = "hf-shapes"
""" + f"""
[[models]]
name = "no-room"
path = "{MINILM}"
tokenize = true
max_length = 2
"""

# model -> what its load error must say
LOAD_FAILURES = {
    "unknown-type": "model type `nosuchmodel`",
    "no-image-head": "transformers has no AutoModelForImageClassification for model type 'bert'",
    "wrong-module": "cannot import module 'nosuch.module'",
    "mismatched": "the weights do not match mymodel:build",
    "no-factory": "module 'mymodel' has no callable 'nosuch'",
    "not-a-module": "notamodule:build returned int, not a torch.nn.Module",
    "no-config": "has no config.json",
    "no-tokenizer": "tokenize = true but",
    # transformers would fill these with random weights, and only warn.
    "hf-missing": "do not match its config.json: missing encoder.layer.1.",
    "hf-shapes": "shapes differ (weights vs config) for encoder.layer.0.intermediate.dense.bias",
    "no-room": "max_length = 2 leaves no room for text: the tokenizer adds 2 special tokens",
}


@dataclass
class Failing:
    daemon: Daemon
    client: httpx.Client
    bert: Any
    folder: Path


@pytest.fixture(scope="module")
def failing(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Failing]:
    folder = tmp_path_factory.mktemp("torch-failing")
    bert = save_bert(folder / "bert", **TINY_BERT)
    (folder / "unknown-type").mkdir()
    (folder / "unknown-type" / "config.json").write_text(
        '{"model_type": "nosuchmodel", "architectures": ["NoSuchModel"]}')
    save_state_dict(folder / "plain")
    (folder / "plain" / "mymodel.py").unlink()
    (folder / "plain" / "notamodule.py").write_text("def build():\n    return 42\n")
    save_state_dict(folder / "mismatched", hidden=16)
    module = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    safetensors.torch.save_file(module.state_dict(),
                                str(folder / "mismatched" / "weights.safetensors"))
    (folder / "no-config").mkdir()
    safetensors.torch.save_file(module.state_dict(), str(folder / "no-config" / "x.safetensors"))
    write_mlp(folder / "mlp.onnx")
    for name in ("hf-missing", "hf-shapes"):
        shutil.copytree(folder / "bert", folder / name)
    weights = folder / "hf-missing" / "model.safetensors"
    kept = {k: v for k, v in safetensors.torch.load_file(str(weights)).items()
            if not k.startswith("encoder.layer.1.")}
    safetensors.torch.save_file(kept, str(weights), metadata={"format": "pt"})
    config = json.loads((folder / "hf-shapes" / "config.json").read_text())
    config["intermediate_size"] += 8
    (folder / "hf-shapes" / "config.json").write_text(json.dumps(config))
    daemon = module_serve(FAILING_CONFIG, directory=folder)
    with httpx.Client(base_url=daemon.url, timeout=120) as client:
        yield Failing(daemon, client, bert, folder)


@pytest.mark.parametrize(("name", "message"), LOAD_FAILURES.items())
def test_model_that_cannot_load_goes_failed_with_a_message_saying_why(
    failing: Failing, name: str, message: str
) -> None:
    ids, mask = token_rows([3], width=3, seed=13)

    response = failing.client.post(f"/v2/models/{name}/infer", json=tokens_body(ids, mask))

    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert name in error
    assert message in error
    assert int(response.headers["retry-after"]) >= 1
    entry = index_of(failing.client)[name]
    assert entry["state"] == "FAILED"
    assert message in entry["reason"]
    failing.daemon.wait_for_log(rf"model_load_failed model={re.escape(name)} ")


def test_daemon_with_failed_torch_models_serves_its_onnx_and_torch_models(
    failing: Failing,
) -> None:
    ids, mask = token_rows([3], width=3, seed=13)
    for name in LOAD_FAILURES:  # every failure has happened in this daemon first
        response = failing.client.post(f"/v2/models/{name}/infer", json=tokens_body(ids, mask))
        assert response.status_code == 503, response.text
    x = np.random.default_rng(14).standard_normal((2, 64)).astype(np.float32)

    onnx = failing.client.post("/v2/models/mlp-onnx/infer", json={"inputs": [
        {"name": "x", "shape": [2, 64], "datatype": "FP32", "data": x.reshape(-1).tolist()}]})
    bert = failing.client.post("/v2/models/bert/infer", json=tokens_body(ids, mask))

    assert onnx.status_code == 200, onnx.text
    session = reference_session(failing.folder / "mlp.onnx")
    np.testing.assert_allclose(output(onnx.json(), "y"), session.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)
    assert bert.status_code == 200, bert.text
    hidden = forward(failing.bert, ids, mask).last_hidden_state.numpy()
    np.testing.assert_allclose(output(bert.json(), "embedding"), mean_pooled(hidden, mask),
                               atol=1e-5)
    states = {name: entry["state"] for name, entry in index_of(failing.client).items()}
    assert states == {**dict.fromkeys(LOAD_FAILURES, "FAILED"),
                      "bert": "READY", "mlp-onnx": "READY"}
    assert failing.client.get("/health/ready").status_code == 200


# --- torch stays out of a daemon that serves only ONNX --------------------------------------


def test_daemon_serving_only_onnx_never_loads_torch(serve: Any, tmp_path: Path) -> None:
    write_mlp(tmp_path / "mlp.onnx")
    daemon = serve(textwrap.dedent("""
        [[models]]
        name = "mlp"
        path = "mlp.onnx"
    """))
    x = np.full((1, 64), 0.5, dtype=np.float32)
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        response = client.post("/v2/models/mlp/infer", json={"inputs": [
            {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": x.reshape(-1).tolist()}]})
    assert response.status_code == 200, response.text
    session: ort.InferenceSession = reference_session(tmp_path / "mlp.onnx")
    np.testing.assert_allclose(output(response.json(), "y"), session.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)

    # Every shared library the daemon has mapped, after it has loaded and run a model.
    maps = Path(f"/proc/{daemon.pid}/maps").read_text()
    libraries = {line.split()[-1] for line in maps.splitlines() if ".so" in line}
    assert any("onnxruntime" in path for path in libraries)  # the check sees native modules
    torch_dir = str(Path(torch.__file__).parent)
    native = [path for path in libraries
              if path.startswith(torch_dir) or "libtorch" in path
              or "/tokenizers/" in path or "/safetensors/" in path]
    assert native == [], f"an ONNX-only daemon mapped torch's libraries: {native}"


def test_torch_model_without_torch_installed_goes_failed_naming_the_extra(
    serve: Any, tmp_path: Path
) -> None:
    # A sitecustomize that makes `import torch` fail in the daemon, as on a machine without it.
    hide = tmp_path / "hide-torch"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text('import sys\nsys.modules["torch"] = None\n')
    save_bert(tmp_path / "bert", **TINY_BERT)
    write_mlp(tmp_path / "mlp.onnx")
    daemon = serve(textwrap.dedent("""
        [[models]]
        name = "bert"
        path = "bert"

        [[models]]
        name = "mlp"
        path = "mlp.onnx"
    """), env={"PYTHONPATH": str(hide)})
    ids, mask = token_rows([3], width=3, seed=15)
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        bert = client.post("/v2/models/bert/infer", json=tokens_body(ids, mask))
        mlp = client.post("/v2/models/mlp/infer", json={"inputs": [
            {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]})
        entry = index_of(client)["bert"]

    assert bert.status_code == 503, bert.text
    error = bert.json()["error"]
    assert "needs PyTorch" in error
    assert error.count("pip install 'snoozeml[torch]'") == 1, error
    assert entry["state"] == "FAILED"
    assert "pip install 'snoozeml[torch]'" in entry["reason"]
    assert mlp.status_code == 200, mlp.text
