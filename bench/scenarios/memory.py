"""Many models, a small budget (issue 5).

One ONNX model of ``--model-mib`` MiB (a Gather from a random FP32 [rows, 256] table: the file
doesn't compress, and a request costs almost nothing to run) is written once and hard-linked
under ``--models`` names (``m00`` …). One daemon serves them all with ``host_budget =
--budget-mib``, ``idle_timeout = "5m"`` and ``intra_op_threads = 1``; nothing is preloaded.
``--concurrency`` asyncio clients (one aiohttp pool) send one-row JSON requests back to back for
``--duration`` seconds, each to a model drawn from a Zipf distribution (``--zipf-s``), and
every answer is checked against the table row it asked for.

Measured: requests/s, failed requests and wrong answers; p50/p99 of warm and cold requests (a
request is cold when the daemon logged ``model_loaded`` for its model between its sending and
its answer); evictions/s (``/admin/status``, cross-checked with the log) and loads; the
daemon's RSS every 50 ms: its baseline after start-up, and the peak. Issue 5's aims: no failed
request, and peak RSS never above budget + 10% + baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil
from harness import logs
from harness.cli import Bench
from harness.config import write_config
from harness.oip import JSON_HEADERS, http_output, new_session
from harness.report import Outcome, mib, table, yes
from harness.status import admin_status, model_state
from models import write_lookup_table

MIB = 1024 * 1024
TABLE_WIDTH = 256  # FP32 values per table row: one answer is 1 KiB
REQUEST_TIMEOUT_S = 120.0
RSS_INTERVAL_S = 0.05
BASELINE_S = 1.0
IN_PROCESS_LOADS = 3
AIM_BUDGET_SLACK = 0.10  # issue 5: peak RSS <= baseline + budget * (1 + 10%)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", type=int, default=20, help="number of models (20)")
    parser.add_argument("--model-mib", type=int, default=100, help="MiB per model (100)")
    parser.add_argument("--budget-mib", type=int, default=500, help="host budget in MiB (500)")
    parser.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent (1.1)")
    parser.add_argument("--daemon-log", type=Path,
                        help="write the daemon's whole log to this file")


@dataclass
class EventLog:
    """The daemon's log events, and a count of its lines by level. ``on_line`` runs on the
    daemon's reader thread; the lists only grow."""

    events: list[logs.LogLine] = field(default_factory=list)
    levels: Counter[str] = field(default_factory=Counter)
    lines: list[str] = field(default_factory=list)  # every line, for --daemon-log

    def on_line(self, line: str) -> None:
        self.lines.append(line)
        if (parsed := logs.parse(line)) is not None:
            self.levels[parsed.level] += 1
            self.events.append(parsed)

    def between(self, event: str, start: float, end: float) -> list[logs.LogLine]:
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


@dataclass(frozen=True)
class Answer:
    model: int
    sent: float  # wall-clock seconds, just before the request was sent
    done: float  # wall-clock seconds, once the whole answer was read
    latency_s: float
    status: int  # HTTP status; 0 for a transport error
    correct: bool
    error: str = ""


def _body(index: int) -> bytes:
    return f'{{"inputs":[{{"name":"x","shape":[1],"datatype":"INT64","data":[{index}]}}]}}'.encode()


async def traffic(base_url: str, names: Sequence[str], weights: np.ndarray, lookup: np.ndarray,
                  clients: int, duration_s: float, seed: int) -> list[Answer]:
    """``clients`` tasks sending Zipf-distributed requests back to back for ``duration_s``."""
    outcomes: list[Answer] = []
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(base_url, connector=connector, timeout=timeout) as session:
        stop = time.perf_counter() + duration_s

        async def worker(number: int) -> None:
            rng = np.random.default_rng(seed + number)
            while time.perf_counter() < stop:
                model = int(rng.choice(len(names), p=weights))
                row = int(rng.integers(len(lookup)))
                status, correct, error = 0, False, ""
                sent, started = time.time(), time.perf_counter()
                try:
                    async with session.post(f"/v2/models/{names[model]}/infer", data=_body(row),
                                            headers=JSON_HEADERS) as response:
                        status = response.status
                        content = await response.read()
                    if status == 200:
                        got = http_output(content, None)
                        correct = got.shape == (1, lookup.shape[1]) and bool(
                            np.array_equal(got[0], lookup[row]))
                    else:
                        error = content[:300].decode("utf-8", "replace")
                except (aiohttp.ClientError, TimeoutError) as exc:
                    error = repr(exc)
                outcomes.append(Answer(model, sent, time.time(),
                                         time.perf_counter() - started, status, correct, error))

        await asyncio.gather(*(worker(i) for i in range(clients)))
    return outcomes


