"""Regenerate docs/monitor.svg: `snooze monitor` during a load-and-evict churn run.

Usage (from the repository root)::

    .venv/bin/python bench/monitor_screenshot.py [--churn-s 12] [--out docs/monitor.svg]

Setup, like ``run_memory.py`` but smaller: ``--models`` lookup-table models (default 10) of
``--model-mib`` MiB (default 16) under ``host_budget = "--budget-mib MiB"`` (default 160), so
not all fit at once and loads evict the least recently used; plus ``classifier`` (a small
MLP that is never unloaded for idleness: ``idle_timeout = "never"``), ``embedder`` (a small MLP
with a 20 s idle timeout) and ``broken`` (a file that is not ONNX, so its load fails).

Churn: ``--clients`` threads (default 6) send one-row requests back to back to models drawn
from a Zipf distribution (s = 1.1), one more sends to ``classifier`` and ``embedder``, and
one more loads and unloads a random model through the repository API every second. The
monitor (the Textual app, in a headless test terminal of ``--size`` cells) polls every 0.5 s;
after ``--churn-s`` seconds, once the events pane holds an eviction, the screen is saved as SVG.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
from harness import Daemon
from models import write_lookup_table, write_mlp

from snoozeml.monitor.app import MonitorApp

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 256


def write_models(folder: Path, count: int, model_mib: int, budget_mib: int) -> Path:
    rows = model_mib * 2**20 // (WIDTH * 4)
    write_lookup_table(folder / "table.onnx", rows, WIDTH)
    write_mlp(folder / "mlp.onnx", (4, 64, 3))
    (folder / "broken.onnx").write_bytes(b"this is not an ONNX model")
    tables = "".join(f'\n[[models]]\nname = "lookup-{i:02d}"\npath = "table.onnx"\n'
                     for i in range(count))
    config = folder / "models.toml"
    config.write_text(f"""\
[server]
idle_timeout = "5m"

[server.memory]
host_budget = "{budget_mib}MiB"

[[models]]
name = "classifier"
path = "mlp.onnx"
idle_timeout = "never"

[[models]]
name = "embedder"
path = "mlp.onnx"
idle_timeout = "20s"

[[models]]
name = "broken"
path = "broken.onnx"
{tables}""", encoding="utf-8")
    return config


def churn(url: str, names: list[str], clients: int,
          stop: threading.Event) -> list[threading.Thread]:
    """Start the traffic threads; they run until `stop` is set."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "monitor.svg")
    parser.add_argument("--churn-s", type=float, default=12.0)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--model-mib", type=int, default=16)
    parser.add_argument("--budget-mib", type=int, default=160)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--size", type=int, nargs=2, default=(150, 42), metavar=("COLS", "ROWS"))
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="snooze-monitor-") as scratch:
        config = write_models(Path(scratch), args.models, args.model_mib, args.budget_mib)
        daemon = Daemon(sys.executable, config)
        stop = threading.Event()
        try:
            names = [f"lookup-{i:02d}" for i in range(args.models)]
            threads = churn(daemon.base_url, names, args.clients, stop)
            asyncio.run(screenshot(daemon.base_url, args.out, args.churn_s, tuple(args.size)))
        finally:
            stop.set()
            daemon.stop_and_warn()
        for thread in threads:
            thread.join(10)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
