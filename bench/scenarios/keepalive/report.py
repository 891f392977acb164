"""The keep-alive scenario's tables, its Pareto plot (an SVG written by hand) and its verdict
against issue 34's aims."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from harness.report import yes

from .simulate import Result
from .trace import Trace

AIM_HALF = 0.5  # adaptive: half the cold starts (or half the idle memory-time)
AIM_COST = 0.7  # cost-aware: at least 30% fewer cold starts than LRU


def gib_h(mib_s: float) -> str:
    return f"{mib_s / 1024 / 3600:,.1f}"


def policy_rows(results: Sequence[Result]) -> list[list[object]]:
    frontier = pareto(results)
    rows: list[list[object]] = []
    for r in results:
        p = r.policy
        budget = "none" if p.budget_mib is None else f"{p.budget_mib / 1024:.1f} GiB"
        rows.append([
            p.name, budget, p.eviction if p.budget_mib is not None else "—",
            f"{r.requests:,}", f"{r.cold:,}", f"{100 * r.cold_rate:.3f}%",
            f"{1000 * r.p99_added_s():.0f}", f"{r.idle_mib_s:,.0f}", gib_h(r.idle_mib_s),
            f"{r.prewarms:,} / {r.prewarm_used:,} / {r.prewarm_wasted:,}",
            f"{r.evictions:,}", "yes" if r in frontier else ""])
    return rows


HEADER = ["policy", "budget", "eviction", "requests", "cold starts", "cold-start rate",
          "p99 added ms", "idle MiB·s", "idle GiB·h", "pre-warms / used / wasted",
          "evictions", "Pareto"]


def pareto(results: Sequence[Result]) -> list[Result]:
    """The results no other one beats on both cold starts and idle memory-time."""
    return [r for r in results
            if not any((o.cold <= r.cold and o.idle_mib_s <= r.idle_mib_s)
                       and (o.cold < r.cold or o.idle_mib_s < r.idle_mib_s) for o in results)]


@dataclass(frozen=True)
class Verdict:
    what: str
    ratio_cold: float
    ratio_idle: float
    met: bool


def adaptive_aim(adaptive: Result, fixed: Result, what: str) -> Verdict:
    cold = adaptive.cold / fixed.cold if fixed.cold else math.inf
    idle = adaptive.idle_mib_s / fixed.idle_mib_s if fixed.idle_mib_s else math.inf
    met = (cold <= AIM_HALF and idle <= 1.0) or (idle <= AIM_HALF and cold <= 1.0)
    return Verdict(what, cold, idle, met)


def cost_aim(cost: Result, lru: Result, what: str) -> Verdict:
    cold = cost.cold / lru.cold if lru.cold else math.inf
    idle = cost.idle_mib_s / lru.idle_mib_s if lru.idle_mib_s else math.inf
    return Verdict(what, cold, idle, cold <= AIM_COST)


def verdict_rows(verdicts: Sequence[Verdict]) -> list[list[object]]:
    return [[v.what, f"{v.ratio_cold:.2f}x", f"{v.ratio_idle:.2f}x", yes(v.met)]
            for v in verdicts]


def svg_plot(results: Sequence[Result], title: str) -> str:
    """Cold-start rate (y, log) against idle memory-time (x, GiB·h), one labelled point per
    policy, the Pareto front joined."""
    width, height, left, right, top, bottom = 720, 440, 80, 30, 40, 60
    points = [(r.idle_mib_s / 1024 / 3600, max(r.cold_rate, 1e-6), r) for r in results]
    xs = [p[0] for p in points]
    ys = [math.log10(p[1]) for p in points]
    x_max = max(xs) * 1.08 or 1.0
    y_lo, y_hi = math.floor(min(ys)), math.ceil(max(ys))
    y_hi = y_hi if y_hi > y_lo else y_lo + 1

    def at(x: float, y: float) -> tuple[float, float]:
        return (left + (width - left - right) * x / x_max,
                top + (height - top - bottom) * (y_hi - math.log10(y)) / (y_hi - y_lo))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="13">'
           f'{escape(title)}</text>']
    x0, y0 = at(0, 10.0 ** y_lo)
    x1, y1 = at(x_max, 10.0 ** y_hi)
    out.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" '
               'fill="none" stroke="#888"/>')
    for decade in range(y_lo, y_hi + 1):
        _, y = at(0, 10.0 ** decade)
        out.append(f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4}" text-anchor="end">'
                   f'{100 * 10.0 ** decade:g}%</text>')
    for tick in range(6):
        value = x_max * tick / 5
        x, _ = at(value, 10.0 ** y_lo)
        out.append(f'<text x="{x}" y="{y0 + 16}" text-anchor="middle">{value:,.0f}</text>')
    out.append(f'<text x="{width / 2}" y="{height - 15}" text-anchor="middle">'
               'idle memory-time (GiB·h)</text>')
    out.append(f'<text x="18" y="{height / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {height / 2})">cold-start rate (log)</text>')
    front = sorted((p for p in points if p[2] in pareto(results)), key=lambda p: p[0])
    path = " ".join(f"{at(x, y)[0]:.1f},{at(x, y)[1]:.1f}" for x, y, _ in front)
    out.append(f'<polyline points="{path}" fill="none" stroke="#4a8" stroke-dasharray="4 3"/>')
    for x, y, r in points:
        px, py = at(x, y)
        colour = "#c33" if r.policy.adaptive else "#336"
        out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{colour}"/>')
        out.append(f'<text x="{px + 6:.1f}" y="{py - 6:.1f}">{escape(r.policy.name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def kind_rows(trace: Trace) -> list[list[object]]:
    """Per kind of model: how many, their requests, their sizes."""
    rows: list[list[object]] = []
    for kind in ("timer", "poisson", "bursty", "rare"):
        models = [m for m in trace.models if m.kind == kind]
        if models:
            rows.append([kind, len(models), f"{sum(int(m.counts.sum()) for m in models):,}",
                         f"{sum(m.size_mib for m in models) / 1024:,.1f}",
                         "; ".join(m.detail for m in models[:4]) + ("…" * (len(models) > 4))])
    return rows


def by_kind_rows(trace: Trace, fixed: Result, adaptive: Result) -> list[list[object]]:
    """Per kind of model: cold starts and idle memory-time under the fixed window and under
    adaptive (where the difference comes from)."""
    rows: list[list[object]] = []
    for kind in ("timer", "poisson", "bursty", "rare"):
        mine = [i for i, m in enumerate(trace.models) if m.kind == kind]
        if not mine:
            continue
        f_cold = sum(fixed.per_model[i][0] for i in mine)
        a_cold = sum(adaptive.per_model[i][0] for i in mine)
        f_idle = sum(fixed.per_model[i][1] for i in mine)
        a_idle = sum(adaptive.per_model[i][1] for i in mine)
        rows.append([kind, len(mine), f_cold, a_cold, gib_h(f_idle), gib_h(a_idle)])
    return rows
