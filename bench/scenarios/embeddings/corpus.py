"""The embeddings scenario's corpus and requests: deterministic sentences, their bodies for
``/v1/embeddings`` and OIP infer, and the checks of every route's answers against
sentence-transformers."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

MODEL = "minilm"
ATOL = 1e-4
SNOOZE_V1 = "SnoozeML /v1/embeddings"
SNOOZE_OIP = "SnoozeML OIP infer (text)"
INFINITY = "infinity /v1/embeddings"
SERVED = (SNOOZE_V1, SNOOZE_OIP, INFINITY)
SHAPES = ("one", "batch")

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


def v1_body(texts: str | list[str]) -> dict[str, Any]:
    return {"model": MODEL, "input": texts}


def oip_body(texts: list[str]) -> dict[str, Any]:
    return {
        "inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}],
        "outputs": [{"name": "embedding"}],
    }


def body_lines(server: str, shape: str, sentences: Sequence[str], batch: int) -> list[str]:
    """One JSON body per sentence (``one``) or per batch; one line each, for the Lua script."""
    if shape == "one":
        if server == SNOOZE_OIP:
            return [json.dumps(oip_body([s])) for s in sentences]
        return [json.dumps(v1_body(s)) for s in sentences]
    groups = batches_of(sentences, batch)
    if server == SNOOZE_OIP:
        return [json.dumps(oip_body(g)) for g in groups]
    return [json.dumps(v1_body(g)) for g in groups]



def has_v1(client: httpx.Client) -> bool:
    """Whether the daemon serves /v1/embeddings (it answers 404 without the route)."""
    return client.post("/v1/embeddings", json=v1_body("probe")).status_code != 404


# --- answers -------------------------------------------------------------------------------


def v1_embeddings(client: httpx.Client, texts: str | list[str]) -> np.ndarray:
    response = client.post("/v1/embeddings", json=v1_body(texts))
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


def oip_embeddings(client: httpx.Client, texts: list[str]) -> np.ndarray:
    response = client.post(f"/v2/models/{MODEL}/infer", json=oip_body(texts))
    if response.status_code != 200:
        raise RuntimeError(f"OIP infer: {response.status_code} {response.text[:500]}")
    out = response.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def check_server(name: str, base_url: str, sentences: Sequence[str], expected: np.ndarray,
                 batch: int) -> float:
    """Three sentences alone and one batch of ``batch`` through the server's route equal
    sentence-transformers' embeddings; returns the largest difference."""
    worst = 0.0
    with httpx.Client(base_url=base_url, timeout=120.0) as http:
        for row in range(3):
            if name == SNOOZE_OIP:
                got = oip_embeddings(http, [sentences[row]])
            else:
                got = v1_embeddings(http, sentences[row])
            worst = max(worst, float(np.abs(got - expected[row : row + 1]).max()))
        texts = list(sentences[:batch])
        got = oip_embeddings(http, texts) if name == SNOOZE_OIP else v1_embeddings(http, texts)
        worst = max(worst, float(np.abs(got - expected[:batch]).max()))
    if worst > ATOL:
        raise RuntimeError(f"{name}: embeddings differ from sentence-transformers by {worst:.2e}")
    return worst

