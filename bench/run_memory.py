"""Memory-budget benchmark for the SnoozeML daemon (issue 5): many models, a small budget.

Usage (from the repository root)::

    .venv/bin/python bench/run_memory.py [--duration 60] [--out FILE]

Setup: one ONNX model of ``--model-mib`` MiB (default 100; a Gather from a random FP32
[rows, 256] table, so the file does not compress and a request costs almost nothing to run) is
written once and hard-linked under ``--models`` names (default 20, ``m00`` … ``m19``). One daemon
serves them all with ``[server.memory] host_budget = "--budget-mib MiB"`` (default 500),
``idle_timeout = "5m"`` (so nothing unloads for being idle during the run) and
``intra_op_threads = 1``. Nothing is preloaded.

Traffic: ``--clients`` asyncio tasks (default 16, aiohttp over one pool of as many
connections) send one-row JSON requests back to back for ``--duration`` seconds, each to a model
drawn from a Zipf distribution (``p(rank k) ~ 1 / k**s``, ``--zipf-s`` 1.1): ``m00`` is the most
requested. Every answer is checked against the table row it asked for.

Measured:
- requests/s, failed requests (any status but 200, or a transport error) and wrong answers;
- p50/p99 of warm and of cold requests. A request is **cold** when the daemon logged
  ``model_loaded`` for its model after the request was sent and before its answer arrived:
  the request could only be answered once that load finished, so its model was not READY when
  it was sent. Otherwise it is warm. Log times have millisecond resolution, so a request sent
  within 1 ms after a load finished counts as cold;
- evictions/s, from ``/admin/status`` ``evictions.memory_pressure`` before and after the run,
  cross-checked with the ``model_unloaded … reason=memory_pressure`` log lines; loads, from the
  ``model_loaded`` lines and the models' ``loads`` counters;
- the daemon's RSS (psutil on its pid every 50 ms, from start to stop): its baseline after
  start-up before any model loads (the median of one second of samples), and the peak.

Aims (issue 5): zero failed requests; peak RSS never above budget + 10% + baseline. Prints a
markdown report; ``--out FILE`` also writes it there. It never appends to any file.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import psutil
from harness import (
    Daemon,
    command_line,
    http_output,
    machine_line,
    model_state,
    new_session,
    wait_ready,
)
from models import write_lookup_table

MIB = 1024 * 1024
TABLE_WIDTH = 256  # FP32 values per table row: one answer is 1 KiB
REQUEST_TIMEOUT_S = 120.0
RSS_INTERVAL_S = 0.05
BASELINE_S = 1.0
IN_PROCESS_LOADS = 3
# Issue 5's aim: peak RSS <= baseline + budget * (1 + 10%).
AIM_BUDGET_SLACK = 0.10
# Events read from the daemon's log.
EVENTS = frozenset(
    {
        "model_loading",
        "model_loaded",
        "model_unloaded",
        "model_load_deferred",
        "model_load_failed",
        "model_load_oom",
        "memory_evicting",
        "memory_oom",
        "request_failed",
    }
)
LOG_LINE = re.compile(
    r"^(?P<stamp>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(?P<ms>\d{3})Z (?P<level>\w+) (?P<event>\w+)"
    r"(?P<rest>.*)$"
)
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


# --- what the daemon says -----------------------------------------------------------------


@dataclass(frozen=True)
class LogEvent:
    at: float  # wall-clock seconds (the daemon's timestamp, truncated to the millisecond)
    level: str
    event: str
    fields: dict[str, str]


@dataclass
class EventLog:
    """The daemon's log events of interest, and a count of its warning and error lines.
    ``on_line`` runs on the Daemon's reader thread; the lists only grow."""

    events: list[LogEvent] = field(default_factory=list)
    levels: Counter[str] = field(default_factory=Counter)
    lines: list[str] = field(default_factory=list)  # every line, for --daemon-log

    def on_line(self, line: str) -> None:
        self.lines.append(line)
        match = LOG_LINE.match(line)
        if match is None:
            return
        self.levels[match["level"]] += 1
        if match["event"] not in EVENTS:
            return
        stamp = calendar.timegm(time.strptime(match["stamp"], "%Y-%m-%dT%H:%M:%S"))
        fields = {key: value.strip('"') for key, value in FIELD.findall(match["rest"])}
        at = stamp + int(match["ms"]) / 1000.0
        self.events.append(LogEvent(at, match["level"], match["event"], fields))

    def between(self, event: str, start: float, end: float) -> list[LogEvent]:
        return [e for e in list(self.events) if e.event == event and start <= e.at <= end]


