"""The embeddings scenario's report: sentences/s of every server, shape and ceiling, and the
ratios paired within each round."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from harness.report import table
from harness.rounds import median_or_nan, spread

from scenarios.embeddings.corpus import OIP, SHAPES, V1, Target
from scenarios.embeddings.infinity import InfinitySetup
from scenarios.embeddings.runs import (
    CEIL_ARRIVAL,
    CEIL_FORWARD,
    CEIL_SORTED,
    CEILINGS,
    CeilingRun,
    Run,
)


@dataclass
class Setting:
    """What the report says about the run besides its numbers."""

    lengths: list[int]  # tokens per sentence
    words: list[int]
    infinity: InfinitySetup
    infinity_versions: str
    v1: bool  # the daemon served /v1/embeddings
    diffs: dict[str, float]  # the largest difference from sentence-transformers, by route
    graph: Path | None  # the ONNX export, when a server runs it
    targets: list[Target] = field(default_factory=list)  # the servers, in order


def ratios(runs: Sequence[Run], ceilings: Sequence[CeilingRun], top: str, bottom: str,
           shape: str, rounds: int) -> list[float]:
    """Per round: sentences/s of ``top`` over ``bottom`` (a server, or a ceiling label)."""
    def rate(name: str, round_no: int) -> float | None:
        for r in runs:
            if r.server == name and r.shape == shape and r.round == round_no:
                return r.sentences_per_s
        for c in ceilings:
            if c.label == name and c.round == round_no:
                return c.sentences_per_s
        return None

    values = []
    for round_no in range(rounds):
        a, b = rate(top, round_no), rate(bottom, round_no)
        if a is not None and b:
            values.append(a / b)
    return values


def notes(setting: Setting, args: argparse.Namespace) -> list[str]:
    import sentence_transformers

    lengths, words, infinity = setting.lengths, setting.words, setting.infinity
    return [
        f"torch {torch.__version__}",
        f"{args.rounds} round(s); each run {args.warm_up:g} s warm-up then {args.duration:g} s "
        "measured with wrk `-t1` (Lua script cycling through distinct bodies); servers and the "
        "ceiling alternate, the order reversed every other round",
        f"corpus: {len(lengths)} sentences of {min(words)}-{max(words)} words, "
        f"{min(lengths)}-{max(lengths)} tokens (mean {statistics.mean(lengths):.1f})",
        f"`one`: 1 sentence per request at c{args.concurrency[0]}; `batch`: {args.batch} "
        f"sentences per request at c{args.batch_concurrency}",
        f"SnoozeML {engines_of(setting)}: " + formats_of(setting)
        + "`task = \"feature-extraction\"`, `tokenize = true`, "
        f"`intra_op_threads = {args.threads}`, batching "
        + (f"`max_batch_size = {args.max_batch_size or 'default'}`, `max_batch_tokens = "
           f"{args.max_batch_tokens or 'default'}`" if args.max_batch_size or args.max_batch_tokens
           else "at the defaults") + " (`max_delay = 0`), preloaded, pinned"
        + ("" if setting.v1 else "; **/v1/embeddings was not served by this tree (404): its "
           "rows are missing**"),
        f"infinity: {infinity.note}"
        + (f"; {setting.infinity_versions}; `--engine torch --dtype float32 --batch-size 32 "
           f"--no-bettertransformer --no-compile --no-vector-disk-cache`, "
           f"`OMP_NUM_THREADS={args.threads}`" if infinity.executable else ""),
        *optimum_notes(setting, args),
        f"ceiling: sentence-transformers {sentence_transformers.__version__} in the bench "
        f"process, `torch.set_num_threads({args.threads})`, no HTTP",
        "answers checked against sentence-transformers before and after the load, max abs "
        "difference: " + ", ".join(f"{k} {v:.1e}" for k, v in setting.diffs.items()),
    ]


def engines_of(setting: Setting) -> str:
    return " and ".join(sorted({t.engine for t in setting.targets if t.snooze}, reverse=True))


def formats_of(setting: Setting) -> str:
    """The entry's format (and model) of each engine the daemon ran."""
    engines = {t.engine for t in setting.targets if t.snooze}
    parts = []
    if "torch" in engines:
        parts.append("torch: `format = \"torch\"` (MiniLM's folder)")
    if "ONNX" in engines:
        parts.append(f"ONNX: `format = \"onnx\"` (its export `{setting.graph}`: "
                     "`torch.onnx.export`, opset 17, outputs last_hidden_state and "
                     "sentence_embedding; pooling and `normalize` from the folder: mean, "
                     "normalised)")
    return "; ".join(parts) + "; both " if len(parts) > 1 else (parts[0] + ", " if parts else "")


def optimum_notes(setting: Setting, args: argparse.Namespace) -> list[str]:
    if not any(t.engine == "optimum" for t in setting.targets):
        return []
    return [f"infinity optimum: the same command with `--engine optimum "
            f"--onnx-do-not-prefer-quantized --pooling-method mean`, serving a hard-linked copy "
            f"of the ONNX export's folder (the same graph; infinity's own optimiser step fails "
            f"with optimum 2, it logs, and it serves the graph as exported; it mean-pools "
            f"`last_hidden_state` itself); onnxruntime held to "
            f"{args.threads} intra-op thread(s) by a `sitecustomize` on its `PYTHONPATH` "
            f"(infinity passes no session options, and onnxruntime would take a thread per "
            f"physical core)"]


