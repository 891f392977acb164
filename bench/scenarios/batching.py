"""Dynamic micro-batching (issue 3): the heavy MLP 512 -> 2048 -> 2048 -> 512, FP32.

One daemon serves the same file three times, each entry preloaded, pinned and
``intra_op_threads = 1``: ``heavy`` (batching on: 64 rows, ``max_delay = "0ms"``),
``heavy-2ms`` (64 rows, 2 ms; c64 only) and ``heavy-nobatch`` (``max_batch_size = 1``).
wrk sends the same one-row JSON body at ``-t1 -c1``, ``-t2 -c16`` and ``-t2 -c64``, a
``--warm-up`` run before each; batches and rows are read from ``/admin/status`` before and
after each measured run, so the mean rows per batch covers that window only. Then in-process
``session.run`` on the same file with 1 intra-op thread at batch 1 and 64 (the ceiling).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.cli import Bench
from harness.config import write_config
from harness.daemon import Daemon
from harness.load import run_wrk
from harness.oip import new_session, random_rows, write_body
from harness.report import Outcome, table, yes
from harness.status import batch_counters, check_infer, model_status, wait_idle
from harness.timing import Latency, warm_then_time
from models import HEAVY_MLP_DIMS, write_heavy_mlp

WIDTH = HEAVY_MLP_DIMS[0]
CEILING_BATCH = 64
# Issue 3's numbers: its aims, and what its author measured on the 2-core machine.
AIM_RPS_C64 = 4200
AIM_ON_OFF_RATIO = 4.0
AIM_P50_C1_DELTA_MS = 0.2
ISSUE_CEILING_ROWS_S = {1: 1080, 64: 9400}
ISSUE_OTHERS_C64 = (
    ("MLServer 1.7.1, adaptive batching (64 rows, 2 ms)", 1400),
    ("LitServe 0.2.19 with batching", 870),
    ("bare Starlette endpoint, no batching", 740),
)
# A one-row output of this model is compared with onnxruntime's own; values are O(1).
RTOL = ATOL = 1e-4


@dataclass(frozen=True)
class Variant:
    """One model entry of the daemon: the same file with its own batching settings."""

    name: str
    max_batch_size: int
    max_delay: str
    label: str


ON = Variant("heavy", 64, "0ms", "on (64 rows, 0 ms)")
ON_2MS = Variant("heavy-2ms", 64, "2ms", "on (64 rows, 2 ms)")
OFF = Variant("heavy-nobatch", 1, "0ms", "off (max_batch_size 1)")
VARIANTS = (ON, ON_2MS, OFF)
# (wrk threads, connections, variants measured at that level), in this order.
LEVELS = ((1, 1, (ON, OFF)), (2, 16, (ON, OFF)), (2, 64, (ON, OFF, ON_2MS)))


@dataclass(frozen=True)
class Run:
    """One measured wrk run against one variant, with the daemon's batch counters over it."""

    variant: Variant
    threads: int
    connections: int
    wrk: dict[str, Any]
    batches: int
    rows: int
    run_ms: float  # worker time per batch over the window (from mean_run_ms)

    @property
    def per_s(self) -> float:
        return float(self.wrk["requests_per_s"])


def measure(daemon: Daemon, body_file: Any, variant: Variant, threads: int, connections: int,
            duration_s: float, warm_up_s: float) -> Run:
    url = daemon.infer_url(variant.name)
    run_wrk(url, body_file, threads, connections, warm_up_s)
    before = batch_counters(wait_idle(daemon.client, variant.name))
    result = run_wrk(url, body_file, threads, connections, duration_s)
    after = batch_counters(wait_idle(daemon.client, variant.name))
    batches = after[0] - before[0]
    run_ms = (after[2] - before[2]) * 1000.0 / batches if batches else 0.0
    measured = Run(variant, threads, connections, result, batches, after[1] - before[1], run_ms)
    print(f"{variant.name} -t{threads} -c{connections}: {json.dumps(result)} "
          f"batches={measured.batches} rows={measured.rows}", file=sys.stderr)
    return measured