class RssSampler(threading.Thread):
    """psutil RSS of one process every ``interval_s`` seconds until stopped."""

    def __init__(self, pid: int, interval_s: float = RSS_INTERVAL_S) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self._process = psutil.Process(pid)
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self.samples: list[tuple[float, int]] = []  # (wall seconds, bytes)

    def run(self) -> None:
        while True:
            try:
                self.samples.append((time.time(), int(self._process.memory_info().rss)))
            except psutil.Error:
                return  # the daemon is gone
            if self._stop_event.wait(self._interval_s):
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

    def since(self, start: float) -> list[int]:
        return [rss for at, rss in list(self.samples) if at >= start]

    def peak(self) -> tuple[float, int]:
        return max(self.samples, key=lambda sample: sample[1])


# --- setup --------------------------------------------------------------------------------


def model_names(count: int) -> list[str]:
    return [f"m{i:02d}" for i in range(count)]


def write_models(workdir: Path, names: Sequence[str], model_mib: int) -> np.ndarray:
    """One table model written once, then hard-linked (or copied) under every name."""
    rows = model_mib * MIB // (TABLE_WIDTH * 4)
    source = workdir / "table.onnx"
    table = write_lookup_table(source, rows, TABLE_WIDTH)
    for name in names:
        target = workdir / f"{name}.onnx"
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
    return table


def write_config(workdir: Path, names: Sequence[str], budget_mib: int) -> Path:
    entries = "".join(
        f'\n[[models]]\nname = "{name}"\npath = "{name}.onnx"\nintra_op_threads = 1\n'
        for name in names
    )
    config = workdir / "models.toml"
    config.write_text(
        f"""\
[server]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
idle_timeout = "5m"

[server.memory]
host_budget = "{budget_mib}MiB"
"""
        + entries,
        encoding="utf-8",
    )
    return config


def zipf_weights(count: int, s: float) -> np.ndarray:
    weights: np.ndarray = 1.0 / np.arange(1, count + 1, dtype=np.float64) ** s
    normalised: np.ndarray = weights / weights.sum()
    return normalised


# --- traffic ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    model: int
    sent: float  # wall-clock seconds, just before the request was sent
    done: float  # wall-clock seconds, once the whole answer was read
    latency_s: float
    status: int  # HTTP status; 0 for a transport error
    correct: bool
    error: str = ""


def _body(index: int) -> bytes:
    return (
        f'{{"inputs":[{{"name":"x","shape":[1],"datatype":"INT64","data":[{index}]}}]}}'
    ).encode()


async def traffic(
    base_url: str,
    names: Sequence[str],
    weights: np.ndarray,
    table: np.ndarray,
    clients: int,
    duration_s: float,
    seed: int,
) -> list[Outcome]:
    """``clients`` tasks sending Zipf-distributed requests back to back for ``duration_s``."""
    outcomes: list[Outcome] = []
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(base_url, connector=connector, timeout=timeout) as session:
        stop = time.perf_counter() + duration_s

        async def worker(number: int) -> None:
            rng = np.random.default_rng(seed + number)
            while time.perf_counter() < stop:
                model = int(rng.choice(len(names), p=weights))
                row = int(rng.integers(len(table)))
                status, correct, error = 0, False, ""
                sent, started = time.time(), time.perf_counter()
                try:
                    async with session.post(
                        f"/v2/models/{names[model]}/infer", data=_body(row), headers=headers
                    ) as response:
                        status = response.status
                        content = await response.read()
                    if status == 200:
                        got = http_output(content, None)
                        correct = got.shape == (1, table.shape[1]) and bool(
                            np.array_equal(got[0], table[row])
                        )
                    else:
                        error = content[:300].decode("utf-8", "replace")
                except (aiohttp.ClientError, TimeoutError) as exc:
                    error = repr(exc)
                latency_s = time.perf_counter() - started
                outcomes.append(
                    Outcome(model, sent, time.time(), latency_s, status, correct, error)
                )

        await asyncio.gather(*(worker(i) for i in range(clients)))
    return outcomes


