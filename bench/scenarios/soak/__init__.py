"""Soak test of the daemon (issue 15 part 5): minutes of every kind of trouble at once, then
proof that nothing grew. It exits 1 when it finds a problem.

Models (``served.py``), served by one daemon with ``host_budget = --budget`` (40 MiB):
``hot``, the bench MLP, preloaded and pinned; ``blink`` and ``blink-nb`` (batching off),
``idle_timeout = "2s"``, sent to only every 2.3 to 3.5 s, so nearly every request rehydrates;
``--churn`` (8) MLPs 128-1024-1024-128 of about 5 MiB, ``idle_timeout = "3s"``: more than the
budget holds together, so loads evict.

Traffic (``traffic.py``) runs in **cycles** of ``--cycle`` seconds (10). ``--clients`` (4)
threads, each with its own httpx client and gRPC channel, send JSON, binary-extension and gRPC
inferences (1 to 4 rows) and metadata reads to ``hot`` and, in the first part of the cycle
(all but ``--calm``), to the churn models; every answer is checked against onnxruntime in this
process. Mixed in: bad requests that must get their own 400/404 or gRPC code, and clients that
leave mid-request (half a body, a reset, a read timeout of a few ms, a cancelled gRPC call or a
deadline of a few ms). One more thread sends to the blink models, one calls repository load and
unload every ~``--admin-every`` seconds (3).

Then a **quiet point** (``probe.py``): every client finishes and closes its connections, every
non-pinned model is unloaded, and once nothing is in flight or reserved the daemon's RSS, fds,
threads and asyncio tasks are read until three reads agree, with what its fds and threads are.
Tasks, threads and descriptors move with the traffic, so only at a quiet point, where the
daemon holds the same things each time, can they be compared to the unit. A sampler also reads
them every ``--sample-interval`` seconds for the peaks.

**Phases** (``report.py``). Cycles that start after ``--warm-up`` (20% of the duration, or
seconds) are split into ``--phases`` (4) groups. The run **fails** when, from one phase to the
next, the median quiet-point RSS grows by more than 5% or the lowest count of fds, threads or
tasks grows at all; when any answer is wrong, any good request fails, or a bad request gets
another answer; when the daemon logs an ERROR line or a traceback, dies, or doesn't exit 0 on
SIGTERM; or when the run didn't exercise what it claims (an idle unload, an eviction, a
repository call, a disconnect, a bad request, a gRPC call).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

import httpx
import psutil
from harness.cli import Bench, seconds
from harness.daemon import Daemon
from harness.report import Outcome
from harness.status import wait_ready

from scenarios.soak.clients import PROBLEMS, Gate, Tally
from scenarios.soak.probe import (
    PARK_TIMEOUT_S,
    Cycle,
    LogWatch,
    Probe,
    Run,
    Sampler,
    SoakAbort,
    quiet_point,
)
from scenarios.soak.report import report
from scenarios.soak.served import ServedModel, write_config, write_models
from scenarios.soak.traffic import Traffic, admin, blinker, worker

MIB = 1024 * 1024


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phases", type=int, default=4, help="phases compared after warm-up")
    parser.add_argument("--cycle", type=seconds, default=10.0,
                        help="seconds of traffic between two quiet points (10)")
    parser.add_argument("--calm", type=float, default=0.5,
                        help="share of each cycle, at its end, without churn traffic (0.5)")
    parser.add_argument("--sample-interval", type=seconds, default=2.0,
                        help="seconds between background samples (2)")
    parser.add_argument("--clients", type=int, default=4, help="traffic threads (4)")
    parser.add_argument("--churn", type=int, default=8, help="churn models (8)")
    parser.add_argument("--budget", default="40MiB", help="host_budget (40MiB)")
    parser.add_argument("--admin-every", type=seconds, default=3.0,
                        help="mean seconds between repository calls (3)")


def client_threads(traffic: Traffic, args: argparse.Namespace) -> list[threading.Thread]:
    threads = [threading.Thread(target=worker, args=(traffic, f"{args.seed}-w{i}"),
                                name=f"soak-worker-{i}", daemon=True)
               for i in range(args.clients)]
    threads.append(threading.Thread(target=blinker, args=(traffic, f"{args.seed}-blink"),
                                    name="soak-blinker", daemon=True))
    threads.append(threading.Thread(target=admin, name="soak-admin", daemon=True,
                                    args=(traffic, f"{args.seed}-admin", args.admin_every)))
    return threads


def cycles(args: argparse.Namespace, traffic: Traffic, probe: Probe, log: LogWatch,
           died: threading.Event, start: float) -> list[Cycle]:
    """Traffic, then a quiet point, until ``--duration`` is spent or the daemon dies."""
    done: list[Cycle] = []
    tally = traffic.tally
    while time.monotonic() - start + args.cycle / 2 < args.duration and not died.is_set():
        began = time.monotonic() - start
        traffic_s = min(args.cycle, args.duration - began)
        traffic.churn_until = time.monotonic() + traffic_s * (1 - args.calm)
        traffic.gate.open()
        traffic.gate.pause(traffic_s)
        reading, settled, settle_s, held = quiet_point(probe, traffic.gate, traffic.models,
                                                       tally)
        done.append(Cycle(len(done), round(began, 2), round(traffic_s, 2), reading, settled,
                          round(settle_s, 2), dict(tally.snapshot() + log.snapshot()), held))
        print(f"cycle {len(done)}: t={reading.t:.0f}s rss={reading.rss_bytes / MIB:.1f}MiB "
              f"fds={reading.open_fds} threads={reading.threads} tasks={reading.asyncio_tasks} "
              f"problems={sum(tally.counts[p] for p in PROBLEMS)}", file=sys.stderr)
    if died.is_set():
        raise SoakAbort("the daemon died")
    return done


def soak(bench: Bench, models: list[ServedModel]) -> Run:
    """Long because it owns the daemon, the probe, the sampler and the client threads, and
    stops them all, in order, whatever happened: the exit code is part of the verdict."""
    args = bench.args
    log = LogWatch()
    daemon = Daemon(args.python, write_config(bench.workdir, models, args.budget),
                    on_line=log.on_line)
    print(f"daemon up: http={daemon.http_port} grpc={daemon.grpc_port} pid={daemon.pid}",
          file=sys.stderr)
    start = time.monotonic()
    gate = Gate()
    traffic = Traffic(daemon, models, gate, Tally(start))
    probe = Probe(daemon, start, str(bench.workdir))
    died = threading.Event()

    def on_death() -> None:
        died.set()
        gate.stop()

    sampler = Sampler(probe, args.sample_interval, on_death)
    threads = client_threads(traffic, args)
    done: list[Cycle] = []
    final_models: list[dict[str, Any]] = []
    aborted: str | None = None
    try:
        wait_ready(probe.client)
        for thread in threads:
            thread.start()
        sampler.start()
        done = cycles(args, traffic, probe, log, died, start)
        final_models = [{k: m[k] for k in ("name", "measured_bytes", "loads")}
                        for m in probe.status()["models"]]
    except (SoakAbort, httpx.HTTPError, psutil.Error) as exc:
        aborted = f"{type(exc).__name__}: {exc}"
    finally:
        gate.stop()
        for thread in threads:
            thread.join(timeout=PARK_TIMEOUT_S)
        sampler.stop()
        probe.close()
        elapsed = time.monotonic() - start
        exit_code = daemon.stop(timeout_s=60)
        if aborted:
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
    return Run(done, sampler.readings, args.warm_up, traffic.tally, log, exit_code, aborted,
               models, args.budget, elapsed, final_models)


def run(bench: Bench) -> Outcome:
    models = write_models(bench.workdir, bench.args.churn, bench.args.seed)
    result = soak(bench, models)
    text, passed = report(result, bench.args, bench.header("# SnoozeML soak"))
    return Outcome(text, {"cycles": result.cycles, "samples": result.samples,
                          "warm_up_s": result.warm_up_s}, passed)
