"""A compressed slice of the trace replayed in real time against the real daemon, and the
simulator's prediction for the same slice (issue 34: within 10% on cold starts and idle
memory-time).

The slice: ``--replay-models`` models of the trace (timers, Poisson, bursty and rare models in
turn, none sending more than ``MAX_RATE`` requests a second once compressed), its first
``--replay-hours`` hours, compressed ``--compress`` times (60: a minute of the trace is a second,
a 15-minute timer calls every 15 s). Each model is an ONNX lookup table (models.py) of its
trace size divided by ``--size-scale``. One daemon serves them with ``keep_alive =
"adaptive"`` and ``idle_timeout`` = 10 min compressed (10 s at 60x), no budget, nothing
preloaded; a client sends every request at its time (open loop) and checks it answered 200.

Then the daemon's counts - cold starts caused by requests (``snooze_cold_starts_total``), idle
memory-time (``/admin/status`` ``keep_alive.idle_memory_byte_seconds``) - are set against the
simulator run on the same arrivals, with each model's size and load time as the daemon
measured them (``measured_bytes``, ``last_load_ms``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx
from harness.cli import Bench
from harness.config import write_config
from harness.report import table, yes
from harness.status import admin_status
from models import write_lookup_table

from .simulate import Policy, Result, Simulation
from .trace import Trace, generate

MIB = 2**20
WIDTH = 256  # FP32 values per table row
MAX_RATE = 4.0  # requests a second a replayed model may send at most
RUN_S = 0.001  # a lookup's run time, for the simulator
AIM = 0.10  # the daemon within 10% of the simulator
KIND_ORDER = ("timer", "poisson", "bursty", "rare")
COLD = re.compile(r'^snooze_cold_starts_total\{([^}]*)\} (\S+)$', re.M)
MODEL = re.compile(r'model="([^"]+)"')


def request_cold_starts(metrics: str) -> dict[str, int]:
    """Each model's loads caused by a request, from the daemon's /metrics."""
    found: dict[str, int] = {}
    for labels, value in COLD.findall(metrics):
        model = MODEL.search(labels)
        if model and 'cause="request"' in labels:
            found[model.group(1)] = int(float(value))
    return found


def add_replay_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replay-models", type=int, default=10,
                        help="replay: models of the trace in the slice (10)")
    parser.add_argument("--replay-hours", type=float, default=4.0,
                        help="replay: hours of the trace from its start (4)")
    parser.add_argument("--compress", type=float, default=60.0,
                        help="replay: trace seconds per real second (60)")
    parser.add_argument("--size-scale", type=float, default=20.0,
                        help="replay: trace MiB per MiB of a replayed model (20)")


def pick(trace: Trace, count: int, window_s: float, compress: float) -> list[int]:
    """Models of each kind in turn, each with a few requests in the window and none faster
    than MAX_RATE a real second."""
    minutes = int(window_s // 60)
    fit: dict[str, list[int]] = {kind: [] for kind in KIND_ORDER}
    for index, model in enumerate(trace.models):
        calls = int(model.counts[:minutes].sum())
        if calls >= 3 and calls / (window_s / compress) <= MAX_RATE:
            fit[model.kind].append(index)
    chosen: list[int] = []
    while len(chosen) < count and any(fit.values()):
        for kind in KIND_ORDER:
            if fit[kind] and len(chosen) < count:
                chosen.append(fit[kind].pop(0))
    return chosen


async def drive(base_url: str, names: Sequence[str],
                arrivals: Sequence[tuple[float, int]]) -> Counter[int]:
    """Every request at its time from now (open loop); the answers' status codes."""
    statuses: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0, limits=limits) as client:
        async def send(name: str, row: int) -> None:
            body = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64",
                                "data": [row]}]}
            try:
                response = await client.post(f"/v2/models/{name}/infer", json=body)
                statuses[response.status_code] += 1
            except httpx.HTTPError:
                statuses[0] += 1

        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for number, (at, index) in enumerate(arrivals):
            delay = start + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(names[index], number % 16)))
        await asyncio.gather(*tasks)
    return statuses


