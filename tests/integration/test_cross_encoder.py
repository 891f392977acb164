"""Cross-encoders over the Open Inference Protocol, against the real daemon: MiniLM under a
seeded one-label sequence-classification head (cross_encoder_models.py), served from its
Hugging Face folder through PyTorch and as its ONNX export, with `tokenize = true`. Pairs go in
as `text` and `text_pair`; every reference comes from this process: sentence-transformers'
CrossEncoder (raw logits, its activation off) for pairs, the transformers model itself for
single texts and for the first text kept whole; for `text_pair`'s `max_tokens`, CrossEncoder on
each document cut at the end of its first tokens by the Hugging Face tokenizer's own offsets."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
import transformers
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cross_encoder_models import (
    POISONED_WORD,
    broken_everywhere,
    broken_for_one_word,
    build_cross_encoder,
    export_cross_encoder,
    poison_onnx_head,
    save_cross_encoder,
)
from daemon import Daemon
from oip_http import status_of
from sentence_transformers import CrossEncoder
from tritonclient.utils import InferenceServerException

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

MAX_LENGTH = 32  # a room of 29 tokens for a pair's texts: odd, so both-long pairs split 14/15
PAIRS = [
    ("what is a cat?", "A cat is a small animal that likes to sit on mats and purr."),
    ("hi", "hello"),
    # Past max_length: the document is cut.
    ("how do rerankers score documents?",
     "A cross-encoder reads the query and the document together, token by token. " * 4),
    # Both past half of the room: each keeps half, the longer one the odd token.
    ("a long query that goes on and on " * 3, "and a long document to match it " * 4),
    ("Zürich, naïve, 東京", "unicode on both sides"),
    ("", "an empty query"),
]

CONFIG = """
[server]
idle_timeout = "never"
max_request_size = "4MiB"
grpc_max_message_size = "4MiB"

[[models]]
name = "ce-torch"
path = "ce"
device = "cpu"
tokenize = true
max_length = {max_length}

[[models]]
name = "ce-onnx"
path = "ce-onnx/model.onnx"
device = "cpu"
tokenize = true
max_length = {max_length}

# Batches go out when full (8 rows) or after 2 s: concurrent requests share one.
[[models]]
name = "ce-batched"
path = "ce"
device = "cpu"
tokenize = true
max_length = {max_length}
[models.batching]
max_batch_size = 8
max_delay = "2s"

[[models]]
name = "ce-keep-query"
path = "ce"
device = "cpu"
tokenize = true
max_length = {max_length}
truncate_query = false

[[models]]
name = "ce-strict"
path = "ce-onnx/model.onnx"
device = "cpu"
tokenize = true
max_length = {max_length}
truncate = false

[[models]]
name = "nan-torch"
path = "nan"
device = "cpu"
tokenize = true

[[models]]
name = "nan-onnx"
path = "nan-onnx/model.onnx"
device = "cpu"
tokenize = true

