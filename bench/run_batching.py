"""Dynamic micro-batching benchmark for the SnoozeML daemon (issue 3).

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_batching.py [--duration 10] [--out results.md]

One daemon serves the heavy MLP (512 -> 2048 -> 2048 -> 512, FP32) three times from the same
file, each entry preloaded, pinned (``idle_timeout = "never"``) and ``intra_op_threads = 1``:

  ``heavy``          batching on:  max_batch_size = 64, max_delay = "0ms"
  ``heavy-2ms``      batching on:  max_batch_size = 64, max_delay = "2ms" (c64 only)
  ``heavy-nobatch``  batching off: max_batch_size = 1

wrk sends the same one-row JSON body at ``-t1 -c1``, ``-t2 -c16`` and ``-t2 -c64``; for each
run the script reads batches/rows from ``GET /admin/status`` before and after, so the mean rows
per batch covers the measured window only. It then times in-process ``session.run`` on the same
file with 1 intra-op thread at batch 1 and batch 64 (the ceiling). Prints a markdown report;
``--out FILE`` also writes it there. It never appends to any file.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from harness import (
    Daemon,
    Latency,
    check_infer,
    machine_line,
    model_status,
    new_session,
    random_rows,
    run_wrk,
    time_calls,
    wait_idle,
    wait_loaded,
    wait_ready,
    write_body,
    wrk_errors,
)
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
RTOL = 1e-4
ATOL = 1e-4


@dataclass(frozen=True)
class Variant:
    """One model entry of the daemon: the same file with its own batching settings."""

    name: str
    max_batch_size: int
    max_delay: str
    label: str

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 1


ON = Variant("heavy", 64, "0ms", "on (64 rows, 0 ms)")
ON_2MS = Variant("heavy-2ms", 64, "2ms", "on (64 rows, 2 ms)")
OFF = Variant("heavy-nobatch", 1, "0ms", "off (max_batch_size 1)")
VARIANTS = (ON, ON_2MS, OFF)
# (wrk threads, connections, variants measured at that level), in this order.
LEVELS: tuple[tuple[int, int, tuple[Variant, ...]], ...] = (
    (1, 1, (ON, OFF)),
    (2, 16, (ON, OFF)),
    (2, 64, (ON, OFF, ON_2MS)),
)


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
    def rows_per_batch(self) -> float | None:
        return self.rows / self.batches if self.batches else None

    @property
    def per_s(self) -> float:
        return float(self.wrk["requests_per_s"])


@dataclass(frozen=True)
class Ceiling:
    batch: int
    calls: Latency

    @property
    def rows_per_s(self) -> float:
        return self.calls.per_s * self.batch


def write_config(workdir: Path) -> Path:
    write_heavy_mlp(workdir / "heavy_mlp.onnx")
    entries = [
        f"""
[[models]]
name = "{v.name}"
path = "heavy_mlp.onnx"
preload = true
intra_op_threads = 1

[models.batching]
max_batch_size = {v.max_batch_size}
max_delay = "{v.max_delay}"
"""
        for v in VARIANTS
    ]
    config = workdir / "models.toml"
    config.write_text(
        """\
[server]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
idle_timeout = "never"
"""
        + "".join(entries),
        encoding="utf-8",
    )
    return config


def batch_counters(entry: dict[str, Any]) -> tuple[int, int, float]:
    """(batches, rows, total worker seconds) from a model's /admin/status entry."""
    stats = entry["batching"]
    batches = int(stats["batches"])
    run_s = float(stats["mean_run_ms"] or 0.0) * batches / 1000.0
    return batches, int(stats["rows"]), run_s


def check_policies(client: httpx.Client) -> None:
    """Each entry's batching status says what its config asked for, before anything is timed."""
    for variant in VARIANTS:
        batching = model_status(client, variant.name)["batching"]
        if bool(batching["enabled"]) != variant.batching:
            raise RuntimeError(f"{variant.name}: batching status {batching} not as configured")


def measure(
    client: httpx.Client,
    body_file: Path,
    variant: Variant,
    threads: int,
    connections: int,
    duration_s: float,
    warm_up_s: float,
) -> Run:
    url = f"{str(client.base_url).rstrip('/')}/v2/models/{variant.name}/infer"
    run_wrk(url, body_file, threads, connections, warm_up_s)
    before = batch_counters(wait_idle(client, variant.name))
    result = run_wrk(url, body_file, threads, connections, duration_s)
    after = batch_counters(wait_idle(client, variant.name))
    batches = after[0] - before[0]
    run_ms = (after[2] - before[2]) * 1000.0 / batches if batches else 0.0
    measured = Run(variant, threads, connections, result, batches, after[1] - before[1], run_ms)
    print(
        f"{variant.name} -t{threads} -c{connections}: {json.dumps(result)} "
        f"batches={measured.batches} rows={measured.rows}",
        file=sys.stderr,
    )
    return measured


def ceiling(session: Any, batch: int, feed: np.ndarray, duration_s: float) -> Ceiling:
    """In-process ``session.run`` on ``feed`` (``batch`` rows), back to back."""
    feeds = {"x": feed}
    time_calls(lambda: session.run(None, feeds), min(1.0, duration_s))  # warm-up
    return Ceiling(batch, time_calls(lambda: session.run(None, feeds), duration_s))


def find(runs: Sequence[Run], variant: Variant, connections: int) -> Run:
    return next(r for r in runs if r.variant is variant and r.connections == connections)


def _yes(met: bool) -> str:
    return "yes" if met else "**no**"


