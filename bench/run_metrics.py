"""What Prometheus metrics cost: the event subscriber in-process, and infer with metrics on vs off.

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_metrics.py [--duration 10] [--rounds 3] [--out results.md]

1. In-process. What one request's events cost the bus (``EventBus.publish`` of a
   ``RequestFinished`` and of a one-request ``BatchRun``), with the daemon's ``Metrics``
   subscribed and without: ``timeit``, ``--calls`` pairs per run, the median of ``--repeats``
   runs, in microseconds per request. The difference is what metrics add on the event loop.
2. End to end. Two daemons at once on the bench MLP (64 -> 256 -> 64, preloaded, pinned,
   ``intra_op_threads = 1``): ``on`` (the default, metrics recorded) and ``off``
   (``[server.metrics] enabled = false``: no subscriber, ``/metrics`` answers 404). wrk sends
   the one-row JSON infer body at ``-t2 -c64`` (``--connections``) to each in turn,
   ``--rounds`` rounds, the order reversed every other round, each a wrk warm-up then
   ``--duration`` seconds. While ``on`` is measured, ``/metrics`` is scraped every
   ``--scrape-every`` seconds (0: never), as Prometheus would. The report gives the median
   requests/s, p50 and p99 of each, the daemon's CPU time per request (psutil: user + system,
   all threads), and the ratios on/off paired within a round (seconds apart, so they share the
   machine's drift), against the aim of issue 13: within 5 %. One answer per daemon is checked
   against onnxruntime in-process before and after; ``off`` must answer ``/metrics`` 404, and
   ``on`` must have counted at least every request wrk completed.

Prints a markdown report; ``--out FILE`` also writes it there, ``--json FILE`` the raw numbers.
It never appends to any file, and stops every daemon it started, also on errors.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import timeit
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from harness import (
    Daemon,
    check_infer,
    command_line,
    machine_line,
    median_or_nan,
    model_status,
    new_session,
    process_cpu_s,
    random_rows,
    run_wrk,
    spread,
    wait_loaded,
    wait_ready,
    write_body,
    wrk_errors,
)
from models import write_bench_mlp
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mlp"
WIDTH = 64  # the bench MLP's input features
VARIANTS = ("off", "on")
AIM_RATIO = 0.95  # issue 13: metrics on within 5 % of off

SERVER = f"""\
[server]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
idle_timeout = "never"
{{metrics}}
[[models]]
name = "{MODEL}"
path = "mlp.onnx"
preload = true
intra_op_threads = 1
"""


# --- in-process --------------------------------------------------------------------------


@dataclass(frozen=True)
class EventCost:
    label: str
    us_per_request: list[float]  # one per run

    @property
    def median_us(self) -> float:
        return statistics.median(self.us_per_request)


def in_process(calls: int, repeats: int) -> list[EventCost]:
    from snoozeml.api.metrics import Metrics
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


# --- end to end --------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    round: int
    variant: str
    wrk: dict[str, Any]
    daemon_cpu_s: float
    scrapes: int
    inline: bool  # the model ran its short batches on the event loop (docs/batching.md)

    @property
    def per_s(self) -> float:
        return float(self.wrk["requests_per_s"])

    @property
    def cpu_us_per_request(self) -> float:
        return self.daemon_cpu_s / max(1, int(self.wrk["requests"])) * 1e6


class Scraper:
    """Scrapes /metrics every `every` seconds on a thread while it is entered."""

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
    """`on`'s snooze_requests_total of successful HTTP inferences of the model."""
    response = client.get("/metrics")
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "snooze_requests_total" and sample.labels == {
                    "model": MODEL, "protocol": "http", "operation": "infer", "code": "200"}:
                return sample.value
    raise RuntimeError("on: no snooze_requests_total for the model's HTTP inferences")


