"""Two versions of SnoozeML side by side: paired, interleaved load on the same machine.

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_compare.py --base 36500f1 [--head REV] [--rounds 12]
        [--loads heavy:1 mlp:64 ...]

This machine's speed drifts by 2x from day to day and by tens of percent from minute to minute,
so two versions measured one after the other can differ by more than any change between them.
This script takes the drift out instead: it exports the ``src/`` of each version (``--base`` and
``--head`` are git revisions; ``--head`` defaults to the working tree), starts one daemon for
each **at the same time**, both serving the same models, and loads them with short wrk bursts,
alternating (old, new, then new, old, ...). Each pair of bursts is seconds apart, so it sees
the same machine; the report gives, per load, each version's median and the median and range of
the paired new/old ratios, and the daemon CPU time per request (``/proc``: user + system, all
threads), which drifts less than throughput.

Loads (the models of ``run_http.py`` and ``run_batching.py``, preloaded, pinned,
``intra_op_threads = 1``, one-row JSON requests):
  ``mlp c1``      the bench MLP 64-256-64, wrk -t1 -c1 (per-request latency; batches of one)
  ``mlp c64``     the bench MLP, wrk -t2 -c64 (the HTTP path's throughput)
  ``null c64``    one Relu 512 -> 512 (issue 19's null model: the daemon's own cost), wrk -c64
  ``heavy c1``, ``heavy c16``, ``heavy c64``  the MLP 512-2048-2048-512, batching on (64 rows,
                  0 ms); at c1 every run goes to the worker thread

The report also says whether each daemon ran its very short batches inline (see
docs/batching.md): one slow run turns that off for good, and it moves c1 latency by a third, so
pairs where the two differ are reported apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
from harness import (
    Daemon,
    command_line,
    json_request,
    machine_line,
    process_cpu_s,
    random_rows,
    run_wrk,
    wait_loaded,
    wait_ready,
    wrk_errors,
)
from models import write_bench_mlp, write_heavy_mlp, write_null

REPO = Path(__file__).resolve().parent.parent
LOADS = (("mlp", 1), ("mlp", 64), ("null", 64), ("heavy", 1), ("heavy", 16), ("heavy", 64))
WIDTHS = {"mlp": 64, "null": 512, "heavy": 512}
CONFIG = """\
[[models]]
name = "mlp"
path = "mlp.onnx"
idle_timeout = "never"
intra_op_threads = 1
preload = true

[[models]]
name = "null"
path = "null.onnx"
idle_timeout = "never"
intra_op_threads = 1
preload = true