[[models]]
name = "nan-for-a-word"
path = "nan-for-a-word"
device = "cpu"
tokenize = true
max_length = {max_length}
"""


@dataclass
class Served:
    daemon: Daemon
    http: httpx.Client
    grpc: grpcclient.InferenceServerClient
    reference: Any  # CrossEncoder, raw logits
    model: Any  # the same model in transformers
    tokenizer: Any


@pytest.fixture(scope="module")
def served(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("cross-encoder")
    model = build_cross_encoder()
    save_cross_encoder(folder / "ce", model)
    graph = export_cross_encoder(folder / "ce-onnx", model)
    save_cross_encoder(folder / "nan", broken_everywhere(build_cross_encoder()))
    poison_onnx_head(graph, folder / "nan-onnx" / "model.onnx")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder / "ce"))
    save_cross_encoder(folder / "nan-for-a-word",
                       broken_for_one_word(build_cross_encoder(), tokenizer))
    daemon = module_serve(CONFIG.format(max_length=MAX_LENGTH), directory=folder)
    reference = CrossEncoder(str(folder / "ce"), device="cpu", max_length=MAX_LENGTH,
                             activation_fn=torch.nn.Identity())
    with httpx.Client(base_url=daemon.url, timeout=120) as http, \
            grpcclient.InferenceServerClient(daemon.grpc_address) as grpc:
        yield Served(daemon, http, grpc, reference, model, tokenizer)


def pairs_body(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    return {"inputs": [
        {"name": "text", "shape": [len(pairs)], "datatype": "BYTES",
         "data": [first for first, _ in pairs]},
        {"name": "text_pair", "shape": [len(pairs)], "datatype": "BYTES",
         "data": [second for _, second in pairs]},
    ]}


def logits_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    outputs = {output["name"]: output for output in response.json()["outputs"]}
    assert sorted(outputs) == ["logits", "token_count"]
    output = outputs["logits"]
    assert output["datatype"] == "FP32"
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def cross_encoder(served: Served, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    return np.asarray(served.reference.predict(list(pairs), batch_size=len(pairs)))


def transformers_logits(served: Served, texts: Sequence[str],
                        pairs: Sequence[str] | None = None, **truncation: Any) -> np.ndarray:
    encoded = served.tokenizer(list(texts), list(pairs) if pairs is not None else None,
                               padding=True, max_length=MAX_LENGTH, return_tensors="pt",
                               **truncation)
    with torch.inference_mode():
        return np.asarray(served.model(**encoded).logits.numpy())


def assert_same_scores(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == (len(want), 1)
    np.testing.assert_allclose(got[:, 0], want, rtol=0, atol=1e-5)


def grpc_pairs(pairs: Sequence[tuple[Any, Any]]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, column in (("text", [p[0] for p in pairs]), ("text_pair", [p[1] for p in pairs])):
        tensor = grpcclient.InferInput(name, [len(pairs)], "BYTES")
        tensor.set_data_from_numpy(np.array(column, dtype=np.object_))
        inputs.append(tensor)
    return inputs


# --- pairs, as CrossEncoder scores them ---------------------------------------------------------


@pytest.mark.parametrize("name", ["ce-torch", "ce-onnx"])
def test_pairs_over_http_json_score_as_cross_encoder(served: Served, name: str) -> None:
    got = logits_of(served.http.post(f"/v2/models/{name}/infer", json=pairs_body(PAIRS)))

    assert_same_scores(got, cross_encoder(served, PAIRS))


@pytest.mark.parametrize("name", ["ce-torch", "ce-onnx"])
def test_pairs_over_grpc_score_as_cross_encoder(served: Served, name: str) -> None:
    result = served.grpc.infer(name, grpc_pairs(PAIRS))

    assert_same_scores(result.as_numpy("logits"), cross_encoder(served, PAIRS))


def test_the_metadata_lists_text_pair_and_one_label_logits(served: Served) -> None:
    for name in ("ce-torch", "ce-onnx"):
        metadata = served.http.get(f"/v2/models/{name}").json()
        inputs = {tensor["name"]: tensor for tensor in metadata["inputs"]}
        assert inputs["text"] == {"name": "text", "datatype": "BYTES", "shape": [-1]}
        assert inputs["text_pair"] == {"name": "text_pair", "datatype": "BYTES", "shape": [-1]}
        assert metadata["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 1]},
                                       {"name": "token_count", "datatype": "INT64", "shape": [-1]}]


@pytest.mark.parametrize("name", ["ce-torch", "ce-onnx"])
def test_single_texts_still_score_alone(served: Served, name: str) -> None:
    texts = [first for first, _ in PAIRS[:4]] + [PAIRS[2][1]]  # the last past max_length
    body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES",
                        "data": texts}]}

    got = logits_of(served.http.post(f"/v2/models/{name}/infer", json=body))

    want = transformers_logits(served, texts, truncation=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_truncate_query_false_cuts_only_the_document(served: Served) -> None:
    pairs = [PAIRS[2], PAIRS[3], PAIRS[0]]

    got = logits_of(served.http.post("/v2/models/ce-keep-query/infer", json=pairs_body(pairs)))

    want = transformers_logits(served, [p[0] for p in pairs], [p[1] for p in pairs],
                               truncation="only_second")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert not np.allclose(got[1], cross_encoder(served, pairs[1:2]), atol=1e-3)


def test_concurrent_pair_requests_share_a_batch_and_each_scores_as_alone(
    served: Served,
) -> None:
    requests = [PAIRS[0:2], PAIRS[2:3], PAIRS[3:6]]
    before = status_of(served.http, "ce-batched")["batching"]

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=served.daemon.url, timeout=120) as http:
            return list(await asyncio.gather(*(
                http.post("/v2/models/ce-batched/infer", json=pairs_body(pairs))
                for pairs in requests)))

    responses = asyncio.run(run())

    after = status_of(served.http, "ce-batched")["batching"]
    assert after["requests"] - before["requests"] == 3
    assert after["batches"] - before["batches"] < 3, after
    for pairs, response in zip(requests, responses, strict=True):
        assert_same_scores(logits_of(response), cross_encoder(served, pairs))


def test_a_document_of_a_megabyte_scores_as_cross_encoder(served: Served) -> None:
    pairs = [("what did the committee do?",
              "The committee reviewed every proposal in detail. " * 20_000)]

    got = logits_of(served.http.post("/v2/models/ce-torch/infer", json=pairs_body(pairs)))

    assert_same_scores(got, cross_encoder(served, pairs))


# --- max_tokens: each document's first tokens --------------------------------------------------

CAP = 6  # fewer tokens than three of PAIRS' documents have


def first_tokens(served: Served, text: str, count: int) -> str:
    """The text up to the end of its `count`-th token, by the Hugging Face tokenizer's offsets."""
    offsets = served.tokenizer(text, add_special_tokens=False,
                               return_offsets_mapping=True)["offset_mapping"]
    return text if len(offsets) <= count else text[:offsets[count - 1][1]]


