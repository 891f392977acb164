"""What Prometheus metrics cost: the event subscriber in-process, and infer with metrics on vs
off (issue 13).

1. In-process (``--only in-process``). What one request's events cost the bus
   (``EventBus.publish`` of a ``RequestFinished`` and of a one-request ``BatchRun``), with the
   daemon's ``Metrics`` subscribed and without: ``timeit``, ``--calls`` requests per run, the
   median of ``--repeats`` runs, µs per request.
2. End to end (``--only end-to-end``). Two daemons at once on the bench MLP (preloaded, pinned,
   one intra-op thread): ``on`` (metrics recorded) and ``off`` (``[server.metrics] enabled =
   false``: ``/metrics`` answers 404). wrk sends the one-row JSON body at ``--concurrency``
   (64) to each in turn, ``--rounds`` rounds, the order reversed every other round, a warm-up
   then ``--duration`` seconds each; while ``on`` is measured, ``/metrics`` is scraped every
   ``--scrape-every`` seconds. The report gives medians, the daemon's CPU per request and the
   ratios on/off paired within a round, against the aim of issue 13: within 5%. ``on`` must
   have counted at least every request wrk completed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import timeit
from dataclasses import dataclass
from typing import Any

import httpx
from harness.cli import Bench
from harness.config import write_config
from harness.oip import new_session, random_rows, write_body
from harness.pairs import PairedRun, measure, medians_table, ratios
from harness.report import Outcome, table
from harness.rounds import alternate, median_or_nan
from harness.status import check_infer
from models import write_bench_mlp
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mlp"
WIDTH = 64  # the bench MLP's input features
VARIANTS = ("off", "on")
AIM_RATIO = 0.95  # issue 13: metrics on within 5 % of off


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=50_000,
                        help="in-process: requests per timed run (50000)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="in-process: timed runs per variant (5)")
    parser.add_argument("--scrape-every", type=float, default=5.0,
                        help="end to end: seconds between scrapes of `on` (5; 0: never)")


@dataclass(frozen=True)
class EventCost:
    label: str
    us_per_request: list[float]  # one per run

    @property
    def median_us(self) -> float:
        return statistics.median(self.us_per_request)


def in_process(calls: int, repeats: int) -> list[EventCost]:
    from snoozeml.api.metrics.prometheus import Metrics
    from snoozeml.engine.events import BatchRun, EventBus, RequestFinished
    from snoozeml.operations import Operation

    def no_snapshot() -> Any:
        raise RuntimeError("not scraped here")

    costs = []
    for label, subscribe in (("bus without subscribers", False), ("bus with Metrics", True)):
        bus = EventBus()
        if subscribe:
            Metrics([MODEL, "other"], no_snapshot).subscribe(bus)
        finished = RequestFinished(Operation.INFER, "http", MODEL, "ok", 200, 0.0012)
        batch = BatchRun(MODEL, 0, 1, (0.0003,), 0.0004, False)

        def one_request(bus: EventBus = bus, batch: BatchRun = batch,
                        finished: RequestFinished = finished) -> None:
            bus.publish(batch)
            bus.publish(finished)

        one_request()
        runs = timeit.Timer(one_request).repeat(repeat=repeats, number=calls)
        cost = EventCost(label, [run / calls * 1e6 for run in runs])
        print(f"in-process {label}: {cost.median_us:.3f} µs/request", file=sys.stderr,
              flush=True)
        costs.append(cost)
    return costs


class Scraper:
    """Scrapes /metrics every ``every`` seconds on a thread while it is entered."""

    def __init__(self, client: httpx.Client, every: float) -> None:
        self._client = client
        self._every = every
        self._stop = threading.Event()
        self.scrapes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        if self._every > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every):  # the interval of a scraper, not a sync
            self._client.get("/metrics").raise_for_status()
            self.scrapes += 1


def infer_count(client: httpx.Client) -> float:
    """``on``'s snooze_requests_total of successful HTTP inferences of the model."""
    response = client.get("/metrics")
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "snooze_requests_total" and sample.labels == {
                    "model": MODEL, "protocol": "http", "operation": "infer", "code": "200"}:
                return sample.value
    raise RuntimeError("on: no snooze_requests_total for the model's HTTP inferences")