[[models]]
name = "heavy"
path = "heavy.onnx"
idle_timeout = "never"
intra_op_threads = 1
preload = true
[models.batching]
max_batch_size = 64
max_delay = "0ms"
"""


@dataclass
class Burst:
    per_s: float
    p50_ms: float
    cpu_us: float  # daemon CPU per request
    inline: bool


def export_src(revision: str, dest: Path) -> Path:
    """`src/` of `revision` under `dest`, through `git archive` (no checkout is touched)."""
    dest.mkdir(parents=True)
    archive = dest / "src.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision, "src"],
                       stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / "src"


def start(python: str, src: Path, config: Path) -> Daemon:
    env = dict(os.environ, PYTHONPATH=str(src))
    found = subprocess.run(
        [python, "-c", "import snoozeml, sys; sys.stdout.write(snoozeml.__file__)"],
        env=env, capture_output=True, text=True, check=True).stdout
    if not Path(found).is_relative_to(src):
        raise RuntimeError(f"PYTHONPATH={src} imports snoozeml from {found}")
    daemon = Daemon(python, config, env=env)
    with httpx.Client(base_url=daemon.base_url, timeout=60) as client:
        wait_ready(client, "/health/ready")
        for name in WIDTHS:
            wait_loaded(client, name)
    return daemon


def inline(daemon: Daemon, model: str) -> bool:
    status = httpx.get(f"{daemon.base_url}/admin/status", timeout=30).json()
    entry = next(m for m in status["models"] if m["name"] == model)
    return bool(entry["batching"]["inline"])


def burst(daemon: Daemon, model: str, connections: int, seconds: float, body: Path) -> Burst:
    url = f"{daemon.base_url}/v2/models/{model}/infer"
    before = process_cpu_s(daemon.pid)
    result = run_wrk(url, body, min(connections, 2), connections, seconds)
    cpu = process_cpu_s(daemon.pid) - before
    if wrk_errors(result):
        raise RuntimeError(f"{model} c{connections}: errors in {result}")
    return Burst(result["requests_per_s"], result["p50_ms"], cpu / result["requests"] * 1e6,
                 inline(daemon, model))


def summary(label: str, old: list[Burst], new: list[Burst]) -> list[str]:
    same = [(o, n) for o, n in zip(old, new, strict=True) if o.inline == n.inline]
    pairs = same or list(zip(old, new, strict=True))

    def ratios(field: str) -> list[float]:
        return [getattr(n, field) / getattr(o, field) for o, n in pairs]

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} ({min(values):.3f} to {max(values):.3f})"

    rows = []
    for field, name, fmt in (("per_s", "req/s", ",.0f"), ("p50_ms", "p50 ms", ".3f"),
                             ("cpu_us", "daemon CPU µs/request", ".1f")):
        old_median = statistics.median(getattr(b, field) for b in old)
        new_median = statistics.median(getattr(b, field) for b in new)
        rows.append(f"| {label} | {name} | {old_median:{fmt}} | {new_median:{fmt}} | "
                    f"{cell(ratios(field))} |")
    if label.startswith("mlp c1"):
        rows.append(f"| {label} | inline (old/new) | {sum(b.inline for b in old)}/{len(old)} | "
                    f"{sum(b.inline for b in new)}/{len(new)} | pairs compared: {len(pairs)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision of the old version")
    parser.add_argument("--head", default="", help="git revision of the new version "
                        "(default: the working tree's src/)")
    parser.add_argument("--rounds", type=int, default=12, help="pairs of bursts per load (12)")
    parser.add_argument("--burst", type=float, default=3.0, help="seconds per burst (3)")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the daemons")
    parser.add_argument("--loads", nargs="+", default=[f"{m}:{c}" for m, c in LOADS],
                        metavar="MODEL:C", help="loads to run, e.g. heavy:1 mlp:64 (all of them)")
    args = parser.parse_args(argv)
    loads = [(model, int(c)) for model, _, c in (load.partition(":") for load in args.loads)]
    if unknown := [m for m, _ in loads if m not in WIDTHS]:
        parser.error(f"unknown model in --loads: {', '.join(unknown)} "
                     f"(known: {', '.join(WIDTHS)})")
    report = ["## Paired comparison", "", f"Machine: {machine_line()}", "",
              f"Command: `{command_line()}`", ""]
    with tempfile.TemporaryDirectory(prefix="snooze-compare-") as tmp:
        work = Path(tmp)
        sources = {"old": export_src(args.base, work / "old"),
                   "new": export_src(args.head, work / "new") if args.head else REPO / "src"}
        write_bench_mlp(work / "mlp.onnx")
        write_heavy_mlp(work / "heavy.onnx")
        write_null(work / "null.onnx", WIDTHS["null"])
        config = work / "models.toml"
        config.write_text(CONFIG, encoding="utf-8")
        bodies = {}
        for name, width in WIDTHS.items():
            bodies[name] = work / f"{name}.json"
            bodies[name].write_bytes(json_request(random_rows(1, width)))
        daemons = {version: start(args.python, src, config) for version, src in sources.items()}
        try:
            report += [f"old: `{args.base}`, new: `{args.head or 'working tree'}`; "
                       f"{args.rounds} pairs of {args.burst:g} s bursts per load, the order "
                       "flipped every pair.", "",
                       "| load | metric | old median | new median | new/old, paired: median "
                       "(range) |", "| --- | --- | ---: | ---: | ---: |"]
            for model, connections in loads:
                bursts: dict[str, list[Burst]] = {"old": [], "new": []}
                for version in daemons:  # warm-up, not recorded
                    burst(daemons[version], model, connections, 2, bodies[model])
                for pair in range(args.rounds):
                    order = ("old", "new") if pair % 2 == 0 else ("new", "old")
                    for version in order:
                        bursts[version].append(burst(daemons[version], model, connections,
                                                     args.burst, bodies[model]))
                rows = summary(f"{model} c{connections}", bursts["old"], bursts["new"])
                report += rows
                print("\n".join(rows), flush=True)
        finally:
            for daemon in daemons.values():
                daemon.stop_and_warn()
    text = "\n".join(report) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
