"""`snooze scan --write` on a cross-encoder published as the Hub lays it out (config.json,
model.safetensors and the tokenizer at the top, the ONNX export in onnx/model.onnx): the two
entries it writes, served as written by the real daemon, rerank as sentence-transformers'
CrossEncoder scores the pairs in this process, over /v1/rerank and over OIP's text and
text_pair. The model is tests/support/cross_encoder_models.py's, made once for the module."""

from __future__ import annotations

import contextlib
import io
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from cross_encoder_models import build_cross_encoder, export_cross_encoder, save_cross_encoder
from sentence_transformers import CrossEncoder

from snoozeml.cli import exit_codes
from snoozeml.cli.main import main

QUERY = "How do cats spend their day?"
DOCUMENTS = [
    "Cats sleep for twelve to sixteen hours a day, mostly in short naps.",
    "The stock market closed higher on Friday after a volatile week.",
    "A kitten plays with a ball of yarn before curling up to sleep.",
]
ROLE = "a reranker on /v1/rerank, /v2/rerank and /rerank"


@dataclass
class Scanned:
    entries: dict[str, dict[str, Any]]
    printed: str
    http: httpx.Client
    logits: np.ndarray  # CrossEncoder's raw scores of (QUERY, each document)


@pytest.fixture(scope="module")
def scanned(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scanned]:
    folder = tmp_path_factory.mktemp("scan-rerankers")
    repo = folder / "models" / "ms-marco-tiny"
    model = build_cross_encoder()
    save_cross_encoder(repo, model)
    export_cross_encoder(repo / "onnx", model)
    for extra in (repo / "onnx").iterdir():  # the Hub keeps only the graph in onnx/
        if extra.name != "model.onnx":
            extra.unlink()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["scan", str(repo.parent), "--write", str(folder / "scanned.toml")])
    assert code == exit_codes.OK
    body = (folder / "scanned.toml").read_text()
    daemon = module_serve(body, directory=folder)
    reference = CrossEncoder(str(repo), device="cpu")
    logits = np.asarray(reference.predict([(QUERY, d) for d in DOCUMENTS],
                                          activation_fn=torch.nn.Identity()))
    entries = {m["name"]: m for m in tomllib.loads(body)["models"]}
    with httpx.Client(base_url=daemon.url, timeout=120) as http:
        yield Scanned(entries, printed.getvalue(), http, logits)


def test_scan_writes_both_layouts_as_rerankers_and_says_so(scanned: Scanned) -> None:
    assert sorted(scanned.entries) == ["ms-marco-tiny", "ms-marco-tiny-onnx"]
    for name, entry in scanned.entries.items():
        assert (entry["task"], entry["tokenize"]) == ("text-classification", True), name
        assert f"added {name} ({entry['format']}, {ROLE}) to " in scanned.printed
    models = scanned.http.get("/v1/models").json()["data"]
    assert {m["id"]: m["capabilities"] for m in models} == {
        "ms-marco-tiny": ["rerank"], "ms-marco-tiny-onnx": ["rerank"]}


@pytest.mark.parametrize("name", ["ms-marco-tiny", "ms-marco-tiny-onnx"])
def test_the_written_entry_reranks_as_cross_encoder_does(scanned: Scanned, name: str) -> None:
    answer = scanned.http.post("/v1/rerank", json={
        "model": name, "query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    scores = {r["index"]: r["relevance_score"] for r in results}
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))],
                               1 / (1 + np.exp(-scanned.logits.astype(np.float64))), atol=1e-5)

    pairs = scanned.http.post(f"/v2/models/{name}/infer", json={"inputs": [
        {"name": "text", "shape": [1], "datatype": "BYTES", "data": [QUERY]},
        {"name": "text_pair", "shape": [1], "datatype": "BYTES", "data": [DOCUMENTS[0]]}]})
    assert pairs.status_code == 200, pairs.text
    [logits] = [o for o in pairs.json()["outputs"] if o["name"] == "logits"]
    assert logits["shape"] == [1, 1]
    np.testing.assert_allclose(logits["data"], scanned.logits[:1], atol=1e-5)