def report(
    machine: str, runs: list[Run], ceilings: list[Ceiling], args: argparse.Namespace
) -> str:
    lines = [
        "## Micro-batching benchmark: MLP 512-2048-2048-512 FP32, one row per request",
        "",
        f"- {machine}",
        f"- {args.duration:g} s per run after a {args.warm_up:g} s wrk warm-up; one daemon "
        f"serving the same file as `{ON.name}`, `{ON_2MS.name}` and `{OFF.name}`, each "
        '`intra_op_threads = 1`, preloaded, `idle_timeout = "never"`',
        "- mean rows/batch and worker ms/batch: deltas of `/admin/status` counters over "
        "the measured window",
        "",
        "| batching | wrk | requests/s | p50 ms | p99 ms | mean rows/batch | worker ms/batch "
        "| errors |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        rows_per = f"{r.rows_per_batch:.2f}" if r.rows_per_batch is not None else "-"
        lines.append(
            f"| {r.variant.label} | -t{r.threads} -c{r.connections} | {r.per_s:,.0f} "
            f"| {r.wrk['p50_ms']:.3f} | {r.wrk['p99_ms']:.3f} | {rows_per} "
            f"| {r.run_ms:.3f} | {wrk_errors(r.wrk)} |"
        )
    lines += [
        "",
        "### In-process onnxruntime ceiling (same file, 1 intra-op thread, one Python thread)",
        "",
        "| batch | calls/s | rows/s | p50 ms per call | issue's figure (rows/s) |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {c.batch} | {c.calls.per_s:,.0f} | {c.rows_per_s:,.0f} | {c.calls.p50_ms:.3f} "
        f"| about {ISSUE_CEILING_ROWS_S.get(c.batch, 0):,} |"
        for c in ceilings
    ]
    on64, off64, on2ms64 = find(runs, ON, 64), find(runs, OFF, 64), find(runs, ON_2MS, 64)
    on1, off1 = find(runs, ON, 1), find(runs, OFF, 1)
    ratio = on64.per_s / off64.per_s
    ratio_2ms = on2ms64.per_s / off64.per_s
    delta = on1.wrk["p50_ms"] - off1.wrk["p50_ms"]
    ceiling64 = next(c for c in ceilings if c.batch == CEILING_BATCH)
    lines += [
        "",
        "### Against the aims of issue 3",
        "",
        "| aim | ours | met |",
        "| --- | ---: | --- |",
        f"| c64 batching on >= {AIM_ON_OFF_RATIO:g}x batching off | {ratio:.2f}x "
        f"({on64.per_s:,.0f} / {off64.per_s:,.0f} req/s) | {_yes(ratio >= AIM_ON_OFF_RATIO)} |",
        f"| c64 batching on >= {AIM_RPS_C64:,} req/s | {on64.per_s:,.0f} req/s "
        f"({on64.per_s / AIM_RPS_C64:.0%} of the aim) | {_yes(on64.per_s >= AIM_RPS_C64)} |",
        f"| p50 at c1, on - off <= {AIM_P50_C1_DELTA_MS:g} ms (max_delay 0) "
        f"| {delta:+.3f} ms ({on1.wrk['p50_ms']:.3f} vs {off1.wrk['p50_ms']:.3f}) "
        f"| {_yes(delta <= AIM_P50_C1_DELTA_MS)} |",
        "",
        f"- `max_delay = \"2ms\"` at c64: {on2ms64.per_s:,.0f} req/s, {ratio_2ms:.2f}x "
        "batching off.",
        f"- c64 batching on reaches {on64.per_s / ceiling64.rows_per_s:.0%} of the in-process "
        f"batch-{CEILING_BATCH} ceiling ({ceiling64.rows_per_s:,.0f} rows/s).",
        "- From the issue (its author's measurements at c64 on the 2-core machine, not ours): "
        + "; ".join(f"{name} about {rps:,} req/s" for name, rps in ISSUE_OTHERS_C64)
        + ".",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run (10)")
    parser.add_argument(
        "--warm-up", type=float, default=2.0, help="seconds of wrk warm-up before each run (2)"
    )
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the daemon")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk not found; run: bash bench/setup.sh", file=sys.stderr)
        return 2
    machine = machine_line()
    model_input = random_rows(1, WIDTH)
    batch_input = random_rows(CEILING_BATCH, WIDTH, seed=8)
    warm_up_s = min(args.warm_up, args.duration)
    with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
        workdir = Path(tmp)
        config = write_config(workdir)
        body_file = workdir / "body.json"
        write_body(body_file, model_input)
        reference = new_session(workdir / "heavy_mlp.onnx")
        expected = reference.run(None, {"x": model_input})[0]

        daemon = Daemon(args.python, config)
        try:
            print(f"daemon up: http={daemon.http_port} grpc={daemon.grpc_port}", file=sys.stderr)
            with httpx.Client(base_url=daemon.base_url, timeout=60.0) as client:
                wait_ready(client, "/health/ready")
                for variant in VARIANTS:
                    wait_loaded(client, variant.name)  # preloaded: no load inside the timings
                    check_infer(client, variant.name, model_input, expected, RTOL, ATOL)
                check_policies(client)

                runs: list[Run] = []
                for threads, connections, variants in LEVELS:
                    for variant in variants:
                        runs.append(
                            measure(
                                client,
                                body_file,
                                variant,
                                threads,
                                connections,
                                args.duration,
                                warm_up_s,
                            )
                        )
                for variant in VARIANTS:  # still right after the load
                    check_infer(client, variant.name, model_input, expected, RTOL, ATOL)
        except BaseException:
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
            raise
        finally:
            daemon.stop_and_warn()

        ceilings = [
            ceiling(reference, batch, feed, args.duration)
            for batch, feed in ((1, model_input), (CEILING_BATCH, batch_input))
        ]

    markdown = report(machine, runs, ceilings, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