def measure(variant: str, daemon: Daemon, client: httpx.Client, round_no: int, body: Path,
            args: argparse.Namespace) -> Run:
    url = f"{daemon.base_url}/v2/models/{MODEL}/infer"
    run_wrk(url, body, args.wrk_threads, args.connections, args.warm_up)
    every = args.scrape_every if variant == "on" else 0.0
    before = process_cpu_s(daemon.pid)
    with Scraper(client, every) as scraper:
        result = run_wrk(url, body, args.wrk_threads, args.connections, args.duration)
    cpu = process_cpu_s(daemon.pid) - before
    inline = bool(model_status(client, MODEL)["batching"].get("inline", False))
    run = Run(round_no, variant, result, cpu, scraper.scrapes, inline)
    print(f"round {round_no} {variant}: {json.dumps(result)} daemon CPU "
          f"{run.cpu_us_per_request:.1f} µs/request scrapes={run.scrapes} inline={inline}",
          file=sys.stderr, flush=True)
    if wrk_errors(result):
        raise RuntimeError(f"{variant}: errors in {result}")
    return run


def end_to_end(workdir: Path, args: argparse.Namespace) -> list[Run]:
    write_bench_mlp(workdir / "mlp.onnx")
    configs = {}
    for variant in VARIANTS:
        configs[variant] = workdir / f"{variant}.toml"
        table = "[server.metrics]\nenabled = false\n" if variant == "off" else ""
        configs[variant].write_text(SERVER.format(metrics=table), encoding="utf-8")
    model_input = random_rows(1, WIDTH)
    body = workdir / "body.json"
    write_body(body, model_input)
    expected = new_session(workdir / "mlp.onnx").run(None, {"x": model_input})[0]
    daemons: dict[str, Daemon] = {}
    clients: dict[str, httpx.Client] = {}
    runs: list[Run] = []
    try:
        for variant in VARIANTS:
            daemons[variant] = Daemon(args.python, configs[variant])
            clients[variant] = httpx.Client(base_url=daemons[variant].base_url, timeout=60.0)
        print("daemons up: " + ", ".join(f"{v} http={d.http_port}" for v, d in daemons.items()),
              file=sys.stderr)
        for client in clients.values():
            wait_ready(client, "/health/ready")
            wait_loaded(client, MODEL)  # preloaded: no load inside the timings
            check_infer(client, MODEL, model_input, expected)
        if (status := clients["off"].get("/metrics").status_code) != 404:
            raise RuntimeError(f"off: /metrics answered {status}, not 404")
        counted_before = infer_count(clients["on"])
        for round_no in range(1, args.rounds + 1):
            order = VARIANTS if round_no % 2 else tuple(reversed(VARIANTS))
            for variant in order:
                runs.append(measure(variant, daemons[variant], clients[variant], round_no, body,
                                    args))
        for client in clients.values():  # still right after the load
            check_infer(client, MODEL, model_input, expected)
        completed = sum(int(r.wrk["requests"]) for r in runs if r.variant == "on")
        counted = infer_count(clients["on"]) - counted_before
        if counted < completed:
            raise RuntimeError(f"on: counted {counted:.0f} inferences, wrk completed {completed}")
    except BaseException:
        for daemon in daemons.values():
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
        raise
    finally:
        for client in clients.values():
            client.close()
        for daemon in daemons.values():
            daemon.stop_and_warn()
    return runs


# --- report ------------------------------------------------------------------------------



