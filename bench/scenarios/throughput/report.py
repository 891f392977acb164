"""The throughput scenario's runs and report: served MLP ÷ null per width, encoding and
concurrency, served ÷ the in-process ceiling, c1 latency, and the profile."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from harness.cli import Bench
from harness.cpu import cpu_count
from harness.report import table
from harness.rounds import median_or_nan, paired, spread

from scenarios.throughput.profile import profile_lines

WIDTHS = (64, 512)
KINDS = ("null", "mlp")
JSON_HTTP, BINARY_HTTP, GRPC = "JSON HTTP", "binary HTTP", "gRPC"
ENCODINGS = (JSON_HTTP, BINARY_HTTP, GRPC)
PROFILE_CASE = ("mlp", 512, JSON_HTTP, 64)
AIM_RATIO_C64 = 0.8  # issue 19's aim for later: served MLP req/s >= 0.8 x null req/s at c64


def model_name(kind: str, width: int) -> str:
    return f"{kind}-{width}"


@dataclass(frozen=True)
class Run:
    """One measured run of one model, encoding and concurrency."""

    round: int
    kind: str
    width: int
    encoding: str
    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    batches: int
    rows: int
    worker_s: float  # seconds the model's worker spent on batches (merge, run, split)
    duration_s: float
    daemon_cpu_s: float
    client_cpu_s: float | None  # the gRPC client's own CPU; None for wrk
    inline: bool
    loop_cpu_s: float  # the main (event loop) thread's CPU over the run
    worker_cpu_s: float  # the busiest other thread's CPU (the model's worker, in HTTP runs)

    @property
    def rows_per_batch(self) -> float:
        return self.rows / self.batches if self.batches else float("nan")

    @property
    def worker_busy(self) -> float:
        return self.worker_s / self.duration_s

    @property
    def daemon_cpu_us(self) -> float:
        return self.daemon_cpu_s * 1e6 / max(self.requests_per_s * self.duration_s, 1.0)


@dataclass(frozen=True)
class Ceiling:
    width: int
    batch: int
    calls_per_s: float
    p50_ms: float

    @property
    def rows_per_s(self) -> float:
        return self.calls_per_s * self.batch



def formed_batch(run: Run) -> int:
    return max(1, round(run.rows_per_batch)) if run.batches else 1


def paired_ratios(runs: list[Run], width: int, encoding: str, concurrency: int) -> list[float]:
    """MLP req/s over null req/s, one per round."""
    rate = {kind: {r.round: r.requests_per_s for r in pick(runs, kind, width, encoding,
                                                             concurrency)} for kind in KINDS}
    return paired(rate["mlp"], rate["null"])


def pick(runs: list[Run], kind: str, width: int, encoding: str, concurrency: int) -> list[Run]:
    return [r for r in runs if (r.kind, r.width, r.encoding, r.concurrency)
            == (kind, width, encoding, concurrency)]


def served_row(runs: list[Run], ceiling_of: dict[tuple[int, int], Ceiling], width: int,
               encoding: str, concurrency: int) -> tuple[object, ...] | None:
    null = pick(runs, "null", width, encoding, concurrency)
    mlp = pick(runs, "mlp", width, encoding, concurrency)
    if not null or not mlp:
        return None
    over_ceiling = [r.requests_per_s / ceiling_of[(width, formed_batch(r))].rows_per_s
                    for r in mlp if (width, formed_batch(r)) in ceiling_of]
    ceiling_rows = [ceiling_of[(width, b)].rows_per_s for b in map(formed_batch, mlp)
                    if (width, b) in ceiling_of]
    client = "—"
    if encoding == GRPC:
        client = " / ".join(
            f"{median_or_nan([(r.client_cpu_s or 0) / r.duration_s for r in rs]):.0%}"
            for rs in (null, mlp))
    return (width, encoding, concurrency,
            f"{median_or_nan([r.requests_per_s for r in null]):,.0f}",
            f"{median_or_nan([r.requests_per_s for r in mlp]):,.0f}",
            spread(paired_ratios(runs, width, encoding, concurrency), ".2f"),
            f"{median_or_nan([r.rows_per_batch for r in mlp]):.1f}",
            f"{median_or_nan([r.worker_busy for r in mlp]):.0%}",
            f"{median_or_nan(ceiling_rows):,.0f}", spread(over_ceiling, ".2f"),
            f"{median_or_nan([r.daemon_cpu_us for r in null]):.0f} / "
            f"{median_or_nan([r.daemon_cpu_us for r in mlp]):.0f}",
            f"{median_or_nan([r.loop_cpu_s / r.duration_s for r in mlp]):.2f} + "
            f"{median_or_nan([r.worker_cpu_s / r.duration_s for r in mlp]):.2f}",
            client, sum(r.errors for r in null + mlp))


def latency_rows(runs: list[Run], ceiling_of: dict[tuple[int, int], Ceiling],
                 args: argparse.Namespace) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for width in args.widths:
        for encoding in args.encodings:
            null, mlp = (pick(runs, kind, width, encoding, 1) for kind in KINDS)
            if null and mlp:
                single = ceiling_of.get((width, 1))
                cells = [f"{median_or_nan([r.p50_ms for r in rs]):.3f} / "
                         f"{median_or_nan([r.p99_ms for r in rs]):.3f}" for rs in (null, mlp)]
                rows.append((width, encoding, *cells,
                             f"{single.p50_ms if single else float('nan'):.3f}"))
    return rows


def report(bench: Bench, runs: list[Run], found: list[Ceiling],
           prof: dict[str, Any] | None) -> str:
    args = bench.args
    ceiling_of = {(c.width, c.batch): c for c in found}
    lines = bench.header(
        "### Throughput under load: null model against MLP, one row per request",
        f"{args.rounds} round(s); each run {args.warm_up:g} s warm-up then {args.duration:g} s "
        "measured; null and MLP back to back, the order reversed every other round",
        "models: `null-N` one Relu N→N, `mlp-N` N→4N→4N→N; `intra_op_threads = 1`, batching at "
        "the defaults (`max_batch_size = 32`, `max_delay = 0`), preloaded, pinned",
        "load: wrk with `post.lua` for HTTP (`-t1` at c1, `-t2` above); `grpc_load.py` "
        "(grpc.aio, one channel, c calls in flight, its own process) for gRPC. **Client and "
        f"daemon share the same {cpu_count()} CPU(s)**: every row measures contention too.")
    rows = [row for width in args.widths for encoding in args.encodings
            for concurrency in args.concurrency
            if (row := served_row(runs, ceiling_of, width, encoding, concurrency)) is not None]
    lines += ["#### Served throughput (median over rounds) and the ratio MLP ÷ null", ""]
    lines += table(["width", "encoding", "c", "null req/s", "MLP req/s", "MLP ÷ null (per round)",
                    "MLP rows/batch", "MLP worker busy", "ceiling rows/s at that batch",
                    "served ÷ ceiling", "daemon CPU µs/req null / MLP",
                    "MLP cores: loop + busiest other thread", "client CPU (gRPC) null / MLP",
                    "errors"], rows, "rlrrrlrrrrllll")
    lines += [
        "",
        "- MLP ÷ null: median (range) of the per-round ratios. *rows/batch*: Δrows ÷ Δbatches of "
        "`/admin/status` over the run; *worker busy*: the model's worker seconds (merge, run, "
        "split) over the run's seconds; *served ÷ ceiling*: served rows/s over in-process "
        "`session.run` rows/s at the run's mean rows per batch (rounded). *daemon CPU*: user + "
        "system of all its threads over the run, per request. *cores*: CPU seconds per second of "
        "the main thread (event loop: HTTP, codec, gRPC servicer) and of the busiest other "
        "thread: the model's worker (merge, `session.run`, split) over HTTP; over gRPC it can "
        "be grpcio's poller.",
        "", "#### In-process ceiling (MLP, `session.run`, 1 intra-op thread, one Python thread)",
        ""]
    lines += table(["width", "batch", "rows/s", "ms per call (p50)"],
                   [(c.width, c.batch, f"{c.rows_per_s:,.0f}", f"{c.p50_ms:.3f}") for c in found],
                   "rrrr")
    if 1 in args.concurrency:
        lines += ["", "#### Latency at c1 (ms, median over rounds)", ""]
        lines += table(["width", "encoding", "null p50 / p99", "MLP p50 / p99",
                        "MLP in-process batch 1 p50"], latency_rows(runs, ceiling_of, args),
                       "rlllr")
    if aim := paired_ratios(runs, 512, JSON_HTTP, 64):
        ratio = median_or_nan(aim)
        lines += ["", f"Issue 19's later aim, MLP 512 ÷ null 512 ≥ {AIM_RATIO_C64} at c64 (JSON "
                  f"HTTP): {ratio:.2f} — {'met' if ratio >= AIM_RATIO_C64 else 'not met'}."]
    if prof is not None:
        kind, width, encoding, concurrency = PROFILE_CASE
        case = f"{model_name(kind, width)}, {encoding}, c{concurrency}"
        lines += ["", *profile_lines(prof, args, case)]
    return "\n".join(lines) + "\n"


