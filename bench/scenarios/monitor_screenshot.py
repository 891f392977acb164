"""Regenerate docs/monitor.svg: ``snooze monitor`` during a load-and-evict churn run.

Like the memory scenario but smaller: ``--models`` lookup-table models (10) of ``--model-mib``
MiB (16) under ``host_budget = --budget-mib`` (160), so not all fit at once and loads evict the
least recently used; plus ``classifier`` (a small MLP never unloaded for idleness),
``embedder`` (a small MLP with a 20 s idle timeout) and ``broken`` (not ONNX: its load fails).
``--clients`` threads (6) send one-row requests to models drawn from a Zipf distribution
(s = 1.1), one more to ``classifier`` and ``embedder``, one more loads and unloads a random
model every second. The monitor (the Textual app, in a headless terminal of ``--size`` cells)
polls every 0.5 s; after ``--duration`` seconds, once the events pane holds an eviction, the
screen is saved as SVG to ``--svg``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
from harness.cli import Bench
from harness.config import write_config
from harness.report import Outcome
from models import write_lookup_table, write_mlp

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 256


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--svg", type=Path, default=ROOT / "docs" / "monitor.svg",
                        help="where the screenshot goes (docs/monitor.svg)")
    parser.add_argument("--models", type=int, default=10, help="lookup-table models (10)")
    parser.add_argument("--model-mib", type=int, default=16, help="MiB per model (16)")
    parser.add_argument("--budget-mib", type=int, default=160, help="host budget in MiB (160)")
    parser.add_argument("--clients", type=int, default=6, help="Zipf traffic threads (6)")
    parser.add_argument("--size", type=int, nargs=2, default=(150, 42), metavar=("COLS", "ROWS"),
                        help="the terminal's size in cells (150 42)")


def write_models(folder: Path, args: argparse.Namespace) -> Path:
    write_lookup_table(folder / "table.onnx", args.model_mib * 2**20 // (WIDTH * 4), WIDTH)
    write_mlp(folder / "mlp.onnx", (4, 64, 3))
    (folder / "broken.onnx").write_bytes(b"this is not an ONNX model")
    return write_config(folder / "models.toml", [
        {"name": "classifier", "path": "mlp.onnx", "idle_timeout": "never"},
        {"name": "embedder", "path": "mlp.onnx", "idle_timeout": "20s"},
        {"name": "broken", "path": "broken.onnx"},
        *({"name": f"lookup-{i:02d}", "path": "table.onnx"} for i in range(args.models))],
        server={"idle_timeout": "5m", "memory": {"host_budget": f"{args.budget_mib}MiB"}})


def churn(url: str, names: list[str], clients: int,
          stop: threading.Event) -> list[threading.Thread]:
    """Start the traffic threads; they run until ``stop`` is set."""
    weights = 1.0 / np.arange(1, len(names) + 1) ** 1.1
    weights /= weights.sum()

    def lookups(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                name = names[int(rng.choice(len(names), p=weights))]
                body = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64",
                                    "data": [int(rng.integers(0, 1000))]}]}
                client.post(f"/v2/models/{name}/infer", json=body)

    def small_models() -> None:
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                            "data": [5.1, 3.5, 1.4, 0.2]}]}
        with httpx.Client(base_url=url, timeout=60) as client:
            client.post("/v2/repository/models/broken/load")  # fails: FAILED, in red
            while not stop.is_set():
                client.post("/v2/models/classifier/infer", json=body)
                if random.random() < 0.05:
                    client.post("/v2/models/embedder/infer", json=body)

    def repository() -> None:
        pick = random.Random(7)
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.wait(1.0):
                name = pick.choice(names)
                client.post(f"/v2/repository/models/{name}/{pick.choice(['load', 'unload'])}")

    targets: list[Callable[[], None]] = [lambda seed=seed: lookups(seed)
                                         for seed in range(clients)]
    threads = [threading.Thread(target=t, daemon=True)
               for t in (*targets, small_models, repository)]
    for thread in threads:
        thread.start()
    return threads


async def screenshot(url: str, out: Path, churn_s: float, size: tuple[int, int]) -> None:
    from snoozeml.monitor.app import MonitorApp

    app = MonitorApp(url, interval=0.5)
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + churn_s
        while True:
            await pilot.pause(0.25)
            events = app.status.events if app.status else None
            evicted = bool(events) and any(e.kind == "memory_evicting" for e in events or ())
            if time.monotonic() > deadline and evicted:
                break
            if time.monotonic() > deadline + 60:
                print("warning: no eviction in the events pane; saving anyway", file=sys.stderr)
                break
        out.parent.mkdir(parents=True, exist_ok=True)
        app.save_screenshot(filename=out.name, path=str(out.parent))


def run(bench: Bench) -> Outcome:
    args = bench.args
    stop = threading.Event()
    threads: list[threading.Thread] = []
    with bench.serve(write_models(bench.workdir, args)) as daemon:
        try:
            names = [f"lookup-{i:02d}" for i in range(args.models)]
            threads = churn(daemon.base_url, names, args.clients, stop)
            asyncio.run(screenshot(daemon.base_url, args.svg, args.duration, tuple(args.size)))
        finally:
            stop.set()
    for thread in threads:
        thread.join(10)
    return Outcome(f"wrote {args.svg}\n")
