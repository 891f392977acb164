"""The replica scenario's report: every run, max 2 over max 1 against the aims, the ceiling,
and the timeline's changes and log lines."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import psutil
from harness.report import table, yes
from harness.rounds import paired

from scenarios.replicas.entries import ENTRIES, TIMELINE_MODEL
from scenarios.replicas.throughput import Ceiling, Run
from scenarios.replicas.timeline import Timeline, changed_rows

# The aims: two replicas with batching off at least 1.6x one; with batching on, no loss.
AIM_RATIO_OFF = 1.6
AIM_RATIO_ON = 1.0


def median_of(runs: Sequence[Run], name: str) -> float:
    return statistics.median(r.per_s for r in runs if r.entry == name)


def per_round(runs: Sequence[Run], name: str) -> dict[int, float]:
    return {r.round: r.per_s for r in runs if r.entry == name}


def _share(served: dict[int, int]) -> str:
    total = sum(served.values())
    return " / ".join(f"{n / total:.0%}" for _, n in sorted(served.items())) if total else "-"


def throughput_report(runs: list[Run], ceiling: list[Ceiling],
                      args: argparse.Namespace) -> list[str]:
    labels = {e.name: e.label for e in ENTRIES}
    lines = [f"### Throughput: wrk -t{args.wrk_threads} -c{args.concurrency[0]}, {args.rounds} "
             f"alternating rounds of {args.duration:g} s (after a {args.warm_up:g} s warm-up "
             "each)", ""]
    lines += table(
        ["round", "model", "requests/s", "p50 ms", "p99 ms", "ready replicas (start -> end)",
         "requests per replica", "CPU cores: daemon / wrk / other",
         "daemon's main thread / busiest other thread", "daemon CPU ms per request", "errors"],
        [(r.round, f"`{r.entry}` ({labels[r.entry]})", f"{r.per_s:,.0f}",
          f"{r.wrk['p50_ms']:.2f}", f"{r.wrk['p99_ms']:.2f}",
          f"{r.replicas_before} -> {r.replicas_after}", _share(r.replica_requests),
          f"{r.daemon_cores:.2f} / {r.wrk_cores:.2f} / {r.other_cores:.2f}",
          f"{r.loop_cores:.2f} / {r.busiest_worker_cores:.2f}",
          f"{r.daemon_ms_per_request:.3f}", r.wrk["errors"]) for r in runs], "rlrrrllllrr")
    errors = sum(r.wrk["errors"] for r in runs)
    short = [r for r in runs if r.entry.startswith("max2") and r.replicas_before < 2]
    rows = []
    for batching, one, two, aim in (("off", "max1-nobatch", "max2-nobatch", AIM_RATIO_OFF),
                                    ("on", "max1-batch", "max2-batch", AIM_RATIO_ON)):
        m1, m2 = median_of(runs, one), median_of(runs, two)
        pairs = paired(per_round(runs, two), per_round(runs, one))
        mid = statistics.median(pairs)
        rows.append((batching, f"{m1:,.0f}", f"{m2:,.0f}", f"{m2 / m1:.2f}x",
                     f"{mid:.2f}x ({min(pairs):.2f}-{max(pairs):.2f})", f">= {aim:g}x",
                     yes(mid >= aim and errors == 0 and not short)))
    lines += ["", *table(["batching", "max = 1, median req/s", "max = 2, median req/s",
                          "ratio of medians", "per-round ratios: median (range)", "aim", "met"],
                         rows, "lrrrrll")]
    lines += [
        "",
        "- Aims (the issue's): with two replicas, batching off, at least "
        f"{AIM_RATIO_OFF:g}x one replica; batching on, no loss (>= {AIM_RATIO_ON:g}x). "
        "\"met\" uses the median of the per-round ratios, and needs 0 errors and two ready "
        "replicas at the start of every `max = 2` run.",
        f"- Errors (non-2xx + socket errors) over all runs: {errors}.",
        "- CPU cores: CPU seconds per wall second of the measured run, of the daemon (all its "
        "threads), of wrk, and of everything else on the machine (its busy time less those "
        f"two; {psutil.cpu_count()} cores in all). \"other\" well above 0 means something "
        "else took cores from the run. The daemon's main thread runs the event loop (HTTP, "
        "codecs, scheduling); its busiest other thread is normally a replica's worker. A "
        "column near 1.00 is a thread that had no more to give.",
    ]
    if short:
        lines.append(f"- **{len(short)} `max = 2` run(s) started with fewer than two ready "
                     "replicas.**")
    one, two = ceiling
    lines += ["", "In-process onnxruntime on the same request (same file and rows, 1 intra-op "
              f"thread, {args.rounds} alternating runs of {min(args.duration, 5.0):g} s, "
              "median):", ""]
    lines += table(["sessions", "requests/s", "p50 ms per call", "other CPU cores (median)"], [
        ("one, one Python thread", f"{one.median:,.0f}", f"{one.p50_ms or 0:.3f}",
         f"{statistics.median(one.other_cores):.2f}"),
        ("two, one Python thread each", f"{two.median:,.0f} ({two.median / one.median:.2f}x)",
         "-", f"{statistics.median(two.other_cores):.2f}")])
    lines += ["", f"- Daemon at max = 1, batching off: "
              f"{median_of(runs, 'max1-nobatch') / one.median:.0%} of one session; at max = 2: "
              f"{median_of(runs, 'max2-nobatch') / two.median:.0%} of two sessions.", ""]
    return lines


def timeline_report(tl: Timeline, args: argparse.Namespace) -> list[str]:
    wrk = tl.wrk or {}
    lines = [
        f"### Replicas over time: `{TIMELINE_MODEL}` (max = 2, target_queue 2, "
        'scale_up_after "500ms", scale_down_after "3s", idle_timeout "5s", batching off)',
        "",
        f"No load for {args.quiet_before:g} s, wrk -t{args.wrk_threads} -c{args.concurrency[0]} "
        f"from {tl.spike_start:.2f} s to {tl.spike_end:.2f} s "
        f"({float(wrk.get('requests_per_s', 0)):,.0f} req/s, {wrk.get('errors', '-')} errors), "
        f"then no load until {args.quiet_before + args.spike + args.quiet_after:g} s. "
        f"`/admin/status` sampled every {args.sample_interval * 1000:g} ms ({len(tl.samples)} "
        "samples); rows where something changed:",
        "",
    ]
    lines += table(["t s", "load", "state", "replicas", "replica states", "desired",
                    "in flight + queued"],
                   [(f"{s.t:.2f}", "wrk" if s.traffic else "-", s.state, s.replicas, s.states,
                     s.desired if s.desired is not None else "-", s.load)
                    for s in changed_rows(tl.samples)], "rllrlrr")
    lines += ["", "Log lines of the model (t: when the script read them):", ""]
    lines += table(["t s", "line"], [(f"{t:.2f}", f"`{line}`") for t, line in tl.events], "rl")
    lines += ["", f"- Most replicas seen: {max((s.replicas for s in tl.samples), default=0)}."]
    start, end = tl.spike_start or 0.0, tl.spike_end or 0.0
    for label, event, origin, name in (
        ("second replica added", "replica_added", start, "the load started"),
        ("second replica removed", "replica_removed", end, "the load stopped"),
        ("model unloaded", "model_unloaded", end, "the load stopped"),
    ):
        at = next((t for t, line in tl.events if line.startswith(event) and t >= origin), None)
        lines.append(f"- {label}: " + (f"{at - origin:.2f} s after {name} (t = {at:.2f} s)."
                                       if at is not None else "**not seen**."))
    return [*lines, ""]