def end_to_end(bench: Bench) -> list[PairedRun]:
    args, workdir = bench.args, bench.workdir
    write_bench_mlp(workdir / "mlp.onnx")
    model = [{"name": MODEL, "path": "mlp.onnx", "preload": True, "intra_op_threads": 1}]
    configs = {v: write_config(workdir / f"{v}.toml", model, server={
        "idle_timeout": "never", **({"metrics": {"enabled": False}} if v == "off" else {})})
        for v in VARIANTS}
    model_input = random_rows(1, WIDTH)
    body = workdir / "body.json"
    write_body(body, model_input)
    expected = new_session(workdir / "mlp.onnx").run(None, {"x": model_input})[0]
    runs: list[PairedRun] = []
    with contextlib.ExitStack() as stack:
        daemons = {v: stack.enter_context(bench.serve(configs[v], [MODEL])) for v in VARIANTS}
        for daemon in daemons.values():
            check_infer(daemon.client, MODEL, model_input, expected)
        if (status := daemons["off"].client.get("/metrics").status_code) != 404:
            raise RuntimeError(f"off: /metrics answered {status}, not 404")
        on = daemons["on"].client
        counted_before = infer_count(on)
        for round_no in range(1, args.rounds + 1):
            for variant in alternate(VARIANTS, round_no - 1):
                every = args.scrape_every if variant == "on" else 0.0
                runs.append(measure(daemons[variant], MODEL, body, variant, args.concurrency[0],
                                    round_no, args,
                                    during=lambda every=every: Scraper(on, every)))
        for daemon in daemons.values():  # still right after the load
            check_infer(daemon.client, MODEL, model_input, expected)
        completed = sum(int(r.wrk["requests"]) for r in runs if r.variant == "on")
        if (counted := infer_count(on) - counted_before) < completed:
            raise RuntimeError(f"on: counted {counted:.0f} inferences, wrk completed {completed}")
    return runs


def run(bench: Bench) -> Outcome:
    args = bench.args
    lines = bench.header("## Metrics benchmark: the cost of `/metrics`")
    costs: list[EventCost] = []
    runs: list[PairedRun] = []
    if bench.only("in-process"):
        costs = in_process(args.calls, args.repeats)
        lines += ["### In-process: one request's events (`RequestFinished` + one-request "
                  "`BatchRun`)", "", f"{args.calls:,} requests per run, median of "
                  f"{args.repeats} runs.", ""]
        lines += table(["bus", "µs per request (median)", "range of runs"],
                       [(c.label, f"{c.median_us:.3f}",
                         f"{min(c.us_per_request):.3f} to {max(c.us_per_request):.3f}")
                        for c in costs])
        lines += ["", f"Metrics add {costs[1].median_us - costs[0].median_us:.3f} µs per "
                  "request on the event loop.", ""]
    if bench.only("end-to-end"):
        runs = end_to_end(bench)
        lines += end_to_end_report(runs, args)
    return Outcome("\n".join(lines), {"in_process": costs, "runs": runs})


def end_to_end_report(runs: list[PairedRun], args: argparse.Namespace) -> list[str]:
    lines = [
        "### End to end: infer with metrics off and on", "",
        f"wrk -t{args.wrk_threads} -c{args.concurrency[0]}, one-row JSON body; {args.rounds} "
        f"round(s), each variant {args.warm_up:g} s warm-up then {args.duration:g} s, the "
        f"order reversed every other round; `on` scraped every {args.scrape_every:g} s while "
        "measured.", ""]
    lines += medians_table(runs, VARIANTS)
    cells = ratios(runs, "on", "off", args.concurrency[0], same_inline=False)
    off = {r.round: r.per_s for r in runs if r.variant == "off"}
    ratio = median_or_nan([r.per_s / off[r.round] for r in runs if r.variant == "on"])
    lines += ["", "Ratios on/off, paired within each round: median (range).", ""]
    lines += table(["req/s on/off", "p50 on/off", "p99 on/off", "CPU µs/request on - off"],
                   [cells], "rrrr")
    lines += ["", f"Aim of issue 13, req/s on/off >= {AIM_RATIO} (median of the paired "
              f"ratios): {'met' if ratio >= AIM_RATIO else '**not met**'}.", ""]
    return lines