def capped(served: Served, pairs: Sequence[tuple[str, str]],
           cap: int) -> list[tuple[str, str]]:
    return [(query, first_tokens(served, document, cap)) for query, document in pairs]


def capped_body(pairs: Sequence[tuple[str, str]], cap: object) -> dict[str, Any]:
    body = pairs_body(pairs)
    body["inputs"][1]["parameters"] = {"max_tokens": cap}
    return body


def pair_tokens(served: Served, pairs: Sequence[tuple[str, str]]) -> list[int]:
    encoded = served.tokenizer([q for q, _ in pairs], [d for _, d in pairs],
                               truncation="longest_first", max_length=MAX_LENGTH)
    return [len(ids) for ids in encoded["input_ids"]]


@pytest.mark.parametrize("name", ["ce-torch", "ce-onnx"])
def test_max_tokens_scores_each_document_cut_to_its_first_tokens(served: Served,
                                                                 name: str) -> None:
    response = served.http.post(f"/v2/models/{name}/infer", json=capped_body(PAIRS, CAP))

    got = logits_of(response)
    cut = capped(served, PAIRS, CAP)
    assert_same_scores(got, cross_encoder(served, cut))
    longer = [i for i, (_, document) in enumerate(PAIRS) if cut[i][1] != document]
    assert longer == [0, 2, 3]
    whole = cross_encoder(served, PAIRS)
    assert np.all(np.abs(got[longer, 0] - whole[longer]) > 1e-3)
    counts = {o["name"]: o["data"] for o in response.json()["outputs"]}["token_count"]
    assert counts == pair_tokens(served, cut)


@pytest.mark.parametrize("name", ["ce-torch", "ce-onnx"])
def test_max_tokens_past_every_document_changes_nothing(served: Served, name: str) -> None:
    got = logits_of(served.http.post(f"/v2/models/{name}/infer",
                                     json=capped_body(PAIRS, 10_000)))

    assert_same_scores(got, cross_encoder(served, PAIRS))


@pytest.mark.parametrize("name", ["ce-torch", "ce-onnx"])
def test_max_tokens_over_grpc(served: Served, name: str) -> None:
    request = pb.ModelInferRequest(model_name=name)
    for tensor, column in (("text", [q for q, _ in PAIRS]), ("text_pair", [d for _, d in PAIRS])):
        added = request.inputs.add(name=tensor, datatype="BYTES", shape=[len(PAIRS)])
        added.contents.bytes_contents.extend(text.encode() for text in column)
    request.inputs[1].parameters["max_tokens"].int64_param = CAP
    request.outputs.add(name="logits")
    with grpc.insecure_channel(served.daemon.grpc_address) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)

    raw = reply.raw_output_contents[0]
    got = np.array(struct.unpack(f"<{len(raw) // 4}f", raw), dtype=np.float32)
    assert_same_scores(got.reshape(-1, 1), cross_encoder(served, capped(served, PAIRS, CAP)))


def test_the_strict_model_measures_the_pair_that_max_tokens_makes(served: Served) -> None:
    pairs = [PAIRS[0], PAIRS[2]]  # the second past 32 tokens whole
    refused = served.http.post("/v2/models/ce-strict/infer", json=pairs_body(pairs))

    got = logits_of(served.http.post("/v2/models/ce-strict/infer", json=capped_body(pairs, 12)))

    assert refused.status_code == 400
    assert_same_scores(got, cross_encoder(served, capped(served, pairs, 12)))


def test_a_huge_document_under_a_small_cap_scores_its_first_tokens(served: Served) -> None:
    pairs = [("what did the committee do?",
              "The committee reviewed every proposal in detail. " * 70_000)]  # 3.5 MB

    got = logits_of(served.http.post("/v2/models/ce-torch/infer", json=capped_body(pairs, 8)))

    assert_same_scores(got, cross_encoder(served, [(pairs[0][0], first_tokens(
        served, pairs[0][1][:1000], 8))]))


# --- bad input ----------------------------------------------------------------------------------


