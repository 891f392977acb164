"""What the model's own work allows at each batch size a server can form: MiniLM's sentence
embeddings and the MiniLM cross-encoder's pairs, forward passes only (issue 32).

For each batch size, the inputs are cut into batches of that many rows (embeddings: the
shuffled corpus of the embeddings scenario; rerank: the rerank scenario's requests, 32 pairs
each, so 32 is one request's pairs and 128 four requests'), each batch tokenized beforehand,
sorted by length and cut into runs of at most 512 padded tokens as the daemon cuts them
(runtime/text/by_length.py), then run back to back under ``torch.inference_mode`` on
``--threads`` threads for ``--duration`` seconds: no tokenizing, no HTTP, no queue. Sizes
alternate within each of ``--rounds`` rounds.

It answers what the embeddings and rerank scenarios cannot: how many rows per second any server
of this engine and thread count can answer, given the batches its load lets it form. At c32 with
one sentence a request the daemon forms batches of 16 rows, at c4 with 32 sentences 64 rows,
at c16 with 32 pairs 128 rows (see those scenarios' *rows/batch formed*).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from harness.cli import Bench
from harness.report import Outcome, table

from scenarios.embeddings.corpus import corpus
from scenarios.embeddings.runs import sorted_runs as sentence_runs
from scenarios.minilm import MINILM
from scenarios.rerank.model import build_folder, requests
from scenarios.rerank.runs import sorted_runs as pair_runs

EMBED_SIZES = (16, 32, 64, 128, 512)
PAIR_SIZES = (32, 64, 128)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")


Prepared = list[list[dict[str, Any]]]  # batches, each its runs


def embed_batches(model: Any, size: int) -> Prepared:
    sentences = corpus(512)
    random.Random(size).shuffle(sentences)
    return [sentence_runs(model, sentences[i:i + size]) for i in range(0, len(sentences), size)]


def pair_batches(model: Any, size: int) -> Prepared:
    pairs = [pair for r in requests(512, 32) for pair in r.pairs]
    return [pair_runs(model, pairs[i:i + size]) for i in range(0, len(pairs) - size + 1, size)]


def rate(forward: Callable[[dict[str, Any]], Any], batches: Prepared, seconds: float) -> float:
    """Rows per second of `forward` over `batches`, back to back for `seconds`."""
    done = 0
    start = time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - start < seconds:
            for runs in batches:
                for run in runs:
                    forward(dict(run))
                done += sum(int(run["input_ids"].shape[0]) for run in runs)
    return done / (time.perf_counter() - start)


def measure(name: str, forward: Callable[[dict[str, Any]], Any],
            prepared: dict[int, Prepared], rounds: int, seconds: float) -> dict[int, list[float]]:
    rates: dict[int, list[float]] = {size: [] for size in prepared}
    for round_no in range(rounds):
        sizes = list(prepared) if round_no % 2 == 0 else list(reversed(prepared))
        for size in sizes:
            rates[size].append(rate(forward, prepared[size], seconds))
            print(f"round {round_no} {name} {size} rows: {rates[size][-1]:,.1f} rows/s",
                  file=sys.stderr)
    return rates


def rows(name: str, rates: dict[int, list[float]]) -> list[Sequence[object]]:
    return [(name, size, f"{statistics.median(found):,.1f}",
             f"{min(found):,.1f} to {max(found):,.1f}") for size, found in rates.items()]


def run(bench: Bench) -> Outcome:
    args = bench.args
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import CrossEncoder, SentenceTransformer

    embedder = SentenceTransformer(str(MINILM), device="cpu").eval()  # no dropout
    folder = bench.workdir / "cross-encoder"
    folder.mkdir()
    build_folder(folder)
    reranker = CrossEncoder(str(folder), device="cpu")
    reranker.model.eval()
    embed = measure("embeddings", embedder.forward,
                    {s: embed_batches(embedder, s) for s in EMBED_SIZES}, args.rounds,
                    args.duration)
    pairs = measure("pairs", lambda run: reranker.model(**run),
                    {s: pair_batches(reranker, s) for s in PAIR_SIZES}, args.rounds,
                    args.duration)
    lines = bench.header(
        "### The model's own forward passes at each batch size",
        f"torch {torch.__version__}, {args.threads} thread(s); {args.rounds} rounds of "
        f"{args.duration:g} s per size, sizes alternating",
        "embeddings: all-MiniLM-L6-v2 (SentenceTransformer's modules), the embeddings "
        "scenario's 512 sentences shuffled; pairs: the rerank scenario's cross-encoder and "
        "requests (32 pairs each); each batch sorted and cut into runs of 512 padded tokens")
    lines += table(["model", "rows a batch", "rows/s (median)", "range"],
                   [*rows("MiniLM embeddings", embed), *rows("MiniLM cross-encoder", pairs)],
                   "lrrr")
    return Outcome("\n".join(lines) + "\n", {"embeddings": embed, "pairs": pairs})
