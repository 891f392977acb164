"""Replica autoscaling: one replica against two, and the replica count over a spike (issue 11).

The model: an MLP 64 -> 1024 -> 1024 -> 64 (FP32, about 4.7 MB of weights), ``--rows`` (64)
rows per request in a binary-extension body, so one request is a compute-bound GEMM of about
1 ms in a one-thread onnxruntime session; that cost is measured in-process first.

1. Throughput (``--only throughput``). One daemon serves the file as four entries, preloaded,
   pinned, one intra-op thread: ``max1-nobatch``, ``max2-nobatch`` (``replicas.max`` 1 or 2,
   batching off) and ``max1-batch``, ``max2-batch`` (batching ``--batch-rows`` rows,
   ``--max-delay``); the ``max = 2`` entries scale up under load (target_queue 2,
   scale_up_after 500ms) and keep their second replica. wrk (``--concurrency``, 32 connections)
   measures them in alternating rounds, a warm-up then ``--duration`` seconds each; a
   ``max = 2`` entry is timed only once it has two ready replicas. Then the in-process ceiling:
   one session, and two sessions on two Python threads.
2. Timeline (``--only timeline``). A second daemon serves ``burst`` (max = 2, scale_down_after
   3s, idle_timeout 5s, not preloaded); ``/admin/status`` is sampled every
   ``--sample-interval`` through ``--quiet-before`` seconds without load, ``--spike`` seconds
   of wrk, ``--quiet-after`` seconds without; the report gives the replica count over time and
   the model's replica and load log lines.
"""

from __future__ import annotations

import argparse
import sys

from harness.cli import Bench
from harness.oip import binary_request, new_session, random_rows
from harness.report import Outcome
from harness.timing import warm_then_time
from models import write_mlp

from scenarios.replicas.entries import DIMS, MODEL_FILE, Load
from scenarios.replicas.report import throughput_report, timeline_report
from scenarios.replicas.throughput import ceilings, throughput
from scenarios.replicas.timeline import timeline


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=64, help="rows per request (64)")
    parser.add_argument("--batch-rows", type=int, default=None,
                        help="max_batch_size with batching on (4 requests' rows: 256)")
    parser.add_argument("--max-delay", default="2ms", help="max_delay with batching on (2ms)")
    parser.add_argument("--scale-timeout", type=float, default=30.0,
                        help="most seconds of load to wait for a second replica (30)")
    parser.add_argument("--quiet-before", type=float, default=2.0,
                        help="timeline: seconds without load first (2)")
    parser.add_argument("--spike", type=float, default=8.0,
                        help="timeline: seconds of wrk load (8)")
    parser.add_argument("--quiet-after", type=float, default=12.0,
                        help="timeline: seconds without load after it (12)")
    parser.add_argument("--sample-interval", type=float, default=0.25,
                        help="timeline: seconds between /admin/status samples (0.25)")


def run(bench: Bench) -> Outcome:
    args = bench.args
    if args.batch_rows is None:
        args.batch_rows = 4 * args.rows
    model_input = random_rows(args.rows, DIMS[0])
    path = write_mlp(bench.workdir / MODEL_FILE, DIMS)
    body, header_length = binary_request(model_input)
    (bench.workdir / "body.bin").write_bytes(body)
    reference = new_session(path)
    feeds = {"x": model_input}
    load = Load(bench.workdir / "body.bin", header_length, body, reference.run(None, feeds)[0])
    cost = warm_then_time(lambda: reference.run(None, feeds), 2.0, warm_up_s=0.5)
    print(f"one request ({args.rows}x{DIMS[0]}) in-process, 1 thread: p50 {cost.p50_ms:.3f} ms, "
          f"{cost.per_s:,.0f} calls/s", file=sys.stderr, flush=True)
    lines = bench.header(
        f"## Replica autoscaling benchmark: MLP {'-'.join(str(d) for d in DIMS)} FP32, "
        f"{args.rows} rows per request",
        f"one request in-process (1 intra-op thread): p50 {cost.p50_ms:.3f} ms, "
        f"{cost.per_s:,.0f} calls/s",
        "binary-extension requests (input and output binary); every model "
        "`intra_op_threads = 1`, `[models.replicas]` min 0, target_queue 2, scale_up_after "
        f'"500ms"; batching on = `max_batch_size = {args.batch_rows}` rows, `max_delay = '
        f'"{args.max_delay}"`; batching off = `max_batch_size = 0`')
    raw: dict[str, object] = {"dims": DIMS, "in_process_ms_p50": cost.p50_ms}
    if bench.only("throughput"):
        raw["runs"] = runs = throughput(bench, load)
        raw["ceiling"] = found = ceilings(path, model_input, args)
        lines += throughput_report(runs, found, args)
    if bench.only("timeline"):
        raw["timeline"] = tl = timeline(bench, load)
        lines += timeline_report(tl, args)
    return Outcome("\n".join(lines), raw)