def is_cold(answer: Answer, loads: dict[str, list[float]], names: Sequence[str]) -> bool:
    """Cold: its model's ``model_loaded`` was logged after the request was sent and before
    its answer (a log time t covers [t, t + 1 ms))."""
    return any(at + 0.001 > answer.sent and at <= answer.done
               for at in loads.get(names[answer.model], ()))


def max_ready(events: Sequence[logs.LogLine]) -> int:
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


def write_models(bench: Bench, names: Sequence[str]) -> np.ndarray:
    """One table model written once, then hard-linked (or copied) under every name; the
    config serving them all. Returns the table (row ``i`` answers index ``i``)."""
    args, workdir = bench.args, bench.workdir
    source = workdir / "table.onnx"
    lookup = write_lookup_table(source, args.model_mib * MIB // (TABLE_WIDTH * 4), TABLE_WIDTH)
    for name in names:
        try:
            os.link(source, workdir / f"{name}.onnx")
        except OSError:
            shutil.copyfile(source, workdir / f"{name}.onnx")
    write_config(workdir / "models.toml",
                 [{"name": n, "path": f"{n}.onnx", "intra_op_threads": 1} for n in names],
                 server={"idle_timeout": "5m", "memory": {"host_budget": f"{args.budget_mib}MiB"}})
    return lookup


def in_process_load_ms(path: Path) -> float:
    """Median ms of ``InferenceSession(path)`` plus one run in this process (the daemon's
    options: one intra-op thread, sequential)."""
    samples = []
    for _ in range(IN_PROCESS_LOADS):
        started = time.perf_counter()
        new_session(path).run(None, {"x": np.zeros(1, dtype=np.int64)})
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def check_model(client: Any, name: str, lookup: np.ndarray) -> None:
    """One request (it loads the model), checked against the table row it asks for."""
    row = len(lookup) // 2
    response = client.post(f"/v2/models/{name}/infer", content=_body(row), headers=JSON_HEADERS)
    if response.status_code != 200:
        raise RuntimeError(f"infer {name}: {response.status_code} {response.text[:500]}")
    got = http_output(response.content, None)
    if got.shape != (1, lookup.shape[1]) or not np.array_equal(got[0], lookup[row]):
        raise RuntimeError(f"infer {name}: the answer is not row {row} of the table")
    if model_state(client, name) != "READY":
        raise RuntimeError(f"{name} answered but is not READY")


def run(bench: Bench) -> Outcome:
    args = bench.args
    names = [f"m{i:02d}" for i in range(args.models)]
    weights = 1.0 / np.arange(1, args.models + 1, dtype=np.float64) ** args.zipf_s
    weights /= weights.sum()
    lookup = write_models(bench, names)
    log = EventLog()
    with bench.serve(bench.workdir / "models.toml", on_line=log.on_line,
                     timeout_s=REQUEST_TIMEOUT_S) as daemon:
        sampler = RssSampler(daemon.pid)
        sampler.start()
        try:
            settle = time.time()
            time.sleep(BASELINE_S)  # a second of samples for the baseline
            if log.between("model_loading", 0.0, time.time()):
                raise RuntimeError("a model loaded before the baseline was taken")
            baseline = int(statistics.median(rss for at, rss in sampler.samples if at >= settle))
            check_model(daemon.client, names[0], lookup)
            before = admin_status(daemon.client)
            start = time.time()
            answers = asyncio.run(traffic(daemon.base_url, names, weights, lookup,
                                          args.concurrency[0], args.duration, args.seed))
            end = time.time()
            time.sleep(0.5)  # the last log lines reach the reader thread
            after = admin_status(daemon.client)
        finally:
            sampler.stop()
    if args.daemon_log is not None:
        args.daemon_log.write_text("\n".join(log.lines) + "\n", encoding="utf-8")
    figures = Figures(names, weights, answers, start, end, log, before, after, baseline,
                      max(sampler.samples, key=lambda s: s[1]), len(sampler.samples),
                      in_process_load_ms(bench.workdir / f"{names[0]}.onnx"))
    return Outcome(report(bench, figures), {"answers": len(answers), "baseline_rss": baseline})


@dataclass(frozen=True)
class Figures:
    """What one run saw: the answers, the daemon's log and status before and after, RSS."""

    names: list[str]
    weights: np.ndarray
    answers: list[Answer]
    start: float
    end: float
    log: EventLog
    before: dict[str, Any]  # /admin/status before the traffic
    after: dict[str, Any]  # and after it
    baseline_rss: int
    peak_rss: tuple[float, int]  # (wall seconds, bytes)
    rss_samples: int
    in_process_load_ms: float

    @property
    def loads(self) -> list[logs.LogLine]:
        return self.log.between("model_loaded", self.start, self.end)

    def evictions(self) -> tuple[int, int]:
        """Evictions for memory during the run: by /admin/status, and by the log."""
        status = (int(self.after["evictions"].get("memory_pressure", 0))
                  - int(self.before["evictions"].get("memory_pressure", 0)))
        logged = [e for e in self.log.between("model_unloaded", self.start, self.end)
                  if e.fields.get("reason") == "memory_pressure"]
        return status, len(logged)

    def status_loads(self) -> dict[str, int]:
        before = {m["name"]: int(m["loads"]) for m in self.before["models"]}
        return {m["name"]: int(m["loads"]) - before.get(m["name"], 0)
                for m in self.after["models"]}


def _pcts(samples_s: Sequence[float]) -> str:
    if not samples_s:
        return "- / -"
    p50, p99 = np.percentile(np.asarray(samples_s) * 1e3, [50, 99])
    return f"{p50:,.1f} / {p99:,.1f}"


def measures(f: Figures, elapsed: float) -> list[tuple[str, str]]:
    """The report's table: one (measure, value) a row."""
    loads_at: dict[str, list[float]] = {}
    for event in f.loads:
        loads_at.setdefault(event.fields.get("model", ""), []).append(event.at)
    ok = [a for a in f.answers if a.status == 200 and a.correct]
    cold = [a.latency_s for a in ok if is_cold(a, loads_at, f.names)]
    warm = [a.latency_s for a in ok if not is_cold(a, loads_at, f.names)]
    load_ms = [float(e.fields["ms"]) for e in f.loads if "ms" in e.fields]
    evicted, evicted_log = f.evictions()
    device = next(d for d in f.after["devices"] if d["name"] == "cpu")
    measured = [m["measured_bytes"] for m in f.after["models"] if m["measured_bytes"]]
    peak = f.peak_rss[1]
    total = len(f.answers)
    ready = max_ready(f.log.between("model_loaded", 0.0, f.end)
                      + f.log.between("model_unloaded", 0.0, f.end))
    return [
        ("requests (per s)", f"{total:,} ({total / elapsed:,.1f}/s)"),
        ("failed requests", str(sum(a.status != 200 for a in f.answers))),
        ("wrong answers", str(sum(a.status == 200 and not a.correct for a in f.answers))),
        ("warm requests: count / p50 ms / p99 ms", f"{len(warm):,} / {_pcts(warm)}"),
        ("cold requests: count / p50 ms / p99 ms", f"{len(cold):,} / {_pcts(cold)}"),
        ("loads during the run (log / status `loads`)",
         f"{len(f.loads)} / {sum(f.status_loads().values())}"),
        ("loads per s", f"{len(f.loads) / elapsed:.2f}/s"),
        ("load wait + load, p50 / max (`model_loaded` ms: from the load's start, admission "
         "queue and evictions included)",
         f"{statistics.median(load_ms):,.0f} / {max(load_ms):,.0f} ms" if load_ms else "-"),
        (f"in-process `InferenceSession(path)` + one run, median of {IN_PROCESS_LOADS}",
         f"{f.in_process_load_ms:,.0f} ms"),
        ("evictions for memory (status / log), per s",
         f"{evicted} / {evicted_log}, {evicted / elapsed:.2f}/s"),
        ("most models READY at once", str(ready)),
        ("measured model size (min / max over models)",
         f"{mib(min(measured))} MiB / {mib(max(measured))} MiB" if measured else "-"),
        ("daemon baseline RSS (before any load)", f"{mib(f.baseline_rss)} MiB"),
        (f"peak RSS ({f.rss_samples:,} samples, every {RSS_INTERVAL_S * 1e3:.0f} ms)",
         f"{mib(peak)} MiB (baseline + {mib(peak - f.baseline_rss)} MiB)"),
        ("daemon's accounting at the end: used / reserved / process",
         f"{mib(device['used_bytes'])} MiB / {mib(device['reserved_bytes'])} MiB / "
         f"{mib(device['process_bytes'])} MiB"),
        ("daemon log lines at WARNING / ERROR",
         f"{f.log.levels['WARNING']} / {f.log.levels['ERROR']}"),
    ]


def report(bench: Bench, f: Figures) -> str:
    args = bench.args
    elapsed = f.end - f.start
    failed = [a for a in f.answers if a.status != 200]
    wrong = [a for a in f.answers if a.status == 200 and not a.correct]
    limit = f.baseline_rss + int(args.budget_mib * MIB * (1 + AIM_BUDGET_SLACK))
    peak_at, peak = f.peak_rss
    per_model = Counter(a.model for a in f.answers)
    loads = f.status_loads()
    lines = bench.header(
        "## Memory benchmark: Zipf traffic over more models than the budget holds",
        f"{len(f.names)} models of {args.model_mib} MiB (one Gather-table file, hard-linked), "
        f'`host_budget = "{args.budget_mib}MiB"`, `idle_timeout = "5m"`, nothing preloaded; '
        f"{args.concurrency[0]} asyncio clients for {elapsed:.1f} s, model drawn per request "
        f"with Zipf s = {args.zipf_s:g} (the top model gets {f.weights[0]:.0%} of requests, the "
        f"last {f.weights[-1]:.1%})",
        "cold = the daemon logged `model_loaded` for the request's model between sending and "
        "answer; warm = every other successful request")
    lines += table(["measure", "value"], measures(f, elapsed))
    lines += ["", "Requests and loads per model, most requested first: "
              + ", ".join(f"{name} {per_model[i]}/{loads.get(name, 0)}"
                          for i, name in enumerate(f.names)) + " (requests/loads).",
              "", "### Against the aims of issue 5", ""]
    lines += table(["aim", "ours", "met"], [
        ("zero failed requests", f"{len(failed)} failed, {len(wrong)} wrong",
         yes(not failed and not wrong)),
        (f"peak RSS <= budget + {AIM_BUDGET_SLACK:.0%} + baseline ({mib(limit)} MiB)",
         f"{mib(peak)} MiB at +{peak_at - f.start:.1f} s", yes(peak <= limit)),
    ], "lrl")
    failures = Counter(f"{a.status} {a.error[:120]}" for a in failed)
    if failures:
        lines += ["", "Failed requests by status and message:", ""]
        lines += [f"- {count} x `{text}`" for text, count in failures.most_common(10)]
    deferred = [e for e in f.log.events if e.event == "model_load_deferred"]
    if deferred:
        lines += ["", f"- {len(deferred)} `model_load_deferred` (load gave up for memory)."]
    return "\n".join(lines) + "\n"
