"""OpenAI-compatible embeddings (/v1/embeddings, /v1/models) on the real daemon, through the
official `openai` client and LangChain's `OpenAIEmbeddings`, against sentence-transformers'
own `encode` of the same all-MiniLM-L6-v2 in this process."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from daemon import Daemon
from langchain_openai import OpenAIEmbeddings
from oip_http import output, status_of
from onnx_models import write_mlp
from sentence_transformers import SentenceTransformer
from torch_models import MINILM

ADMIN_KEY = "snz_embeddings-admin"
INFER_KEY = "snz_embeddings-inference"
READ_KEY = "snz_embeddings-readonly"
MAX_INPUTS = 80

CONFIG = """
[server]
max_embedding_inputs = {max_inputs}

[auth]
api_keys = [
  {{ name = "app", role = "inference", sha256 = "{infer}" }},
  {{ name = "dashboard", role = "readonly", sha256 = "{read}" }},
  {{ name = "operator", role = "admin", sha256 = "{admin}" }},
]

[[models]]
name = "minilm"
path = "{minilm}"
tokenize = true
[models.batching]
max_batch_size = 32
max_delay = "20ms"

[[models]]
name = "minilm-short"
path = "{minilm}"
tokenize = true
matryoshka = true
max_length = 16
truncate = false

[[models]]
name = "mlp"
path = "mlp.onnx"