def replay(bench: Bench) -> tuple[list[str], dict[str, Any]]:
    """Long because it is one story: the slice, its models and config, the daemon, the
    client, the counts read back and the simulator's prediction beside them."""
    args = bench.args
    seed = args.seeds[0]
    trace = generate(seed, args.models, args.hours)
    window = args.replay_hours * 3600.0
    chosen = pick(trace, args.replay_models, window, args.compress)
    slot = {index: number for number, index in enumerate(chosen)}
    arrivals = [(at / args.compress, slot[index]) for at, index in trace.arrivals()
                if index in slot and at < window]
    end_s = window / args.compress
    names = [f"r{number:02d}" for number in range(len(chosen))]
    for number, index in enumerate(chosen):
        mib = trace.models[index].size_mib / args.size_scale
        rows = max(int(mib * MIB) // (WIDTH * 4), 16)
        write_lookup_table(bench.workdir / f"{names[number]}.onnx", rows, WIDTH, seed=number)
    fallback = 600.0 / args.compress
    config = write_config(
        bench.workdir / "models.toml",
        [{"name": n, "path": f"{n}.onnx", "intra_op_threads": 1} for n in names],
        server={"idle_timeout": f"{fallback:g}s", "keep_alive": "adaptive",
                "cache_dir": str(bench.workdir / "cache")})  # no history from an earlier run
    print(f"replay: {len(names)} models, {len(arrivals):,} requests over {end_s:.0f} s",
          file=sys.stderr)
    with bench.serve(config) as daemon:
        started = time.monotonic()
        statuses = asyncio.run(drive(daemon.base_url, names, arrivals))
        rest = end_s - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)  # the slice's end: idle memory-time counts up to it
        status = {m["name"]: m for m in admin_status(daemon.client)["models"]}
        metrics = daemon.client.get("/metrics").text
    (bench.workdir.parent / "snooze-keepalive-metrics.txt").write_text(metrics, encoding="utf-8")
    daemon_cold = request_cold_starts(metrics)
    if not daemon_cold:  # no metrics: every load less the pre-warms that loaded
        print("replay: no snooze_cold_starts_total in /metrics; counting loads", file=sys.stderr)
        for name in names:
            keep = (status[name].get("keep_alive") or {}).get("prewarms") or {}
            daemon_cold[name] = int(status[name]["loads"]) - int(keep.get("used", 0)) \
                - int(keep.get("wasted", 0))
    sizes = [(status[n]["measured_bytes"] or status[n]["predicted_bytes"] or 0) / MIB
             for n in names]
    loads = [(status[n]["last_load_ms"] or 0.0) / 1000 for n in names]
    predicted = Simulation([(s, ld, RUN_S) for s, ld in zip(sizes, loads, strict=True)],
                           arrivals, end_s, Policy("adaptive", fallback, adaptive=True)).run()
    return _report(args, trace, chosen, names, status, daemon_cold, statuses, predicted)


def _report(args: argparse.Namespace, trace: Trace, chosen: Sequence[int],
            names: Sequence[str], status: dict[str, Any], daemon_cold: dict[str, int],
            statuses: Counter[int], predicted: Result) -> tuple[list[str], dict[str, Any]]:
    idle = sum(float((status[n].get("keep_alive") or {}).get("idle_memory_byte_seconds", 0.0))
               for n in names) / MIB
    cold = sum(daemon_cold.get(n, 0) for n in names)
    prewarms = [(status[n].get("keep_alive") or {}).get("prewarms") or {} for n in names]
    used = sum(int(p.get("used", 0)) for p in prewarms)
    wasted = sum(int(p.get("wasted", 0)) for p in prewarms)
    sim_cold = predicted.loads - predicted.prewarms
    rows = []
    for number, (name, index) in enumerate(zip(names, chosen, strict=True)):
        model = trace.models[index]
        keep = status[name].get("keep_alive") or {}
        measured = (status[name]["measured_bytes"] or 0) / MIB
        rows.append([name, model.kind, model.detail, f"{measured:.1f}",
                     f"{status[name]['last_load_ms'] or 0:.0f}", status[name]["requests"],
                     daemon_cold.get(name, 0), predicted.per_model[number][0],
                     keep.get("reason") or "—",
                     f"{float(keep.get('idle_memory_byte_seconds', 0.0)) / MIB:,.0f}"])
    cold_ratio = cold / sim_cold if sim_cold else float("inf")
    idle_ratio = idle / predicted.idle_mib_s if predicted.idle_mib_s else float("inf")
    lines = ["### Real-time replay of a compressed slice", "",
             f"- slice: {len(names)} models of seed {args.seeds[0]}'s trace, its first "
             f"{args.replay_hours:g} h compressed {args.compress:g}x "
             f"({args.replay_hours * 3600 / args.compress:.0f} s), sizes / "
             f"{args.size_scale:g}; answers: "
             + ", ".join(f"{code or 'error'}: {n:,}" for code, n in sorted(statuses.items())),
             ""]
    per_model = table(["model", "kind", "trace", "MiB", "load ms", "requests", "cold starts",
                       "simulated", "plan", "idle MiB·s"], rows, "lllrrrrrlr")
    against = table(["", "daemon", "simulator", "ratio", "within 10%"], [
        ["cold starts (request loads)", cold, sim_cold, f"{cold_ratio:.2f}",
         yes(abs(cold_ratio - 1) <= AIM)],
        ["idle memory-time (MiB·s)", f"{idle:,.0f}", f"{predicted.idle_mib_s:,.0f}",
         f"{idle_ratio:.2f}", yes(abs(idle_ratio - 1) <= AIM)],
        ["pre-warms used / wasted", f"{used} / {wasted}",
         f"{predicted.prewarm_used} / {predicted.prewarm_wasted}", "", ""],
    ])
    lines += [*per_model, "", *against, ""]
    raw = {"daemon_cold": cold, "sim_cold": sim_cold, "daemon_idle_mib_s": idle,
           "sim_idle_mib_s": predicted.idle_mib_s, "statuses": dict(statuses),
           "models": rows}
    return lines, raw