def is_cold(outcome: Outcome, loads: dict[str, list[float]], names: Sequence[str]) -> bool:
    """Cold: its model's ``model_loaded`` was logged after the request was sent and before
    its answer (a log time t covers [t, t + 1 ms))."""
    return any(
        at + 0.001 > outcome.sent and at <= outcome.done
        for at in loads.get(names[outcome.model], ())
    )


# --- report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    names: list[str]
    weights: np.ndarray
    outcomes: list[Outcome]
    start: float
    end: float
    loads_log: list[LogEvent]
    pressure_unloads_log: list[LogEvent]
    evictions_status: int
    loads_status: dict[str, int]
    baseline_rss: int
    peak_rss: tuple[float, int]
    rss_samples: int
    status_after: dict[str, Any]
    max_ready: int
    log: EventLog
    in_process_load_ms: float


def _pcts(samples_s: Sequence[float]) -> str:
    if not samples_s:
        return "- / -"
    p50, p99 = np.percentile(np.asarray(samples_s) * 1e3, [50, 99])
    return f"{p50:,.1f} / {p99:,.1f}"


def _mib(count: int) -> str:
    return f"{count / MIB:,.1f} MiB"


def _yes(met: bool) -> str:
    return "yes" if met else "**no**"


def max_ready(events: Sequence[LogEvent]) -> int:
    """The most models READY at once, replaying the model_loaded / model_unloaded lines."""
    ready: set[str] = set()
    most = 0
    for event in sorted(events, key=lambda e: e.at):
        name = event.fields.get("model", "")
        if event.event == "model_loaded":
            ready.add(name)
        elif event.event == "model_unloaded":
            ready.discard(name)
        most = max(most, len(ready))
    return most


