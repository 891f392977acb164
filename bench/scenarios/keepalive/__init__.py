"""Scale-to-zero that learns, measured on a replayed trace (issue 34).

`simulation`: a seeded trace of ``--models`` models over ``--hours`` hours shaped like the
Azure Functions 2019 trace (trace.py: timers, Poisson at heavy-tailed rates with diurnal
swings, bursts, rare models; each model a size and a load time) is replayed on a virtual clock
(simulate.py) through the engine's own policy code, once per policy: fixed keep-alive windows
of 30 s, 1, 5, 10 and 30 min and never, and ``adaptive`` (engine/keepalive/'s plan, falling
back to 10 min) without a memory budget; then under a budget that holds a third of the models'
memory, fixed 10 min and adaptive each with LRU and with cost-aware eviction
(pick_victims_by_cost). Reported per run: cold starts and their rate, the p99 of the latency
they add, idle memory-time (MiB·s held loaded while no request runs), pre-warms used and
wasted, evictions; the Pareto front; for every seed of ``--seeds``, the verdict on the issue's
aims: adaptive at least 50% fewer cold starts than fixed 10 min with no more idle memory-time
(or 50% less idle memory-time with no more cold starts), cost-aware at least 30% fewer cold
starts than LRU under the budget. ``--plot FILE`` writes the first seed's plot (SVG).

`replay`: a compressed slice of the trace against the real daemon (replay.py), with
``keep_alive = "adaptive"``: cold starts and idle memory-time counted by the daemon against the
simulator's prediction for the same slice.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from harness.cli import Bench
from harness.report import Outcome, table

from .report import (
    HEADER,
    Verdict,
    adaptive_aim,
    by_kind_rows,
    cost_aim,
    kind_rows,
    policy_rows,
    svg_plot,
    verdict_rows,
)
from .simulate import Policy, Result, simulate
from .trace import Trace, generate

FIXED_WINDOWS = (("fixed 30 s", 30.0), ("fixed 1 min", 60.0), ("fixed 5 min", 300.0),
                 ("fixed 10 min", 600.0), ("fixed 30 min", 1800.0), ("never", None))
BASELINE_S = 600.0  # the fixed 10-minute keep-alive; adaptive's fallback


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", type=int, default=60, help="models in the trace (60)")
    parser.add_argument("--hours", type=float, default=12.0,
                        help="hours of virtual time (12)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                        help="trace seeds, one simulation each (1 2 3)")
    parser.add_argument("--budget-share", type=float, default=1 / 3,
                        help="the budget as a share of every model's memory (a third)")
    parser.add_argument("--plot", type=Path, help="write the first seed's plot (SVG) here")
    from .replay import add_replay_options

    add_replay_options(parser)


def policies(trace: Trace, budget_share: float) -> list[Policy]:
    budget = budget_share * sum(m.size_mib for m in trace.models)
    found = [Policy(name, window) for name, window in FIXED_WINDOWS]
    found.append(Policy("adaptive", BASELINE_S, adaptive=True))
    for eviction in ("lru", "cost"):
        found.append(Policy(f"fixed 10 min, {eviction}", BASELINE_S, eviction=eviction,
                            budget_mib=budget))
        found.append(Policy(f"adaptive, {eviction}", BASELINE_S, adaptive=True,
                            eviction=eviction, budget_mib=budget))
    return found


def verdicts(results: list[Result], seed: int) -> list[Verdict]:
    by_name = {r.policy.name: r for r in results}
    return [
        adaptive_aim(by_name["adaptive"], by_name["fixed 10 min"],
                     f"seed {seed}: adaptive vs fixed 10 min, no budget"),
        adaptive_aim(by_name["adaptive, cost"], by_name["fixed 10 min, cost"],
                     f"seed {seed}: adaptive vs fixed 10 min, budget, cost-aware"),
        adaptive_aim(by_name["adaptive, lru"], by_name["fixed 10 min, lru"],
                     f"seed {seed}: adaptive vs fixed 10 min, budget, LRU"),
        cost_aim(by_name["fixed 10 min, cost"], by_name["fixed 10 min, lru"],
                 f"seed {seed}: cost-aware vs LRU, fixed 10 min"),
        cost_aim(by_name["adaptive, cost"], by_name["adaptive, lru"],
                 f"seed {seed}: cost-aware vs LRU, adaptive"),
    ]


def simulation(args: argparse.Namespace) -> tuple[list[str], dict[str, Any], bool]:
    """Every policy on every seed's trace: the report's lines, the raw numbers, all aims met."""
    lines: list[str] = []
    raw: dict[str, Any] = {}
    found: list[Verdict] = []
    for number, seed in enumerate(args.seeds):
        trace = generate(seed, args.models, args.hours)
        started = time.perf_counter()
        arrivals = trace.arrivals()
        results = [simulate(trace, policy, arrivals)
                   for policy in policies(trace, args.budget_share)]
        print(f"seed {seed}: {trace.requests:,} requests, {len(results)} policies in "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
        total = sum(m.size_mib for m in trace.models) / 1024
        lines += [f"### Seed {seed}: {len(trace.models)} models, {args.hours:g} h, "
                  f"{trace.requests:,} requests, {total:,.1f} GiB of models", ""]
        if number == 0:
            kinds = table(["kind", "models", "requests", "GiB", "e.g."], kind_rows(trace),
                          "lrrrl")
            lines += [*kinds, ""]
        lines += [*table(HEADER, policy_rows(results)), ""]
        by_name = {r.policy.name: r for r in results}
        kinds = table(["kind", "models", "cold: fixed 10 min", "cold: adaptive",
                       "idle GiB·h: fixed 10 min", "idle GiB·h: adaptive"],
                      by_kind_rows(trace, by_name["fixed 10 min"], by_name["adaptive"]))
        lines += ["Where the difference comes from (no budget):", "", *kinds, ""]
        found += verdicts(results, seed)
        raw[f"seed {seed}"] = [_raw(r) for r in results]
        if number == 0 and args.plot is not None:
            unbudgeted = [r for r in results if r.policy.budget_mib is None]
            args.plot.write_text(svg_plot(unbudgeted, f"Issue 34: {len(trace.models)} "
                                          f"models, {args.hours:g} h, seed {seed}, no budget"),
                                 encoding="utf-8")
    lines += ["### The aims", ""]
    aims = table(["aim", "cold starts (ratio)", "idle memory-time (ratio)", "met"],
                 verdict_rows(found))
    lines += [*aims, ""]
    return lines, raw, all(v.met for v in found)


def _raw(result: Result) -> dict[str, Any]:
    return {"policy": result.policy.name, "budget_mib": result.policy.budget_mib,
            "eviction": result.policy.eviction, "requests": result.requests,
            "cold": result.cold, "cold_partial": result.cold_partial,
            "p99_added_s": result.p99_added_s(), "idle_mib_s": result.idle_mib_s,
            "held_mib_s": result.held_mib_s, "loads": result.loads,
            "prewarms": result.prewarms, "prewarm_used": result.prewarm_used,
            "prewarm_wasted": result.prewarm_wasted, "prewarm_skipped": result.prewarm_skipped,
            "evictions": result.evictions, "over_budget": result.over_budget,
            "reasons": result.reasons}


def run(bench: Bench) -> Outcome:
    args = bench.args
    lines = bench.header("## Issue 34: keep-alive on a replayed trace",
                         f"trace: {args.models} models, {args.hours:g} h of virtual time, "
                         f"seeds {' '.join(map(str, args.seeds))}; budget runs: "
                         f"{args.budget_share:.2f} of the models' memory")
    raw: dict[str, Any] = {}
    if bench.only("simulation"):
        part, raw["simulation"], met = simulation(args)
        lines += [*part, f"All aims met: {'yes' if met else '**no**'}", ""]
    if bench.only("replay"):
        from .replay import replay

        part, raw["replay"] = replay(bench)
        lines += part
    return Outcome("\n".join(lines), raw)
