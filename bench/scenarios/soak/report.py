"""The soak test's verdict and report: cycles after the warm-up in phases, compared phase to
phase (RSS by median, fds, threads and tasks by their floor), and what failed."""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from harness.report import table

from scenarios.soak.probe import KNOWN_ERRORS, Cycle, Reading, Run

MIB = 1024 * 1024
RSS_GROWTH_LIMIT = 0.05
CLIENT_KINDS = ("http_json", "http_binary", "grpc", "metadata", "bad", "disconnect", "blink",
                "admin")


@dataclass
class Phase:
    label: str
    cycles: list[Cycle]
    before: dict[str, int]  # cumulative counts at the end of the cycle before it
    samples: list[Reading]

    def floor(self, metric: str) -> int:
        return min(int(getattr(c.quiet, metric)) for c in self.cycles)

    @property
    def rss(self) -> float:
        return float(statistics.median(c.quiet.rss_bytes for c in self.cycles))

    def peak(self, metric: str) -> int | None:
        values = [int(getattr(s, metric)) for s in self.samples]
        return max(values) if values else None

    def delta(self, *keys: str) -> int:
        end = self.cycles[-1].counts
        return sum(end.get(k, 0) - self.before.get(k, 0) for k in keys)


def phases(run: Run, count: int) -> tuple[Phase | None, list[Phase]]:
    """The warm-up and the `count` equal phases after it (fewer when cycles are short)."""
    warm = [c for c in run.cycles if c.start < run.warm_up_s]
    rest = [c for c in run.cycles if c.start >= run.warm_up_s]
    groups = [list(g) for g in np.array_split(np.arange(len(rest)), min(count, len(rest)))
              ] if rest else []
    result: list[Phase] = []
    for number, indices in enumerate(groups, 1):
        chosen = [rest[i] for i in indices]
        result.append(_phase(run, f"{number}", chosen))
    return (_phase(run, "warm-up", warm) if warm else None), result


def _phase(run: Run, label: str, cycles: list[Cycle]) -> Phase:
    first = cycles[0].index
    before = run.cycles[first - 1].counts if first > 0 else {}
    start = cycles[0].start
    end = cycles[-1].quiet.t
    samples = [s for s in run.samples if start <= s.t <= end]
    return Phase(label, cycles, before, samples)


def verdict(run: Run, compared: list[Phase]) -> list[str]:
    """Every reason the run fails; empty when it passes."""
    reasons: list[str] = []
    totals = Counter(run.tally.snapshot() + run.log.snapshot())
    if run.aborted:
        reasons.append(f"the run stopped early: {run.aborted}")
    if run.exit_code != 0:
        reasons.append(f"the daemon exited with {run.exit_code} on SIGTERM, not 0")
    elif not totals["server_stopped"]:
        reasons.append("the daemon exited without its server_stopped line")
    for problem, what in (("wrong", "wrong answers"), ("failed", "good requests failed"),
                          ("unexpected", "bad requests got an unexpected answer"),
                          ("soak_error", "errors in the soak script itself")):
        if totals[problem]:
            reasons.append(f"{totals[problem]} {what}: " + "; ".join(run.tally.examples[problem]))
    if totals["error_lines"] or totals["tracebacks"]:
        reasons.append(f"{totals['error_lines']} ERROR lines and {totals['tracebacks']} other "
                       f"tracebacks in the daemon log, first: {run.log.errors[0][0]}")
    if len(compared) < 2:
        reasons.append(f"only {len(compared)} phase(s) after the warm-up: nothing to compare "
                       "(a longer --duration, a shorter --cycle or --warm-up)")
    for a, b in itertools.pairwise(compared):
        if b.rss > a.rss * (1 + RSS_GROWTH_LIMIT):
            reasons.append(f"RSS grew {b.rss / a.rss - 1:.1%} from phase {a.label} "
                           f"({a.rss / MIB:.1f} MiB) to phase {b.label} ({b.rss / MIB:.1f} MiB)")
        for metric in ("open_fds", "threads", "asyncio_tasks"):
            if b.floor(metric) > a.floor(metric):
                reasons.append(f"{metric} grew from {a.floor(metric)} in phase {a.label} to "
                               f"{b.floor(metric)} in phase {b.label}")
    coverage = {
        "idle unloads": totals["unloaded:idle"],
        "evictions": totals["unloaded:memory_pressure"],
        "repository calls": totals["admin"],
        "client disconnects": totals["disconnect"],
        "bad requests": totals["bad"],
        "gRPC requests": totals["grpc"],
    }
    missing = [what for what, n in coverage.items() if not n]
    if missing:
        reasons.append("the run never exercised: " + ", ".join(missing))
    return reasons