def report(machine: str, result: Result, args: argparse.Namespace) -> str:
    elapsed = result.end - result.start
    names = result.names
    loads_at: dict[str, list[float]] = {}
    for event in result.loads_log:
        loads_at.setdefault(event.fields.get("model", ""), []).append(event.at)
    total = len(result.outcomes)
    ok = [o for o in result.outcomes if o.status == 200 and o.correct]
    failed = [o for o in result.outcomes if o.status != 200]
    wrong = [o for o in result.outcomes if o.status == 200 and not o.correct]
    cold = [o.latency_s for o in ok if is_cold(o, loads_at, names)]
    warm = [o.latency_s for o in ok if not is_cold(o, loads_at, names)]
    load_ms = [float(e.fields["ms"]) for e in result.loads_log if "ms" in e.fields]
    budget = args.budget_mib * MIB
    limit = result.baseline_rss + int(budget * (1 + AIM_BUDGET_SLACK))
    peak_at, peak = result.peak_rss
    device = next(d for d in result.status_after["devices"] if d["name"] == "cpu")
    measured = [m["measured_bytes"] for m in result.status_after["models"] if m["measured_bytes"]]
    per_model = Counter(o.model for o in result.outcomes)
    failures = Counter(f"{o.status} {o.error[:120]}" for o in failed)
    deferred = [e for e in result.log.events if e.event == "model_load_deferred"]
    lines = [
        "## Memory benchmark: Zipf traffic over more models than the budget holds",
        "",
        f"- {machine}",
        f"- command: `{command_line()}`",
        f"- {len(names)} models of {args.model_mib} MiB (one Gather-table file, hard-linked), "
        f'`host_budget = "{args.budget_mib}MiB"`, `idle_timeout = "5m"`, nothing preloaded; '
        f"{args.clients} asyncio clients for {elapsed:.1f} s, model drawn per request with "
        f"Zipf s = {args.zipf_s:g} (the top model gets {result.weights[0]:.0%} of requests, "
        f"the last {result.weights[-1]:.1%})",
        "- cold = the daemon logged `model_loaded` for the request's model between sending "
        "and answer; warm = every other successful request",
        "",
        "| measure | value |",
        "| --- | ---: |",
        f"| requests (per s) | {total:,} ({total / elapsed:,.1f}/s) |",
        f"| failed requests | {len(failed)} |",
        f"| wrong answers | {len(wrong)} |",
        f"| warm requests: count / p50 ms / p99 ms | {len(warm):,} / {_pcts(warm)} |",
        f"| cold requests: count / p50 ms / p99 ms | {len(cold):,} / {_pcts(cold)} |",
        f"| loads during the run (log / status `loads`) | {len(result.loads_log)} / "
        f"{sum(result.loads_status.values())} |",
        f"| loads per s | {len(result.loads_log) / elapsed:.2f}/s |",
        "| load wait + load, p50 / max (`model_loaded` ms: from the load's start, admission "
        "queue and evictions included) | "
        + (f"{statistics.median(load_ms):,.0f} / {max(load_ms):,.0f} ms |" if load_ms else "- |"),
        f"| in-process `InferenceSession(path)` + one run, median of "
        f"{IN_PROCESS_LOADS} | {result.in_process_load_ms:,.0f} ms |",
        f"| evictions for memory (status / log), per s | {result.evictions_status} / "
        f"{len(result.pressure_unloads_log)}, {result.evictions_status / elapsed:.2f}/s |",
        f"| most models READY at once | {result.max_ready} |",
        "| measured model size (min / max over models) | "
        + (f"{_mib(min(measured))} / {_mib(max(measured))} |" if measured else "- |"),
        f"| daemon baseline RSS (before any load) | {_mib(result.baseline_rss)} |",
        f"| peak RSS ({result.rss_samples:,} samples, every {RSS_INTERVAL_S * 1e3:.0f} ms) "
        f"| {_mib(peak)} (baseline + {_mib(peak - result.baseline_rss)}) |",
        f"| daemon's accounting at the end: used / reserved / process | "
        f"{_mib(device['used_bytes'])} / {_mib(device['reserved_bytes'])} / "
        f"{_mib(device['process_bytes'])} |",
        f"| daemon log lines at WARNING / ERROR | {result.log.levels['WARNING']} / "
        f"{result.log.levels['ERROR']} |",
    ]
    lines += [
        "",
        "Requests and loads per model, most requested first: "
        + ", ".join(
            f"{name} {per_model[i]}/{result.loads_status.get(name, 0)}"
            for i, name in enumerate(names)
        )
        + " (requests/loads).",
        "",
        "### Against the aims of issue 5",
        "",
        "| aim | ours | met |",
        "| --- | ---: | --- |",
        f"| zero failed requests | {len(failed)} failed, {len(wrong)} wrong "
        f"| {_yes(not failed and not wrong)} |",
        f"| peak RSS <= budget + {AIM_BUDGET_SLACK:.0%} + baseline ({_mib(limit)}) "
        f"| {_mib(peak)} at +{peak_at - result.start:.1f} s | {_yes(peak <= limit)} |",
        "",
    ]
    if failures:
        lines += ["Failed requests by status and message:", ""]
        lines += [f"- {count} x `{text}`" for text, count in failures.most_common(10)]
        lines.append("")
    if deferred:
        lines.append(f"- {len(deferred)} `model_load_deferred` (load gave up for memory).")
        lines.append("")
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic (60)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    parser.add_argument("--models", type=int, default=20, help="number of models (20)")
    parser.add_argument("--model-mib", type=int, default=100, help="MiB per model (100)")
    parser.add_argument("--budget-mib", type=int, default=500, help="host budget in MiB (500)")
    parser.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent (1.1)")
    parser.add_argument("--seed", type=int, default=1, help="traffic seed (1)")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--daemon-log", type=Path, help="write the daemon's whole log to this file")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the daemon")
    return parser.parse_args(argv)


