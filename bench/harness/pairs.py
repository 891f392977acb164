"""Variants measured in pairs: wrk runs against daemons round by round, each with the daemon's
CPU time per request, and the tables that set each variant beside the first (``off``) by
ratios paired within a round."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.cpu import process_cpu_s
from harness.daemon import Daemon
from harness.load import run_wrk
from harness.report import table
from harness.rounds import median_or_nan, spread
from harness.status import inline


@dataclass(frozen=True)
class PairedRun:
    """One measured wrk run of one variant in one round."""

    round: int
    connections: int
    variant: str
    wrk: dict[str, Any]
    daemon_cpu_s: float
    inline: bool  # the model ran its short batches on the event loop (docs/batching.md)

    @property
    def per_s(self) -> float:
        return float(self.wrk["requests_per_s"])

    @property
    def cpu_us_per_request(self) -> float:
        return self.daemon_cpu_s / max(1, int(self.wrk["requests"])) * 1e6


def measure(daemon: Daemon, model: str, body: Path, variant: str, connections: int,
            round_no: int, args: argparse.Namespace, headers: Mapping[str, str] | None = None,
            during: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
            client: httpx.Client | None = None) -> PairedRun:
    """A ``--warm-up`` wrk run, then ``--duration`` measured (``during()`` entered around it)
    with the daemon's CPU time; any error aborts. ``client`` reads ``/admin/status`` (one with
    credentials, where the daemon asks for them)."""
    url = daemon.infer_url(model)
    run_wrk(url, body, args.wrk_threads, connections, args.warm_up, extra_headers=headers)
    before = process_cpu_s(daemon.pid)
    with during():
        result = run_wrk(url, body, args.wrk_threads, connections, args.duration,
                         extra_headers=headers)
    cpu = process_cpu_s(daemon.pid) - before
    mode = inline(client or daemon.client, model)
    run = PairedRun(round_no, connections, variant, result, cpu, mode)
    print(f"round {round_no} c{connections} {variant}: {json.dumps(result)} daemon CPU "
          f"{run.cpu_us_per_request:.1f} µs/request inline={run.inline}", file=sys.stderr,
          flush=True)
    if result["errors"]:
        raise RuntimeError(f"{variant} c{connections}: errors in {result}")
    return run


def medians_table(runs: Sequence[PairedRun], variants: Sequence[str]) -> list[str]:
    """Per load and variant: median req/s, p50, p99, CPU µs per request, inline runs."""
    rows = []
    for connections in sorted({r.connections for r in runs}):
        for variant in variants:
            mine = [r for r in runs if r.connections == connections and r.variant == variant]
            rows.append((f"c{connections}", variant,
                         f"{median_or_nan([r.per_s for r in mine]):,.0f}",
                         f"{median_or_nan([r.wrk['p50_ms'] for r in mine]):.3f}",
                         f"{median_or_nan([r.wrk['p99_ms'] for r in mine]):.3f}",
                         f"{median_or_nan([r.cpu_us_per_request for r in mine]):.1f}",
                         f"{sum(r.inline for r in mine)}/{len(mine)}"))
    return table(["load", "variant", "req/s", "p50 ms", "p99 ms", "daemon CPU µs/request",
                  "inline runs"], rows, "llrrrrr")


def ratios(runs: Sequence[PairedRun], variant: str, base: str, connections: int,
           same_inline: bool) -> tuple[str, str, str, str]:
    """``variant`` over ``base`` paired within each round: req/s, p50 and p99 ratios and the
    CPU difference, median (range). With ``same_inline``, pairs whose two runs differ in inline
    batches are left out while others remain."""
    by_round = {r.round: r for r in runs if r.connections == connections and r.variant == base}
    pairs = [(by_round[r.round], r) for r in runs
             if r.connections == connections and r.variant == variant]
    if same_inline:
        pairs = [(o, n) for o, n in pairs if o.inline == n.inline] or pairs
    return (spread([n.per_s / o.per_s for o, n in pairs], ".3f"),
            spread([n.wrk["p50_ms"] / o.wrk["p50_ms"] for o, n in pairs], ".3f"),
            spread([n.wrk["p99_ms"] / o.wrk["p99_ms"] for o, n in pairs], ".3f"),
            spread([n.cpu_us_per_request - o.cpu_us_per_request for o, n in pairs], "+.1f"))