# --- report ---------------------------------------------------------------------------------


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / MIB:.1f}"


def _n(value: int | None) -> str:
    return "—" if value is None else str(value)



def _per_phase(warm: Phase | None, compared: list[Phase]) -> list[str]:
    rows = [(phase.label, len(phase.cycles), _mib(phase.rss), phase.floor("open_fds"),
             phase.floor("threads"), phase.floor("asyncio_tasks"), _mib(phase.peak("rss_bytes")),
             _n(phase.peak("open_fds")), _n(phase.peak("threads")),
             _n(phase.peak("asyncio_tasks")), phase.delta("http_json", "http_binary", "grpc"),
             *(phase.delta(k) for k in ("metadata", "bad", "disconnect", "blink", "admin",
                                        "wrong")),
             phase.delta("failed", "unexpected"),
             *(phase.delta(k) for k in ("model_loaded", "unloaded:idle", "unloaded:admin",
                                        "unloaded:memory_pressure", "request_failed")))
            for phase in ([warm] if warm else []) + compared]
    return ["## Per phase", "",
            "Quiet-point figures (all traffic stopped, every non-pinned model unloaded): RSS is "
            "the median, fds, threads and tasks the minimum over the phase's quiet points; "
            "these are compared. Peaks are the highest of the background samples, under "
            "traffic. Requests and daemon events are counted over the phase.", "",
            *table(["phase", "cycles", "RSS MiB", "fds", "threads", "tasks", "peak RSS MiB",
                    "peak fds", "peak threads", "peak tasks", "infer", "meta", "bad", "disc.",
                    "blink", "admin", "wrong", "failed", "loads", "idle unl.", "admin unl.",
                    "evicted", "5xx logged"], rows)]


def _totals(run: Run, totals: Counter[str], compared: list[Phase]) -> list[str]:
    failed_by_status = ", ".join(f"{k.split(':')[1]}: {v}" for k, v in sorted(totals.items())
                                 if k.startswith("request_failed:")) or "none"
    known = ", ".join(f"{k} {totals['known:' + k]}" for k in KNOWN_ERRORS
                      if totals["known:" + k]) or "none"
    return [
        "## Totals", "",
        f"- Requests: {totals['http_json']} JSON, {totals['http_binary']} binary, "
        f"{totals['grpc']} gRPC infer, {totals['blink']} to the blink models, "
        f"{totals['metadata']} metadata, {totals['bad']} bad, {totals['disconnect']} "
        f"disconnects or cancels, {totals['admin']} repository calls.",
        f"- Problems: {totals['wrong']} wrong answers, {totals['failed']} failed good requests, "
        f"{totals['unexpected']} unexpected answers to bad requests, {totals['soak_error']} "
        "soak errors.",
        f"- Daemon: {totals['model_loaded']} loads, unloads {totals['unloaded:idle']} idle / "
        f"{totals['unloaded:admin']} admin / {totals['unloaded:memory_pressure']} evicted / "
        f"{totals['unloaded:oom']} OOM, {totals['model_load_deferred']} loads deferred for "
        f"memory, {totals['model_load_failed']} load failures; request_failed by status: "
        f"{failed_by_status}; {totals['error_lines']} unknown ERROR lines, "
        f"{totals['tracebacks']} other tracebacks, known ERROR records: {known}; exit code "
        f"{run.exit_code}.",
        "- Models at the end (measured size of the last load, loads): "
        + ", ".join(f"`{m['name']}` {_mib(m['measured_bytes'])} MiB {m['loads']}"
                    for m in run.final_models) + ".",
        f"- RSS at the quiet points, first phase to last: {_growth(compared)} (compared "
        "phase to phase only: a step that stays, an allocator's arena, isn't a leak).",
        f"- Quiet points: {sum(c.settled for c in run.cycles)} of {len(run.cycles)} settled "
        f"(three equal reads), median settle {_median([c.settle_s for c in run.cycles])} s. "
        f"This script's own fds/threads at the quiet points: "
        f"{_span([c.quiet.soak_fds for c in run.cycles])} / "
        f"{_span([c.quiet.soak_threads for c in run.cycles])}.", ""]