def _admin_status(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/admin/status")
    response.raise_for_status()
    return dict(response.json())


def in_process_load_ms(path: Path) -> float:
    """Median ms of ``InferenceSession(path)`` plus one run in this process (the daemon's
    options: one intra-op thread, sequential)."""
    samples = []
    feeds = {"x": np.zeros(1, dtype=np.int64)}
    for _ in range(IN_PROCESS_LOADS):
        started = time.perf_counter()
        session = new_session(path)
        session.run(None, feeds)
        samples.append((time.perf_counter() - started) * 1e3)
        del session
    return statistics.median(samples)


def check_model(client: httpx.Client, name: str, table: np.ndarray) -> None:
    """One request (it loads the model), checked against the table row it asks for."""
    row = len(table) // 2
    response = client.post(
        f"/v2/models/{name}/infer", content=_body(row), headers={"Content-Type": "application/json"}
    )
    if response.status_code != 200:
        raise RuntimeError(f"infer {name}: {response.status_code} {response.text[:500]}")
    got = http_output(response.content, None)
    if got.shape != (1, table.shape[1]) or not np.array_equal(got[0], table[row]):
        raise RuntimeError(f"infer {name}: the answer is not row {row} of the table")
    if model_state(client, name) != "READY":
        raise RuntimeError(f"{name} answered but is not READY")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_line()
    names = model_names(args.models)
    weights = zipf_weights(args.models, args.zipf_s)
    log = EventLog()
    with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
        workdir = Path(tmp)
        table = write_models(workdir, names, args.model_mib)
        config = write_config(workdir, names, args.budget_mib)
        daemon = Daemon(args.python, config, on_line=log.on_line)
        sampler = RssSampler(daemon.pid)
        sampler.start()
        try:
            print(f"daemon up: http={daemon.http_port} pid={daemon.pid}", file=sys.stderr)
            with httpx.Client(base_url=daemon.base_url, timeout=REQUEST_TIMEOUT_S) as client:
                wait_ready(client, "/health/ready")
                settle = time.time()
                time.sleep(BASELINE_S)
                if log.between("model_loading", 0.0, time.time()):
                    raise RuntimeError("a model loaded before the baseline was taken")
                baseline = int(statistics.median(sampler.since(settle)))
                check_model(client, names[0], table)
                before = _admin_status(client)

                start = time.time()
                outcomes = asyncio.run(
                    traffic(
                        daemon.base_url,
                        names,
                        weights,
                        table,
                        args.clients,
                        args.duration,
                        args.seed,
                    )
                )
                end = time.time()
                time.sleep(0.5)  # the last log lines reach the reader thread
                after = _admin_status(client)
        except BaseException:
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
            raise
        finally:
            daemon.stop_and_warn()
            sampler.stop()
        load_ms = in_process_load_ms(workdir / f"{names[0]}.onnx")

    loads_before = {m["name"]: int(m["loads"]) for m in before["models"]}
    result = Result(
        names=names,
        weights=weights,
        outcomes=outcomes,
        start=start,
        end=end,
        loads_log=log.between("model_loaded", start, end),
        pressure_unloads_log=[
            e
            for e in log.between("model_unloaded", start, end)
            if e.fields.get("reason") == "memory_pressure"
        ],
        evictions_status=int(after["evictions"].get("memory_pressure", 0))
        - int(before["evictions"].get("memory_pressure", 0)),
        loads_status={
            m["name"]: int(m["loads"]) - loads_before.get(m["name"], 0) for m in after["models"]
        },
        baseline_rss=baseline,
        peak_rss=sampler.peak(),
        rss_samples=len(sampler.samples),
        status_after=after,
        max_ready=max_ready(
            log.between("model_loaded", 0.0, end) + log.between("model_unloaded", 0.0, end)
        ),
        log=log,
        in_process_load_ms=load_ms,
    )
    if args.daemon_log is not None:
        args.daemon_log.write_text("\n".join(log.lines) + "\n", encoding="utf-8")
    markdown = report(machine, result, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