def run(bench: Bench) -> Outcome:
    args, workdir = bench.args, bench.workdir
    write_heavy_mlp(workdir / "heavy_mlp.onnx")
    config = write_config(workdir / "models.toml", [
        {"name": v.name, "path": "heavy_mlp.onnx", "preload": True, "intra_op_threads": 1,
         "batching": {"max_batch_size": v.max_batch_size, "max_delay": v.max_delay}}
        for v in VARIANTS], server={"idle_timeout": "never"})
    model_input = random_rows(1, WIDTH)
    body_file = workdir / "body.json"
    write_body(body_file, model_input)
    reference = new_session(workdir / "heavy_mlp.onnx")
    expected = reference.run(None, {"x": model_input})[0]
    warm_up_s = min(args.warm_up, args.duration)
    with bench.serve(config, [v.name for v in VARIANTS]) as daemon:
        for variant in VARIANTS:
            check_infer(daemon.client, variant.name, model_input, expected, RTOL, ATOL)
            batching = model_status(daemon.client, variant.name)["batching"]
            if bool(batching["enabled"]) != (variant.max_batch_size > 1):
                raise RuntimeError(f"{variant.name}: batching status {batching} not as configured")
        runs = [measure(daemon, body_file, variant, threads, connections, args.duration,
                        warm_up_s)
                for threads, connections, variants in LEVELS for variant in variants]
        for variant in VARIANTS:  # still right after the load
            check_infer(daemon.client, variant.name, model_input, expected, RTOL, ATOL)
    ceilings = {batch: warm_then_time(lambda feeds=feeds: reference.run(None, feeds),
                                      args.duration)
                for batch, feeds in ((1, {"x": model_input}),
                                     (CEILING_BATCH, {"x": random_rows(CEILING_BATCH, WIDTH, 8)}))}
    return Outcome(report(bench, runs, ceilings), {"runs": runs, "ceilings": ceilings})


def find(runs: Sequence[Run], variant: Variant, connections: int) -> Run:
    return next(r for r in runs if r.variant is variant and r.connections == connections)


def report(bench: Bench, runs: list[Run], ceilings: dict[int, Latency]) -> str:
    args = bench.args
    lines = bench.header(
        "## Micro-batching benchmark: MLP 512-2048-2048-512 FP32, one row per request",
        f"{args.duration:g} s per run after a {args.warm_up:g} s wrk warm-up; one daemon "
        f"serving the same file as `{ON.name}`, `{ON_2MS.name}` and `{OFF.name}`, each "
        '`intra_op_threads = 1`, preloaded, `idle_timeout = "never"`',
        "mean rows/batch and worker ms/batch: deltas of `/admin/status` counters over the "
        "measured window")
    lines += table(
        ["batching", "wrk", "requests/s", "p50 ms", "p99 ms", "mean rows/batch",
         "worker ms/batch", "errors"],
        [(r.variant.label, f"-t{r.threads} -c{r.connections}", f"{r.per_s:,.0f}",
          f"{r.wrk['p50_ms']:.3f}", f"{r.wrk['p99_ms']:.3f}",
          f"{r.rows / r.batches:.2f}" if r.batches else "-", f"{r.run_ms:.3f}", r.wrk["errors"])
         for r in runs], "llrrrrrr")
    lines += ["", "### In-process onnxruntime ceiling (same file, 1 intra-op thread, one Python "
              "thread)", ""]
    lines += table(["batch", "calls/s", "rows/s", "p50 ms per call", "issue's figure (rows/s)"],
                   [(batch, f"{c.per_s:,.0f}", f"{c.per_s * batch:,.0f}", f"{c.p50_ms:.3f}",
                     f"about {ISSUE_CEILING_ROWS_S.get(batch, 0):,}")
                    for batch, c in ceilings.items()], "rrrrr")
    on64, off64, on2ms64 = find(runs, ON, 64), find(runs, OFF, 64), find(runs, ON_2MS, 64)
    on1, off1 = find(runs, ON, 1), find(runs, OFF, 1)
    ratio = on64.per_s / off64.per_s
    delta = on1.wrk["p50_ms"] - off1.wrk["p50_ms"]
    ceiling_rows = ceilings[CEILING_BATCH].per_s * CEILING_BATCH
    lines += ["", "### Against the aims of issue 3", ""]
    lines += table(["aim", "ours", "met"], [
        (f"c64 batching on >= {AIM_ON_OFF_RATIO:g}x batching off",
         f"{ratio:.2f}x ({on64.per_s:,.0f} / {off64.per_s:,.0f} req/s)",
         yes(ratio >= AIM_ON_OFF_RATIO)),
        (f"c64 batching on >= {AIM_RPS_C64:,} req/s",
         f"{on64.per_s:,.0f} req/s ({on64.per_s / AIM_RPS_C64:.0%} of the aim)",
         yes(on64.per_s >= AIM_RPS_C64)),
        (f"p50 at c1, on - off <= {AIM_P50_C1_DELTA_MS:g} ms (max_delay 0)",
         f"{delta:+.3f} ms ({on1.wrk['p50_ms']:.3f} vs {off1.wrk['p50_ms']:.3f})",
         yes(delta <= AIM_P50_C1_DELTA_MS)),
    ], "lrl")
    lines += [
        "",
        f"- `max_delay = \"2ms\"` at c64: {on2ms64.per_s:,.0f} req/s, "
        f"{on2ms64.per_s / off64.per_s:.2f}x batching off.",
        f"- c64 batching on reaches {on64.per_s / ceiling_rows:.0%} of the in-process "
        f"batch-{CEILING_BATCH} ceiling ({ceiling_rows:,.0f} rows/s).",
        "- From the issue (its author's measurements at c64 on the 2-core machine, not ours): "
        + "; ".join(f"{name} about {rps:,} req/s" for name, rps in ISSUE_OTHERS_C64) + ".",
    ]
    return "\n".join(lines) + "\n"