def rate_rows(runs: Sequence[Run], ceilings: Sequence[CeilingRun],
              targets: Sequence[Target]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for shape in SHAPES:
        for server in [t.label for t in targets]:
            rs = [r for r in runs if r.server == server and r.shape == shape]
            if not rs:
                continue
            formed = [r.rows_per_batch for r in rs if r.rows_per_batch is not None]
            rows.append((
                server, f"{shape} (c{rs[0].connections})",
                spread([r.sentences_per_s for r in rs], ",.1f"),
                f"{median_or_nan([r.p50_ms for r in rs]):,.1f}",
                f"{median_or_nan([r.p99_ms for r in rs]):,.1f}",
                f"{statistics.median(formed):.1f}" if formed else "—",
                f"{median_or_nan([r.server_cores for r in rs]):.2f}",
                f"{median_or_nan([r.server_ms_per_sentence for r in rs]):.2f}",
                f"{median_or_nan([r.client_cores for r in rs]):.2f}",
                spread([r.foreign_cores for r in rs], ".2f"), sum(r.errors for r in rs)))
    for label in CEILINGS:
        cs = [c for c in ceilings if c.label == label]
        rows.append((f"ceiling: {label}", "in process",
                     spread([c.sentences_per_s for c in cs], ",.1f"),
                     f"{median_or_nan([c.p50_batch_ms for c in cs]):,.1f} per batch",
                     "", "", "", "", "", spread([c.foreign_cores for c in cs], ".2f"), ""))
    return rows


def ratio_pairs(targets: Sequence[Target]) -> list[tuple[str, str, str]]:
    """(top, bottom, label) of every ratio: each SnoozeML server ÷ each infinity, ONNX ÷ torch
    on each route, /v1 ÷ OIP on each format, infinity optimum ÷ torch, each ÷ each ceiling."""
    snooze = [t for t in targets if t.snooze]
    infinity = [t for t in targets if not t.snooze]
    pairs = [(s.label, i.label, f"{s.label} ÷ {i.label}") for s in snooze for i in infinity]
    by = {(t.route, t.engine): t.label for t in snooze}
    for route in (V1, OIP):
        if (route, "ONNX") in by and (route, "torch") in by:
            pairs.append((by[route, "ONNX"], by[route, "torch"],
                          f"{by[route, 'ONNX']} ÷ {by[route, 'torch']}"))
    for engine in ("torch", "ONNX"):
        if (V1, engine) in by and (OIP, engine) in by:
            pairs.append((by[V1, engine], by[OIP, engine],
                          f"{by[V1, engine]} ÷ {by[OIP, engine]}"))
    if len(infinity) == 2:
        pairs.append((infinity[1].label, infinity[0].label,
                      f"{infinity[1].label} ÷ {infinity[0].label}"))
    for t in targets:
        pairs += [(t.label, CEIL_SORTED, f"{t.label} ÷ ceiling sorted"),
                  (t.label, CEIL_ARRIVAL, f"{t.label} ÷ ceiling in arrival order"),
                  (t.label, CEIL_FORWARD, f"{t.label} ÷ ceiling model forward only")]
    return pairs


def report(header: list[str], runs: Sequence[Run], ceilings: Sequence[CeilingRun],
           setting: Setting, args: argparse.Namespace) -> str:
    lines = [*header[:-1], *(f"- {note}" for note in notes(setting, args)), ""]
    lines += table(["server", "shape", "sentences/s", "p50 ms", "p99 ms", "rows/batch formed",
                    "server cores", "server CPU ms/sentence", "wrk cores",
                    "rest of the machine, cores", "errors"],
                   rate_rows(runs, ceilings, setting.targets),
                   "llrrrrrrrrr")
    others = [r.other_cpu_s / r.duration_s for r in runs]
    lines += [
        "",
        "Sentences/s: median (min to max) over rounds. *rows/batch formed*: Δrows ÷ Δbatches of "
        "`/admin/status` over the run. *server cores*: CPU seconds of the server's process "
        "tree per second; *wrk cores*: the client's. The idle server beside the measured one "
        f"used {max(others, default=0):.2f} cores at most. *rest of the machine*: the "
        "machine's busy CPU time minus the servers', wrk's and this script's, per second "
        "(median, min to max): other work sharing the two cores during the run. A pytest "
        f"process was running at the start of {sum(r.pytest for r in runs)} of {len(runs)} "
        "runs.",
        "",
        "Ratios of sentences/s, paired within each round (median, min to max):",
        "",
    ]
    pairs = ratio_pairs(setting.targets)
    rows = []
    for top, bottom, label in pairs:
        cells = [spread(ratios(runs, ceilings, top, bottom, shape, args.rounds), ".2f")
                 for shape in SHAPES]
        if any(cell != "—" for cell in cells):
            rows.append((label, *cells))
    lines += table(["ratio", "one", "batch"], rows, "lll")
    return "\n".join(lines) + "\n"
