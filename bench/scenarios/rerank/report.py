"""The rerank scenario's report: pairs/s of every route and ceiling, and the ratios paired
within each round."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from harness.report import table
from harness.rounds import median_or_nan, spread

from scenarios.embeddings.infinity import InfinitySetup
from scenarios.rerank.model import COHERE, TEI, Target
from scenarios.rerank.runs import (
    CEIL_FORWARD,
    CEIL_REQUEST,
    CEIL_SORTED,
    CEILINGS,
    CeilingRun,
    Run,
)


@dataclass
class Setting:
    """What the report says about the run besides its numbers."""

    lengths: list[int]  # tokens per pair (query and document, as CrossEncoder tokenizes them)
    requests: int  # distinct request bodies
    infinity: InfinitySetup
    infinity_versions: str
    batching: dict[str, int]  # the entry's [batching] table
    diffs: dict[str, float]  # the largest difference from CrossEncoder.predict, by route
    graph: Path | None  # the ONNX export, when a server runs it
    targets: list[Target] = field(default_factory=list)  # the rows, in order


def ratios(runs: Sequence[Run], ceilings: Sequence[CeilingRun], top: str, bottom: str,
           rounds: int) -> list[float]:
    """Per round: pairs/s of ``top`` over ``bottom`` (a route, or a ceiling label)."""
    def rate(name: str, round_no: int) -> float | None:
        for r in runs:
            if r.server == name and r.round == round_no:
                return r.pairs_per_s
        for c in ceilings:
            if c.label == name and c.round == round_no:
                return c.pairs_per_s
        return None

    values = []
    for round_no in range(rounds):
        a, b = rate(top, round_no), rate(bottom, round_no)
        if a is not None and b:
            values.append(a / b)
    return values


def notes(setting: Setting, args: argparse.Namespace) -> list[str]:
    import sentence_transformers

    lengths, infinity = setting.lengths, setting.infinity
    batching = ", ".join(f"`{k} = {v}`" for k, v in setting.batching.items()) or \
        "at the defaults"
    return [
        f"torch {torch.__version__}",
        f"{args.rounds} round(s); each route: c{args.concurrency[0]} clients of "
        f"`scenarios/rerank/load.py` (closed loop, one JSON body per line of a file in turn), "
        f"{args.warm_up:g} s warm-up then {args.duration:g} s measured in the same run "
        "(each request counted for the share of its time inside the window), then drained; "
        "routes and ceilings alternate, the order reversed every other round",
        f"requests: {setting.requests} distinct, each a short query and {args.documents} "
        f"documents of the embeddings corpus ({args.sentences} sentences); pairs of "
        f"{min(lengths)}-{max(lengths)} tokens (mean {statistics.mean(lengths):.1f})",
        "model: all-MiniLM-L6-v2's weights under a seeded one-label "
        "`BertForSequenceClassification` head, a Hugging Face folder",
        *snooze_notes(setting, args, batching),
        f"infinity: {infinity.note}"
        + (f"; {setting.infinity_versions}; `--engine torch --dtype float32 --batch-size 32 "
           f"--no-bettertransformer --no-compile --no-vector-disk-cache`, "
           f"`OMP_NUM_THREADS={args.threads}`" if infinity.executable else ""),
        *optimum_notes(setting, args),
        f"ceiling: sentence-transformers {sentence_transformers.__version__} "
        f"`CrossEncoder(folder).predict` in the bench process, "
        f"`torch.set_num_threads({args.threads})`, no HTTP: each request's pairs in one call, "
        "and four requests' pairs in one call of `batch_size=32` (predict sorts them by length)",
        "scores checked against `CrossEncoder.predict` (sigmoids) before and after the load, "
        "max abs difference: " + ", ".join(f"{k} {v:.1e}" for k, v in setting.diffs.items()),
    ]


def snooze_notes(setting: Setting, args: argparse.Namespace, batching: str) -> list[str]:
    """How the daemon served each format it measured."""
    common = (f"`task = \"text-classification\"`, `tokenize = true`, "
              f"`intra_op_threads = {args.threads}`, batching {batching}, preloaded, pinned")
    engines = {t.engine for t in setting.targets if t.snooze}
    notes = []
    if "torch" in engines:
        notes.append(f"SnoozeML torch: the folder, `format = \"torch\"`, {common}")
    if "ONNX" in engines:
        notes.append(f"SnoozeML ONNX: its export (`torch.onnx.export`, opset 17, dynamic batch "
                     f"and sequence; input_ids, attention_mask, token_type_ids -> logits; "
                     f"config.json and tokenizer.json beside it: `{setting.graph}`), "
                     f"`format = \"onnx\"`, {common}")
    return notes


def optimum_notes(setting: Setting, args: argparse.Namespace) -> list[str]:
    if not any(t.engine == "optimum" for t in setting.targets):
        return []
    return [f"infinity optimum: the same command with `--engine optimum "
            f"--onnx-do-not-prefer-quantized --pooling-method mean`, serving a hard-linked copy "
            f"of the ONNX export's folder (the same graph; infinity's own optimiser step fails "
            f"with optimum 2, it logs, and it serves the graph as exported); onnxruntime held "
            f"to {args.threads} intra-op thread(s) by a "
            f"`sitecustomize` on its `PYTHONPATH` (infinity passes no session options, and "
            f"onnxruntime would take a thread per physical core). Its cross-encoder tokenizes "
            f"with `return_token_type_ids=False`, so optimum feeds segment ids of 0: its scores "
            f"differ from CrossEncoder's (the difference below is reported, not enforced); the "
            f"work per pair is the same"]


def rate_rows(runs: Sequence[Run], ceilings: Sequence[CeilingRun],
              targets: Sequence[Target]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for server in [t.label for t in targets]:
        rs = [r for r in runs if r.server == server]
        if not rs:
            continue
        formed = [r.rows_per_batch for r in rs if r.rows_per_batch is not None]
        rows.append((
            server, spread([r.pairs_per_s for r in rs], ",.1f"),
            f"{median_or_nan([r.counted_pairs_per_s for r in rs]):,.1f}",
            f"{median_or_nan([r.p50_ms for r in rs]):,.0f}",
            f"{median_or_nan([r.p99_ms for r in rs]):,.0f}",
            f"{statistics.median(formed):.1f}" if formed else "—",
            f"{median_or_nan([r.server_cores for r in rs]):.2f}",
            f"{median_or_nan([r.server_ms_per_pair for r in rs]):.2f}",
            f"{median_or_nan([r.client_cores for r in rs]):.2f}",
            spread([r.foreign_cores for r in rs], ".2f"), sum(r.errors for r in rs)))
    for label in CEILINGS:
        cs = [c for c in ceilings if c.label == label]
        if cs:
            rows.append((f"ceiling: {label}", spread([c.pairs_per_s for c in cs], ",.1f"), "",
                         f"{median_or_nan([c.p50_call_ms for c in cs]):,.0f} per call",
                         "", "", "", "", "", spread([c.foreign_cores for c in cs], ".2f"), ""))
    return rows


def ratio_pairs(targets: Sequence[Target]) -> list[tuple[str, str, str]]:
    """(top, bottom, label) of every ratio: each SnoozeML row ÷ each infinity row, ONNX ÷
    torch on each route, /v1/rerank ÷ /rerank on each format, each row ÷ each ceiling."""
    snooze = [t for t in targets if t.snooze]
    infinity = [t for t in targets if not t.snooze]
    pairs = [(s.label, i.label, f"{s.label} ÷ {i.label}") for s in snooze for i in infinity]
    by = {(t.route, t.engine): t.label for t in snooze}
    for route in (COHERE, TEI):
        if (route, "ONNX") in by and (route, "torch") in by:
            pairs.append((by[route, "ONNX"], by[route, "torch"],
                          f"{by[route, 'ONNX']} ÷ {by[route, 'torch']}"))
    for engine in ("torch", "ONNX"):
        if (COHERE, engine) in by and (TEI, engine) in by:
            pairs.append((by[COHERE, engine], by[TEI, engine],
                          f"{by[COHERE, engine]} ÷ {by[TEI, engine]}"))
    if len(infinity) == 2:
        pairs.append((infinity[1].label, infinity[0].label,
                      f"{infinity[1].label} ÷ {infinity[0].label}"))
    for t in targets:
        pairs += [(t.label, CEIL_REQUEST, f"{t.label} ÷ ceiling {CEIL_REQUEST}"),
                  (t.label, CEIL_SORTED, f"{t.label} ÷ ceiling {CEIL_SORTED}"),
                  (t.label, CEIL_FORWARD, f"{t.label} ÷ ceiling {CEIL_FORWARD}")]
    return pairs


def report(header: list[str], runs: Sequence[Run], ceilings: Sequence[CeilingRun],
           setting: Setting, args: argparse.Namespace) -> str:
    lines = [*header[:-1], *(f"- {note}" for note in notes(setting, args)), ""]
    lines += table(["route", "pairs/s", "pairs/s counted", "p50 ms", "p99 ms", "rows/batch formed",
                    "server cores", "server CPU ms/pair", "client cores",
                    "rest of the machine, cores", "errors"],
                   rate_rows(runs, ceilings, setting.targets),
                   "lrrrrrrrrrr")
    others = [r.other_cpu_s / r.duration_s for r in runs]
    lines += [
        "",
        f"*pairs/s*: {args.documents} times the requests of the run, each counted for the share "
        "of its time (sent to answered) inside the window, over the window: in a closed loop, "
        "the clients over the mean latency (Little's law); median (min to max) over rounds. "
        f"*pairs/s counted*: {args.documents} times the answers that arrived within the "
        "window, over the window (median): it rounds to whole groups of answers at the "
        "window's edges. *rows/batch formed*: Δrows ÷ Δbatches of `/admin/status` over the "
        "run. "
        "*server cores*: CPU seconds of the server's process tree per second of the window; "
        "*client cores*: load.py's. The idle server beside the measured one used "
        f"{max(others, default=0):.2f} cores at most. *rest of the machine*: the machine's "
        "busy CPU time minus the servers', load.py's and this script's, per second (median, "
        "min to max): other work sharing the cores. A pytest process was running at the start "
        f"of {sum(r.pytest for r in runs)} of {len(runs)} runs.",
        "",
        "Ratios of pairs/s, paired within each round (median, min to max):",
        "",
    ]
    pairs = ratio_pairs(setting.targets)
    rows = []
    for top, bottom, label in pairs:
        cell = spread(ratios(runs, ceilings, top, bottom, args.rounds), ".2f")
        if cell != "—":
            rows.append((label, cell))
    lines += table(["ratio", f"c{args.concurrency[0]}, {args.documents} documents a request"],
                   rows, "ll")
    return "\n".join(lines) + "\n"