def report(machine: str, costs: list[EventCost] | None, runs: list[Run] | None,
           args: argparse.Namespace) -> str:
    lines = ["## Metrics benchmark: the cost of `/metrics`", "", f"- {machine}",
             f"- command: `{command_line()}`", ""]
    if costs is not None:
        lines += [
            "### In-process: one request's events (`RequestFinished` + one-request `BatchRun`)",
            "",
            f"{args.calls:,} requests per run, median of {args.repeats} runs.",
            "",
            "| bus | µs per request (median) | range of runs |",
            "| --- | ---: | ---: |",
        ]
        lines += [f"| {c.label} | {c.median_us:.3f} | {min(c.us_per_request):.3f} to "
                  f"{max(c.us_per_request):.3f} |" for c in costs]
        lines += ["", f"Metrics add {costs[1].median_us - costs[0].median_us:.3f} µs per "
                  "request on the event loop.", ""]
    if runs is not None:
        lines += [
            "### End to end: infer with metrics off and on",
            "",
            f"wrk -t{args.wrk_threads} -c{args.connections}, one-row JSON body; {args.rounds} "
            f"round(s), each variant {args.warm_up:g} s warm-up then {args.duration:g} s, the "
            "order reversed every other round; `on` scraped every "
            f"{args.scrape_every:g} s while measured.",
            "",
            "| variant | req/s | p50 ms | p99 ms | daemon CPU µs/request | inline runs |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for variant in VARIANTS:
            mine = [r for r in runs if r.variant == variant]
            lines.append(
                f"| {variant} | {median_or_nan([r.per_s for r in mine]):,.0f} | "
                f"{median_or_nan([r.wrk['p50_ms'] for r in mine]):.3f} | "
                f"{median_or_nan([r.wrk['p99_ms'] for r in mine]):.3f} | "
                f"{median_or_nan([r.cpu_us_per_request for r in mine]):.1f} | "
                f"{sum(r.inline for r in mine)}/{len(mine)} |")
        off = {r.round: r for r in runs if r.variant == "off"}
        pairs = [(off[r.round], r) for r in runs if r.variant == "on"]
        ratios = [on.per_s / base.per_s for base, on in pairs]
        met = median_or_nan(ratios) >= AIM_RATIO
        lines += [
            "",
            "Ratios on/off, paired within each round: median (range).",
            "",
            "| req/s on/off | p50 on/off | p99 on/off | CPU µs/request on - off |",
            "| ---: | ---: | ---: | ---: |",
            f"| {spread(ratios, '.3f')} | "
            f"{spread([n.wrk['p50_ms'] / o.wrk['p50_ms'] for o, n in pairs], '.3f')} | "
            f"{spread([n.wrk['p99_ms'] / o.wrk['p99_ms'] for o, n in pairs], '.3f')} | "
            f"{spread([n.cpu_us_per_request - o.cpu_us_per_request for o, n in pairs], '+.1f')}"
            " |",
            "",
            f"Aim of issue 13, req/s on/off >= {AIM_RATIO} (median of the paired ratios): "
            f"{'met' if met else '**not met**'}.",
            "",
        ]
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=50_000,
                        help="in-process: requests per timed run (50000)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="in-process: timed runs per variant (5)")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="end to end: seconds per measured wrk run (10)")
    parser.add_argument("--warm-up", type=float, default=2.0,
                        help="end to end: seconds of wrk warm-up before each run (2)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="end to end: rounds of off and on (3)")
    parser.add_argument("--connections", type=int, default=64, help="wrk connections (64)")
    parser.add_argument("--wrk-threads", type=int, default=2, help="wrk threads (2)")
    parser.add_argument("--scrape-every", type=float, default=5.0,
                        help="end to end: seconds between scrapes of `on` (5; 0: never)")
    parser.add_argument("--only", choices=("in-process", "end-to-end"),
                        help="run one part only (default: both)")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the daemons")
    args = parser.parse_args(argv)
    if min(args.calls, args.repeats, args.rounds, args.connections, args.wrk_threads) < 1:
        parser.error("--calls, --repeats, --rounds, --connections and --wrk-threads must be "
                     ">= 1")
    if args.duration < 1 or args.scrape_every < 0:
        parser.error("--duration must be at least 1 and --scrape-every not negative")
    args.warm_up = max(1.0, args.warm_up)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.only != "in-process" and shutil.which("wrk") is None:
        print("wrk not found; run: bash bench/setup.sh", file=sys.stderr)
        return 2
    machine = machine_line()
    costs = in_process(args.calls, args.repeats) if args.only != "end-to-end" else None
    runs: list[Run] | None = None
    if args.only != "in-process":
        with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
            runs = end_to_end(Path(tmp), args)
    markdown = report(machine, costs, runs, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    if args.json is not None:
        raw = {
            "machine": machine,
            "command": command_line(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "in_process": [asdict(c) for c in costs or []],
            "runs": [asdict(r) for r in runs or []],
        }
        args.json.write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