[[models]]
name = "minilm-dense"
path = "dense"
tokenize = true
"""

SENTENCES = [
    "A cat sits on the mat.",
    "Stock markets fell sharply on Monday after the announcement.",
    "The kitten is sleeping on a rug.",
    "How do I reset my password?",
    "Photosynthesis turns light into chemical energy in plants.",
    "The train to Lyon leaves at nine.",
    "Ein Hund läuft durch den Park.",
    "Long " + "and winding " * 150 + "road.",  # past the 256 tokens MiniLM takes
]


@dataclass
class Served:
    daemon: Daemon
    client: openai.OpenAI
    http: httpx.Client
    reference: SentenceTransformer

    def expected(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.reference.encode(list(texts), normalize_embeddings=True))

    def tokens(self, texts: Sequence[str], max_length: int = 256) -> list[list[int]]:
        encoded = self.reference.tokenizer(list(texts), truncation=True, max_length=max_length)
        return [list(ids) for ids in encoded["input_ids"]]


@pytest.fixture(scope="module")
def served(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("embeddings")
    write_mlp(folder / "mlp.onnx", dims=(4, 8, 2))
    _with_a_dense_module(folder / "dense")
    digest = {name: hashlib.sha256(key.encode()).hexdigest()
              for name, key in (("infer", INFER_KEY), ("read", READ_KEY), ("admin", ADMIN_KEY))}
    daemon = module_serve(CONFIG.format(minilm=MINILM, max_inputs=MAX_INPUTS, **digest),
                          directory=folder)
    reference = SentenceTransformer(str(MINILM), device="cpu")
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=INFER_KEY, max_retries=0,
                           timeout=120)
    headers = {"Authorization": f"Bearer {INFER_KEY}"}
    with httpx.Client(base_url=daemon.url, timeout=120, headers=headers) as http:
        yield Served(daemon, client, http, reference)
    client.close()


def _with_a_dense_module(folder: Path) -> None:
    """MiniLM's files, but a sentence-transformers layout with a Dense projection after the
    pooling, which SnoozeML does not run."""
    folder.mkdir()
    for item in MINILM.iterdir():
        if item.name != "modules.json":
            (folder / item.name).symlink_to(item)
    modules = json.loads((MINILM / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense",
                       "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))


def vectors(response: Any) -> np.ndarray:
    return np.asarray([item.embedding for item in response.data], dtype=np.float64)


def assert_same_embeddings(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    cosine = (got * expected).sum(axis=1) / (np.linalg.norm(got, axis=1)
                                             * np.linalg.norm(expected, axis=1))
    np.testing.assert_allclose(cosine, 1.0, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def openai_error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# --- Done means 1: the openai package gets sentence-transformers' embeddings ---------------------


def test_a_single_string_and_a_list_equal_sentence_transformers_with_usage(
    served: Served,
) -> None:
    one = served.client.embeddings.create(model="minilm", input=SENTENCES[0])
    many = served.client.embeddings.create(model="minilm", input=SENTENCES)

    assert_same_embeddings(vectors(one), served.expected(SENTENCES[:1]))
    assert_same_embeddings(vectors(many), served.expected(SENTENCES))
    assert [item.index for item in many.data] == list(range(len(SENTENCES)))
    assert many.model == "minilm"
    assert many.object == "list"
    counts = [len(ids) for ids in served.tokens(SENTENCES)]
    assert counts[-1] == 256  # the long one was truncated where the library truncates it
    assert many.usage.prompt_tokens == many.usage.total_tokens == sum(counts)
    assert one.usage.prompt_tokens == counts[0]


def test_token_ids_one_list_or_many_equal_the_same_texts(served: Served) -> None:
    ids = served.tokens(SENTENCES[:4])

    single = served.client.embeddings.create(model="minilm", input=ids[1])
    lists = served.client.embeddings.create(model="minilm", input=ids)

    assert_same_embeddings(vectors(single), served.expected(SENTENCES[1:2]))
    assert_same_embeddings(vectors(lists), served.expected(SENTENCES[:4]))
    assert lists.usage.prompt_tokens == sum(len(row) for row in ids)


def test_base64_is_little_endian_float32_of_the_same_vectors(served: Served) -> None:
    floats = served.client.embeddings.create(model="minilm", input=SENTENCES[:3],
                                             encoding_format="float")
    # Asked explicitly, the client hands the base64 text over as it came.
    raw = served.client.embeddings.create(model="minilm", input=SENTENCES[:3],
                                          encoding_format="base64")
    # Left to itself, the client asks for base64 and decodes it.
    default = served.client.embeddings.create(model="minilm", input=SENTENCES[:3])

    decoded = np.stack([np.frombuffer(base64.b64decode(item.embedding), dtype="<f4")
                        for item in raw.data])
    assert decoded.shape == (3, 384)
    np.testing.assert_allclose(decoded, vectors(floats), atol=1e-6)
    np.testing.assert_allclose(vectors(default), decoded, atol=0)
    assert_same_embeddings(decoded.astype(np.float64), served.expected(SENTENCES[:3]))


def test_more_inputs_than_one_batch_come_back_in_order(served: Served) -> None:
    texts = [f"{SENTENCES[i % 7]} (number {i})" for i in range(MAX_INPUTS)]

    response = served.client.embeddings.create(model="minilm", input=texts)

    assert [item.index for item in response.data] == list(range(MAX_INPUTS))
    assert_same_embeddings(vectors(response), served.expected(texts))


def test_langchain_openai_embeddings_get_the_same_vectors(served: Served) -> None:
    embedder = OpenAIEmbeddings(model="minilm", base_url=f"{served.daemon.url}/v1",
                                api_key=INFER_KEY, check_embedding_ctx_length=False)

    documents = np.asarray(embedder.embed_documents(SENTENCES[:3]))
    query = np.asarray(embedder.embed_query(SENTENCES[3]))

    assert_same_embeddings(documents, served.expected(SENTENCES[:3]))
    assert_same_embeddings(query[None, :], served.expected(SENTENCES[3:4]))


# --- Done means 2 and 3: batched with other calls, and shared with OIP --------------------------


async def _embed_concurrently(client: openai.AsyncOpenAI, texts: Sequence[str]) -> list[Any]:
    return list(await asyncio.gather(*(client.embeddings.create(model="minilm", input=text)
                                       for text in texts)))


def test_64_concurrent_single_sentence_calls_share_batches_and_each_equals_alone(
    served: Served,
) -> None:
    texts = [f"{SENTENCES[i % 7]} Variation {i}." for i in range(64)]
    before = status_of(served.http, "minilm")["batching"]

    async def run() -> list[Any]:
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=64), timeout=120)
        async with openai.AsyncOpenAI(base_url=f"{served.daemon.url}/v1", api_key=INFER_KEY,
                                      http_client=http, max_retries=0) as client:
            return await _embed_concurrently(client, texts)

    responses = asyncio.run(run())

    after = status_of(served.http, "minilm")["batching"]
    assert after["requests"] - before["requests"] == 64
    assert after["batches"] - before["batches"] < 64, after
    assert after["largest_batch"] > 1
    alone = np.stack([served.expected([text])[0] for text in texts])
    assert_same_embeddings(np.concatenate([vectors(r) for r in responses]), alone)


def test_oip_and_openai_calls_at_once_share_one_loaded_copy(served: Served) -> None:
    text_body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                             "data": SENTENCES[4:6]}], "outputs": [{"name": "embedding"}]}
    served.client.embeddings.create(model="minilm", input="loaded first")
    loads = status_of(served.http, "minilm")["loads"]

    async def both() -> tuple[httpx.Response, httpx.Response]:
        headers = {"Authorization": f"Bearer {INFER_KEY}"}
        async with httpx.AsyncClient(base_url=served.daemon.url, timeout=120,
                                     headers=headers) as http:
            oip, embeddings = await asyncio.gather(
                http.post("/v2/models/minilm/infer", json=text_body),
                http.post("/v1/embeddings", json={"model": "minilm", "input": SENTENCES[4:6]}))
            return oip, embeddings

    oip, embeddings = asyncio.run(both())

    assert oip.status_code == 200, oip.text
    assert embeddings.status_code == 200, embeddings.text
    from_oip = output(oip.json(), "embedding")
    from_openai = np.asarray([item["embedding"] for item in embeddings.json()["data"]])
    np.testing.assert_allclose(from_openai, from_oip, atol=1e-6)
    entry = status_of(served.http, "minilm")
    assert entry["loads"] == loads
    assert entry["replicas"] == 1


def test_a_cold_model_loads_on_its_first_embeddings_call(served: Served) -> None:
    unload = httpx.post(f"{served.daemon.url}/v2/repository/models/minilm-short/unload",
                        headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
    assert unload.status_code == 200, unload.text
    before = status_of(served.http, "minilm-short")
    assert before["state"] == "UNLOADED"

    response = served.client.embeddings.create(model="minilm-short", input=SENTENCES[0])

    after = status_of(served.http, "minilm-short")
    assert after["state"] == "READY"
    assert after["loads"] == before["loads"] + 1
    assert_same_embeddings(vectors(response), served.expected(SENTENCES[:1]))


# --- the model's settings: dimensions, truncation --------------------------------------------


def test_dimensions_truncate_then_renormalise_on_a_matryoshka_model(served: Served) -> None:
    response = served.client.embeddings.create(model="minilm-short", input=SENTENCES[:2],
                                               dimensions=64)

    full = served.reference.encode(SENTENCES[:2], normalize_embeddings=True)[:, :64]
    expected = full / np.linalg.norm(full, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors(response), expected, atol=1e-4)


@pytest.mark.parametrize(("model", "dimensions", "says"), [
    ("minilm", 64, "does not support 'dimensions'"),
    ("minilm-short", 385, "makes embeddings of 384"),
    ("minilm-short", 0, "positive integer"),
])
def test_dimensions_a_model_cannot_give_are_a_400_naming_the_param(
    served: Served, model: str, dimensions: int, says: str,
) -> None:
    response = served.http.post("/v1/embeddings", json={"model": model, "input": "hi",
                                                        "dimensions": dimensions})

    assert response.status_code == 400
    error = openai_error(response)
    assert error["param"] == "dimensions"
    assert error["type"] == "invalid_request_error"
    assert says in error["message"]


def test_truncate_false_refuses_a_longer_text_and_its_token_ids(served: Served) -> None:
    long_text = SENTENCES[1] + " " + SENTENCES[4]
    assert len(served.tokens([long_text], max_length=512)[0]) > 16  # the model takes 16

    by_text = served.http.post("/v1/embeddings", json={"model": "minilm-short",
                                                       "input": ["short", long_text]})
    by_ids = served.http.post("/v1/embeddings", json={
        "model": "minilm-short", "input": served.tokens([long_text], max_length=512)})
    fits = served.client.embeddings.create(model="minilm-short", input="short")

    assert by_text.status_code == 400
    assert by_ids.status_code == 400
    assert "row 1" in openai_error(by_text)["message"]
    assert "truncate = false" in openai_error(by_ids)["message"]
    assert_same_embeddings(vectors(fits), served.expected(["short"]))


# --- bad requests, in OpenAI's error shape ---------------------------------------------------


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "minilm", "input": ""}, "input"),
    ({"model": "minilm", "input": []}, "input"),
    ({"model": "minilm", "input": ["fine", ""]}, "input"),
    ({"model": "minilm", "input": ["text", 101]}, "input"),
    ({"model": "minilm", "input": [[101, 102], "text"]}, "input"),
    ({"model": "minilm", "input": [[]]}, "input"),
    ({"model": "minilm", "input": [-1, 5]}, "input"),
    ({"model": "minilm", "input": [True, 5]}, "input"),
    ({"model": "minilm", "input": ["x"] * (MAX_INPUTS + 1)}, "input"),
    ({"model": "minilm"}, "input"),
    ({"input": "text"}, "model"),
    ({"model": 7, "input": "text"}, "model"),
    ({"model": "minilm", "input": "text", "encoding_format": "int8"}, "encoding_format"),
    ({"model": "minilm", "input": "text", "dimensions": "64"}, "dimensions"),
])
def test_bad_fields_are_400s_naming_the_param(
    served: Served, body: dict[str, Any], param: str,
) -> None:
    response = served.http.post("/v1/embeddings", json=body)

    assert response.status_code == 400, response.text
    error = openai_error(response)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_a_body_that_is_not_a_json_object_is_a_400(served: Served) -> None:
    for content in (b"{not json", b"[1, 2]"):
        response = served.http.post("/v1/embeddings", content=content)
        assert response.status_code == 400
        assert openai_error(response)["type"] == "invalid_request_error"


def test_a_token_id_outside_the_vocabulary_is_a_400(served: Served) -> None:
    with pytest.raises(openai.BadRequestError, match="outside"):
        served.client.embeddings.create(model="minilm", input=[[101, 10**9, 102]])


@pytest.mark.parametrize("model", ["nope", "mlp"])
def test_unknown_models_and_models_that_do_not_embed_are_404_model_not_found(
    served: Served, model: str,
) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        served.client.embeddings.create(model=model, input="text")

    assert raised.value.code == "model_not_found"
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["param"] == "model"


def test_the_roles_apply_401_without_a_key_and_403_for_readonly(served: Served) -> None:
    url = f"{served.daemon.url}/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="snz_wrong", max_retries=0).embeddings.create(
            model="minilm", input="text")
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=url, api_key=READ_KEY, max_retries=0).embeddings.create(
            model="minilm", input="text")
    # readonly may list the models
    listed = openai.OpenAI(base_url=url, api_key=READ_KEY, max_retries=0).models.list()
    assert [model.id for model in listed.data] == ["minilm", "minilm-short", "minilm-dense"]


def test_a_model_with_modules_snoozeml_does_not_run_fails_saying_which(served: Served) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        served.client.with_options(max_retries=0).embeddings.create(model="minilm-dense",
                                                                    input="text")

    assert raised.value.status_code == 503
    assert "Dense" in raised.value.message
    assert status_of(served.http, "minilm-dense")["state"] == "FAILED"


def test_a_wrong_method_is_a_405_in_openai_shape(served: Served) -> None:
    response = served.http.get("/v1/embeddings")

    assert response.status_code == 405
    assert openai_error(response)["type"] == "invalid_request_error"


# --- /v1/models, metrics ----------------------------------------------------------------------


def test_v1_models_lists_the_models_that_embed_and_retrieves_one(served: Served) -> None:
    listed = served.client.models.list()
    one = served.client.models.retrieve("minilm")

    assert [model.id for model in listed.data] == ["minilm", "minilm-short", "minilm-dense"]
    assert all(model.object == "model" and model.owned_by == "snoozeml" for model in listed.data)
    assert one.id == "minilm"
    assert one.created > 0
    for name in ("mlp", "nope"):
        with pytest.raises(openai.NotFoundError):
            served.client.models.retrieve(name)


def test_embeddings_calls_are_counted_under_their_operation_and_model(served: Served) -> None:
    served.client.embeddings.create(model="minilm", input="count me")

    metrics = served.http.get("/metrics").text

    line = next(line for line in metrics.splitlines()
                if line.startswith("snooze_requests_total{")
                and 'operation="embeddings"' in line and 'model="minilm"' in line
                and 'code="200"' in line)
    assert float(line.rsplit(" ", 1)[1]) >= 1