def test_a_document_past_the_request_size_is_413_on_http_and_resource_exhausted_on_grpc(
    served: Served,
) -> None:
    pairs = [("query", "word " * 1_000_000)]  # 5 MB, past max_request_size (4 MiB)

    response = served.http.post("/v2/models/ce-torch/infer", json=pairs_body(pairs))
    assert response.status_code == 413, response.text
    with pytest.raises(InferenceServerException) as caught:
        served.grpc.infer("ce-torch", grpc_pairs(pairs))
    assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_text_pair_that_is_not_utf8_is_a_400_naming_it(served: Served, protocol: str) -> None:
    pairs = [(b"fine", b"also fine"), (b"fine", b"\xff\xfe not text")]
    if protocol == "grpc":
        with pytest.raises(InferenceServerException) as caught:
            served.grpc.infer("ce-torch", grpc_pairs(pairs))
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    else:
        inputs = []
        for name, column in (("text", [p[0] for p in pairs]),
                             ("text_pair", [p[1] for p in pairs])):
            tensor = httpclient.InferInput(name, [2], "BYTES")
            tensor.set_data_from_numpy(np.array(column, dtype=np.object_), binary_data=True)
            inputs.append(tensor)
        address = f"127.0.0.1:{served.daemon.http_port}"
        with httpclient.InferenceServerClient(address) as http, \
                pytest.raises(InferenceServerException) as caught:
            http.infer("ce-torch", inputs)
        assert caught.value.status() == "400"
    assert caught.value.message() == ("input 'text_pair': element 1 is not valid UTF-8 "
                                      "(invalid start byte at byte 0)")


@pytest.mark.parametrize(("name", "body", "message"), [
    ("ce-torch", {"inputs": [
        {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
        {"name": "text_pair", "shape": [1], "datatype": "BYTES", "data": ["c"]}]},
     "inputs 'text' and 'text_pair' pair up row by row; they have 2 and 1 rows"),
    ("ce-onnx", {"inputs": [
        {"name": "text_pair", "shape": [1], "datatype": "BYTES", "data": ["c"]}]},
     "model 'ce-onnx' takes ['text'] or ['input_ids', 'attention_mask']; got ['text_pair']"),
    ("ce-strict", pairs_body([PAIRS[0], PAIRS[2]]),
     "row 1: 'text' and 'text_pair' together are longer than the 32 tokens the model takes "
     "(truncate = false)"),
    ("ce-keep-query", pairs_body([("query " * 29, "document")]),
     "input 'text': row 0 leaves no room for its 'text_pair': longer than the 28 tokens a "
     "pair's first text may have (truncate_query = false)"),
])
def test_pairs_the_model_cannot_take_are_400s(served: Served, name: str, body: dict[str, Any],
                                              message: str) -> None:
    response = served.http.post(f"/v2/models/{name}/infer", json=body)

    assert response.status_code == 400
    assert response.json() == {"error": message}


@pytest.mark.parametrize("cap", [0, -2, 2.5, "6", True])
def test_a_max_tokens_that_is_not_a_positive_integer_is_a_400(served: Served,
                                                              cap: object) -> None:
    response = served.http.post("/v2/models/ce-onnx/infer", json=capped_body(PAIRS[:1], cap))

    assert response.status_code == 400
    assert response.json() == {"error": "input 'text_pair': parameter 'max_tokens' must be a "
                                        "positive integer (the tokens each text_pair keeps)"}


def test_the_strict_model_answers_pairs_that_fit(served: Served) -> None:
    got = logits_of(served.http.post("/v2/models/ce-strict/infer",
                                     json=pairs_body([PAIRS[0], PAIRS[1]])))

    assert_same_scores(got, cross_encoder(served, [PAIRS[0], PAIRS[1]]))


# --- a broken model -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nan-torch", "nan-onnx"])
def test_a_model_that_answers_nan_fails_its_load_saying_so(served: Served, name: str) -> None:
    response = served.http.post(f"/v2/models/{name}/infer", json=pairs_body(PAIRS[:1]))

    assert response.status_code == 503
    error = response.json()["error"]
    assert f"model {name!r} answered NaN logits for 1 of 1 rows" in error, error
    assert "run at load" in error
    assert served.http.get(f"/v2/models/{name}/ready").status_code != 200


def test_nan_logits_for_one_input_are_a_500_saying_so_and_the_model_serves_on(
    served: Served,
) -> None:
    poisoned = [("which animal has stripes?", f"the {POISONED_WORD}"), PAIRS[0]]

    response = served.http.post("/v2/models/nan-for-a-word/infer", json=pairs_body(poisoned))

    assert response.status_code == 500
    assert response.json()["error"] == (
        "model 'nan-for-a-word' answered NaN logits for 1 of 2 rows: its weights are broken, "
        "or its arithmetic overflows on these inputs")
    fine = served.http.post("/v2/models/nan-for-a-word/infer", json=pairs_body(PAIRS[:2]))
    assert logits_of(fine).shape == (2, 1)