def _per_cycle(run: Run) -> list[str]:
    rows = []
    previous = 0
    for cycle in run.cycles:
        sent = sum(cycle.counts.get(k, 0) for k in CLIENT_KINDS)
        rows.append((cycle.index + 1, f"{cycle.quiet.t:.0f}", _mib(cycle.quiet.rss_bytes),
                     cycle.quiet.open_fds, cycle.quiet.threads, cycle.quiet.asyncio_tasks,
                     "yes" if cycle.settled else "no", sent - previous))
        previous = sent
    return ["## Per cycle (quiet points)", "",
            *table(["cycle", "t s", "RSS MiB", "fds", "threads", "tasks", "settled", "requests"],
                   rows, "rrrrrrlr")]


def _records(run: Run, totals: Counter[str]) -> list[str]:
    if not (run.log.errors or run.log.known or run.log.other):
        return []
    lines = ["", "## Daemon log records of note", ""]
    for record in run.log.errors:
        lines += ["Unknown ERROR (fails the run):", "", "```", *record, "```", ""]
    for kind, record in run.log.known.items():
        lines += [f"Known, {totals['known:' + kind]} times (reported, not failed on): "
                  f"{KNOWN_ERRORS[kind][1]} The first:", "", "```", *record, "```", ""]
    if run.log.other:
        lines += ["Lines outside the log format:", "", "```", *run.log.other, "```"]
    return lines


def report(run: Run, args: argparse.Namespace, header: list[str]) -> tuple[str, bool]:
    """The markdown report, and whether the run passed."""
    warm, compared = phases(run, args.phases)
    reasons = verdict(run, compared)
    totals = Counter(run.tally.snapshot() + run.log.snapshot())
    lines = [*header[:-1],
             f"- Ran {run.elapsed_s:.0f} s: {len(run.cycles)} cycles of {args.cycle:g} s "
             f"traffic and a quiet point; warm-up {run.warm_up_s:.0f} s, then {len(compared)} "
             f"phases. {args.clients} clients, host budget {run.budget}, models "
             + ", ".join(f"`{m.name}`" for m in run.models) + ".", ""]
    lines += [*_per_phase(warm, compared), "", *_totals(run, totals, compared)]
    lines += _per_cycle(run) + _held(compared) + _records(run, totals)
    lines += ["", "## Verdict", ""]
    lines += [f"- FAIL: {reason}" for reason in reasons] if reasons else [
        "PASS: no wrong answer, no failed good request, no log error, and from phase to phase "
        "RSS within 5% and no growth of fds, threads or asyncio tasks."]
    return "\n".join(lines) + "\n", not reasons


def _growth(compared: list[Phase]) -> str:
    if len(compared) < 2:
        return "—"
    first, last = compared[0].rss, compared[-1].rss
    return f"{_mib(first)} to {_mib(last)} MiB ({last / first - 1:+.1%})"


def _held(compared: list[Phase]) -> list[str]:
    """The first compared quiet point's fds and threads by kind, and how each later one
    differed from it: what a growth, or a straggler, was."""
    cycles = [cycle for phase in compared for cycle in phase.cycles]
    if not cycles:
        return []
    base = cycles[0]
    lines = ["", "## What the daemon held at the quiet points", "",
             f"Cycle {base.index + 1}, the first compared: fds "
             + _kinds(base.held["fds"]) + "; threads " + _kinds(base.held["threads"]) + ".", ""]
    changes = []
    for cycle in cycles[1:]:
        moved = [f"{after - before:+d} {what} {key}"
                 for what in ("fds", "threads")
                 for key in sorted(set(base.held[what]) | set(cycle.held[what]))
                 if (after := cycle.held[what].get(key, 0))
                 != (before := base.held[what].get(key, 0))]
        if moved:
            changes.append(f"- cycle {cycle.index + 1}: " + ", ".join(moved))
    return lines + (changes[:20] or ["Every later quiet point held the same."])


def _kinds(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def _median(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "—"


def _span(values: Sequence[int]) -> str:
    return "—" if not values else (f"{min(values)}" if min(values) == max(values)
                                   else f"{min(values)} to {max(values)}")
