"""The embeddings scenario's corpus and requests: deterministic sentences, their bodies for
``/v1/embeddings`` and OIP infer, and the checks of every route's answers against
sentence-transformers."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

MODEL = "minilm"
MODEL_ONNX = "minilm-onnx"
ATOL = 1e-4
V1, OIP, INFINITY = "v1", "oip", "infinity"  # the routes
PATHS = {V1: "/v1/embeddings", OIP: "OIP infer (text)", INFINITY: "/v1/embeddings"}
SHAPES = ("one", "batch")


@dataclass(frozen=True)
class Target:
    """One measured server: a route, the model it names and the engine behind it."""

    route: str  # V1, OIP (the daemon's) or INFINITY
    engine: str  # the daemon's "torch" or "ONNX"; infinity's "torch" or "optimum"

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

_SUBJECTS = (
    "The new library downtown", "Our support team", "A small startup in Lisbon",
    "The city council", "My neighbour", "The latest firmware update", "Most of our customers",
    "The research group", "This old recipe", "The morning train to the airport",
    "A volunteer from the shelter", "The quarterly report", "Her grandmother",
    "The hospital's night shift", "An independent bookshop", "The football club",
    "The weather service", "A teacher in the village school", "The mobile app",
    "The museum's new wing",
)
_VERBS = (
    "announced", "explained", "quietly improved", "was asked to review", "keeps postponing",
    "finally delivered", "has been testing", "recommended", "described", "could not find",
    "is still discussing", "carefully documented", "shared", "rebuilt", "questioned",
)
_OBJECTS = (
    "a faster way to sort invoices", "the results of the annual survey",
    "two new bus routes through the old town", "a shorter form for refunds",
    "the plan to open on Sundays", "a cheaper battery for electric bikes",
    "the broken heating in the east building", "a list of safe hiking trails",
    "how the new parking rules work", "a recipe for bread without yeast",
    "the noise coming from the construction site", "the missing pages of the manuscript",
    "an app that translates menus", "the cost of repairing the bridge",
    "a better schedule for the night nurses",
)
_TAILS = (
    "after a long meeting on Tuesday", "because the old servers kept failing",
    "although nobody expected it to happen this year", "while the rain kept falling outside",
    "and the first reactions have been mostly positive", "before the end of the quarter",
    "so that families can plan their weekends", "despite a few complaints from local shops",
    "with help from students at the university", "which should save everyone some time",
    "but the details will only be published next month", "as soon as the budget was approved",
    "in a short note to everyone on the mailing list", "after years of waiting",
    "even though the deadline had already passed twice",
    "to make the service easier for older people to use",
)
MIN_WORDS = 8
MAX_WORDS = 40


def corpus(count: int, seed: int = 18) -> list[str]:
    """``count`` sentences of 8 to 40 words: subject, verb, object, then clauses up to a length
    drawn for each sentence. The same seed gives the same sentences."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(count):
        target = rng.randint(MIN_WORDS, MAX_WORDS)
        words = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}".split()
        tails = list(_TAILS)
        rng.shuffle(tails)
        for tail in tails:
            if len(words) >= target:
                break
            if len(words) + len(tail.split()) <= MAX_WORDS:
                words += tail.split()
        while len(words) < MIN_WORDS:
            words.append("today")
        sentences.append(" ".join(words) + ".")
    return sentences


def batches_of(sentences: Sequence[str], size: int) -> list[list[str]]:
    """Batches of ``size`` consecutive sentences, starting every ``size // 4`` sentences
    (wrapping around), so batch bodies are many and differ."""
    step = max(1, size // 4)
    n = len(sentences)
    return [[sentences[(start + k) % n] for k in range(size)] for start in range(0, n, step)]


# --- request bodies ------------------------------------------------------------------------


def v1_body(texts: str | list[str], model: str = MODEL) -> dict[str, Any]:
    return {"model": model, "input": texts}


def oip_body(texts: list[str]) -> dict[str, Any]:
    return {
        "inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}],
        "outputs": [{"name": "embedding"}],
    }


def body_lines(target: Target, shape: str, sentences: Sequence[str], batch: int) -> list[str]:
    """One JSON body per sentence (``one``) or per batch; one line each, for the Lua script."""
    if shape == "one":
        if target.route == OIP:
            return [json.dumps(oip_body([s])) for s in sentences]
        return [json.dumps(v1_body(s, target.model)) for s in sentences]
    groups = batches_of(sentences, batch)
    if target.route == OIP:
        return [json.dumps(oip_body(g)) for g in groups]
    return [json.dumps(v1_body(g, target.model)) for g in groups]



def has_v1(client: httpx.Client, model: str = MODEL) -> bool:
    """Whether the daemon serves /v1/embeddings (it answers 404 without the route)."""
    return client.post("/v1/embeddings", json=v1_body("probe", model)).status_code != 404


# --- answers -------------------------------------------------------------------------------


def v1_embeddings(client: httpx.Client, texts: str | list[str],
                  model: str = MODEL) -> np.ndarray:
    response = client.post("/v1/embeddings", json=v1_body(texts, model))
    if response.status_code != 200:
        raise RuntimeError(f"/v1/embeddings: {response.status_code} {response.text[:500]}")
    doc = response.json()
    count = 1 if isinstance(texts, str) else len(texts)
    data = doc["data"]
    if doc.get("object") != "list" or len(data) != count:
        raise RuntimeError(f"/v1/embeddings: {len(data)} embeddings for {count} inputs")
    if [d["index"] for d in data] != list(range(count)):
        raise RuntimeError(f"/v1/embeddings: indexes {[d['index'] for d in data]}")
    if doc.get("usage", {}).get("prompt_tokens", 0) <= 0:
        raise RuntimeError(f"/v1/embeddings: usage {doc.get('usage')}")
    return np.asarray([d["embedding"] for d in data], dtype=np.float32)


def oip_embeddings(client: httpx.Client, texts: list[str], model: str = MODEL) -> np.ndarray:
    response = client.post(f"/v2/models/{model}/infer", json=oip_body(texts))
    if response.status_code != 200:
        raise RuntimeError(f"OIP infer: {response.status_code} {response.text[:500]}")
    out = response.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def check_server(target: Target, base_url: str, sentences: Sequence[str],
                 expected: np.ndarray, batch: int) -> float:
    """Three sentences alone and one batch of ``batch`` through the server's route equal
    sentence-transformers' embeddings; returns the largest difference."""
    name, model, oip = target.label, target.model, target.route == OIP
    worst = 0.0
    with httpx.Client(base_url=base_url, timeout=120.0) as http:
        for row in range(3):
            if oip:
                got = oip_embeddings(http, [sentences[row]], model)
            else:
                got = v1_embeddings(http, sentences[row], model)
            worst = max(worst, float(np.abs(got - expected[row : row + 1]).max()))
        texts = list(sentences[:batch])
        got = oip_embeddings(http, texts, model) if oip else v1_embeddings(http, texts, model)
        worst = max(worst, float(np.abs(got - expected[:batch]).max()))
    if worst > ATOL:
        raise RuntimeError(f"{name}: embeddings differ from sentence-transformers by {worst:.2e}")
    return worst

