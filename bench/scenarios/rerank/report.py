"""The rerank scenario's report: pairs/s of every route and ceiling, and the ratios paired
within each round."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from harness.report import table
from harness.rounds import median_or_nan, spread

from scenarios.embeddings.infinity import InfinitySetup
from scenarios.rerank.model import INFINITY, SERVED, SNOOZE_COHERE, SNOOZE_TEI
from scenarios.rerank.runs import CEIL_REQUEST, CEIL_SORTED, CEILINGS, CeilingRun, Run


@dataclass
class Setting:
    """What the report says about the run besides its numbers."""

    lengths: list[int]  # tokens per pair (query and document, as CrossEncoder tokenizes them)
    requests: int  # distinct request bodies
    infinity: InfinitySetup
    infinity_versions: str
    batching: dict[str, int]  # the entry's [batching] table
    diffs: dict[str, float]  # the largest difference from CrossEncoder.predict, by route


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
        f"SnoozeML: `format = \"torch\"`, `task = \"text-classification\"`, `tokenize = true`, "
        f"`intra_op_threads = {args.threads}`, batching {batching}, preloaded, pinned",
        f"infinity: {infinity.note}"
        + (f"; {setting.infinity_versions}; `--engine torch --dtype float32 --batch-size 32 "
           f"--no-bettertransformer --no-compile --no-vector-disk-cache`, "
           f"`OMP_NUM_THREADS={args.threads}`" if infinity.executable else ""),
        f"ceiling: sentence-transformers {sentence_transformers.__version__} "
        f"`CrossEncoder(folder).predict` in the bench process, "
        f"`torch.set_num_threads({args.threads})`, no HTTP: each request's pairs in one call, "
        "and four requests' pairs in one call of `batch_size=32` (predict sorts them by length)",
        "scores checked against `CrossEncoder.predict` (sigmoids) before and after the load, "
        "max abs difference: " + ", ".join(f"{k} {v:.1e}" for k, v in setting.diffs.items()),
    ]


def rate_rows(runs: Sequence[Run], ceilings: Sequence[CeilingRun]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for server in SERVED:
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


def report(header: list[str], runs: Sequence[Run], ceilings: Sequence[CeilingRun],
           setting: Setting, args: argparse.Namespace) -> str:
    lines = [*header[:-1], *(f"- {note}" for note in notes(setting, args)), ""]
    lines += table(["route", "pairs/s", "pairs/s counted", "p50 ms", "p99 ms", "rows/batch formed",
                    "server cores", "server CPU ms/pair", "client cores",
                    "rest of the machine, cores", "errors"], rate_rows(runs, ceilings),
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
    pairs = [(SNOOZE_COHERE, INFINITY, "SnoozeML /v1/rerank ÷ infinity"),
             (SNOOZE_TEI, INFINITY, "SnoozeML /rerank (TEI) ÷ infinity"),
             (SNOOZE_COHERE, SNOOZE_TEI, "SnoozeML /v1/rerank ÷ /rerank (TEI)")]
    for server in SERVED:
        pairs += [(server, CEIL_REQUEST, f"{server} ÷ ceiling {CEIL_REQUEST}"),
                  (server, CEIL_SORTED, f"{server} ÷ ceiling {CEIL_SORTED}")]
    rows = []
    for top, bottom, label in pairs:
        cell = spread(ratios(runs, ceilings, top, bottom, args.rounds), ".2f")
        if cell != "—":
            rows.append((label, cell))
    lines += table(["ratio", f"c{args.concurrency[0]}, {args.documents} documents a request"],
                   rows, "ll")
    return "\n".join(lines) + "\n"
