"""Two versions of SnoozeML side by side: paired, interleaved load on the same machine
(issue 10).

This machine's speed drifts by 2x from day to day and by tens of percent from minute to minute,
so two versions measured one after the other can differ by more than any change between them.
This takes the drift out: it exports the ``src/`` of each version (``--base`` and ``--head``
are git revisions; ``--head`` defaults to the working tree), starts one daemon for each **at
the same time** on the same models, and loads them with wrk bursts of ``--duration`` seconds,
alternating (old, new, then new, old, ...), ``--rounds`` pairs per load after a ``--warm-up``
burst each. The report gives, per load, each version's median and the median and range of the
paired new/old ratios, and the daemon CPU time per request, which drifts less than throughput.

Loads (preloaded, pinned, ``intra_op_threads = 1``, one-row JSON requests): ``mlp`` (the bench
MLP 64-256-64) at c1 and c64, ``null`` (one Relu 512 -> 512) at c64, ``heavy`` (the MLP
512-2048-2048-512, batching on: 64 rows, 0 ms) at c1, c16 and c64; ``--loads`` picks some. One
slow run turns a model's inline batches off for good (docs/batching.md), which moves c1
latency by a third, so pairs where the two daemons differ there are left out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from harness.cli import Bench
from harness.config import write_config
from harness.cpu import process_cpu_s
from harness.daemon import Daemon
from harness.load import run_wrk
from harness.oip import json_request, random_rows
from harness.report import Outcome, table
from harness.rounds import alternate, spread
from harness.status import inline
from models import write_bench_mlp, write_heavy_mlp, write_null

REPO = Path(__file__).resolve().parents[2]
LOADS = ("mlp:1", "mlp:64", "null:64", "heavy:1", "heavy:16", "heavy:64")
WIDTHS = {"mlp": 64, "null": 512, "heavy": 512}


@dataclass
class Burst:
    per_s: float
    p50_ms: float
    cpu_us: float  # daemon CPU per request
    inline: bool


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base", required=True, help="git revision of the old version")
    parser.add_argument("--head", default="", help="git revision of the new version "
                        "(default: the working tree's src/)")
    parser.add_argument("--loads", nargs="+", default=list(LOADS), metavar="MODEL:C",
                        help="loads to run, e.g. heavy:1 mlp:64 (all six)")


def export_src(revision: str, dest: Path) -> Path:
    """``src/`` of ``revision`` under ``dest``, through ``git archive`` (no checkout is
    touched)."""
    dest.mkdir(parents=True)
    archive = dest / "src.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision, "src"],
                       stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / "src"


def serve_from(bench: Bench, src: Path, config: Path) -> contextlib.AbstractContextManager[Daemon]:
    """A daemon importing snoozeml from ``src`` (checked), its models loaded."""
    env = dict(os.environ, PYTHONPATH=str(src))
    found = subprocess.run(
        [bench.args.python, "-c", "import snoozeml, sys; sys.stdout.write(snoozeml.__file__)"],
        env=env, capture_output=True, text=True, check=True).stdout
    if not Path(found).is_relative_to(src):
        raise RuntimeError(f"PYTHONPATH={src} imports snoozeml from {found}")
    return bench.serve(config, list(WIDTHS), env=env)


def burst(daemon: Daemon, model: str, connections: int, seconds: float, body: Path) -> Burst:
    before = process_cpu_s(daemon.pid)
    result = run_wrk(daemon.infer_url(model), body, min(connections, 2), connections, seconds)
    cpu = process_cpu_s(daemon.pid) - before
    if result["errors"]:
        raise RuntimeError(f"{model} c{connections}: errors in {result}")
    return Burst(result["requests_per_s"], result["p50_ms"], cpu / result["requests"] * 1e6,
                 inline(daemon.client, model))


def summary(label: str, old: list[Burst], new: list[Burst]) -> list[tuple[str, ...]]:
    """Rows of one load: each metric's medians and paired ratios (pairs that ran inline
    alike, when there are any)."""
    same = [(o, n) for o, n in zip(old, new, strict=True) if o.inline == n.inline]
    pairs = same or list(zip(old, new, strict=True))
    rows = []
    for field, name, fmt in (("per_s", "req/s", ",.0f"), ("p50_ms", "p50 ms", ".3f"),
                             ("cpu_us", "daemon CPU µs/request", ".1f")):
        ratios = [getattr(n, field) / getattr(o, field) for o, n in pairs]
        rows.append((label, name, f"{statistics.median(getattr(b, field) for b in old):{fmt}}",
                     f"{statistics.median(getattr(b, field) for b in new):{fmt}}",
                     spread(ratios, ".3f")))
    if label.startswith("mlp c1"):
        rows.append((label, "inline (old/new)", f"{sum(b.inline for b in old)}/{len(old)}",
                     f"{sum(b.inline for b in new)}/{len(new)}", f"pairs compared: {len(pairs)}"))
    return rows


def run(bench: Bench) -> Outcome:
    args, work = bench.args, bench.workdir
    loads = [(model, int(c)) for model, _, c in (load.partition(":") for load in args.loads)]
    if unknown := [m for m, _ in loads if m not in WIDTHS]:
        raise SystemExit(f"unknown model in --loads: {', '.join(unknown)} "
                         f"(known: {', '.join(WIDTHS)})")
    sources = {"old": export_src(args.base, work / "old"),
               "new": export_src(args.head, work / "new") if args.head else REPO / "src"}
    write_bench_mlp(work / "mlp.onnx")
    write_heavy_mlp(work / "heavy.onnx")
    write_null(work / "null.onnx", WIDTHS["null"])
    entry = {"idle_timeout": "never", "intra_op_threads": 1, "preload": True}
    config = write_config(work / "models.toml", [
        {"name": "mlp", "path": "mlp.onnx", **entry},
        {"name": "null", "path": "null.onnx", **entry},
        {"name": "heavy", "path": "heavy.onnx", **entry,
         "batching": {"max_batch_size": 64, "max_delay": "0ms"}}])
    bodies = {}
    for name, width in WIDTHS.items():
        bodies[name] = work / f"{name}.json"
        bodies[name].write_bytes(json_request(random_rows(1, width)))
    rows: list[tuple[str, ...]] = []
    with contextlib.ExitStack() as stack:
        daemons = {v: stack.enter_context(serve_from(bench, src, config))
                   for v, src in sources.items()}
        for model, connections in loads:
            bursts: dict[str, list[Burst]] = {"old": [], "new": []}
            for daemon in daemons.values():  # warm-up, not recorded
                burst(daemon, model, connections, args.warm_up, bodies[model])
            for pair in range(args.rounds):
                for version in alternate(("old", "new"), pair):
                    bursts[version].append(burst(daemons[version], model, connections,
                                                 args.duration, bodies[model]))
            done = summary(f"{model} c{connections}", bursts["old"], bursts["new"])
            print("\n".join(" | ".join(row) for row in done), file=sys.stderr)
            rows += done
    lines = bench.header(
        "## Paired comparison",
        f"old: `{args.base}`, new: `{args.head or 'working tree'}`; {args.rounds} pairs of "
        f"{args.duration:g} s bursts per load, the order flipped every pair.")
    lines += table(["load", "metric", "old median", "new median",
                    "new/old, paired: median (range)"], rows, "llrrr")
    return Outcome("\n".join(lines) + "\n", {"rows": rows})
