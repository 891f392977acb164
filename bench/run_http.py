"""HTTP latency/throughput and cold-start benchmark for the SnoozeML daemon.

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_http.py [--duration 10] [--out results.md]

Steps:
  (a) serve the bench MLP (64 -> 256 -> 64) preloaded and pinned, then load it with wrk at
      ``-t1 -c1`` and ``-t2 -c64`` against ``POST /v2/models/mlp/infer`` with a one-row JSON body;
  (b) time in-process ``session.run`` on the same file (1 intra-op thread) for reference;
  (c) cold start: the first request to an unloaded copy of the model over HTTP, against
      ``InferenceSession(path)`` plus one ``run`` in-process, unloading between repetitions.
Prints a markdown report; ``--out FILE`` also writes it there. It never appends to any file.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from harness import (
    Daemon,
    Latency,
    check_infer,
    machine_line,
    model_state,
    new_session,
    random_rows,
    run_wrk,
    time_calls,
    wait_loaded,
    wait_ready,
    write_body,
    wrk_row,
)
from models import write_bench_mlp

HOT_MODEL = "mlp"
COLD_MODEL = "mlp-cold"
WIDTH = 64  # the bench MLP's input features
# Issue 2's aims for this benchmark.
AIM_P50_C1_MS = 0.3
AIM_RPS_C64 = 6000
AIM_COLD_MS = 2.0


@dataclass(frozen=True)
class ColdStart:
    label: str
    samples_ms: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)


def write_config(workdir: Path, batching: bool) -> Path:
    write_bench_mlp(workdir / "mlp.onnx")
    shutil.copyfile(workdir / "mlp.onnx", workdir / "mlp_cold.onnx")
    no_batching = "\n[models.batching]\nmax_batch_size = 1\n" if not batching else ""
    config = workdir / "models.toml"
    config.write_text(
        f"""\
[server]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
idle_timeout = "never"

[[models]]
name = "{HOT_MODEL}"
path = "mlp.onnx"
preload = true
intra_op_threads = 1
{no_batching}
[[models]]
name = "{COLD_MODEL}"
path = "mlp_cold.onnx"
intra_op_threads = 1
{no_batching}""",
        encoding="utf-8",
    )
    return config


def cold_http(
    client: httpx.Client, base: str, name: str, body: dict[str, Any], reps: int
) -> list[float]:
    """First-request latency on an unloaded model. The timed request goes over a plain
    keep-alive http.client connection with the body encoded once, so the client's own cost
    (httpx and JSON encoding add about half a millisecond) is not charged to the daemon."""
    url = urllib.parse.urlsplit(base)
    payload = orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port)
    samples: list[float] = []
    try:
        for rep in range(reps):
            unload = client.post(f"/v2/repository/models/{name}/unload")
            if unload.status_code != 200:
                print(
                    f"warning: unload {name} (rep {rep}) -> {unload.status_code} "
                    f"{unload.text[:200]}",
                    file=sys.stderr,
                )
            if model_state(client, name) == "READY":
                raise RuntimeError(
                    f"{name} still READY after unload; cold start cannot be measured"
                )
            connection.request("GET", "/health/live")  # warm the connection: only the model
            connection.getresponse().read()  # is cold
            start = time.perf_counter()
            connection.request("POST", f"/v2/models/{name}/infer", payload, headers)
            response = connection.getresponse()
            text = response.read()
            samples.append((time.perf_counter() - start) * 1e3)
            if response.status != 200:
                raise RuntimeError(f"cold infer {name}: {response.status} {text[:500]!r}")
    finally:
        connection.close()
    return samples


def cold_in_process(path: Path, model_input: np.ndarray, reps: int) -> list[float]:
    samples: list[float] = []
    for _ in range(reps):
        start = time.perf_counter()
        session = new_session(path)
        session.run(None, {"x": model_input})
        samples.append((time.perf_counter() - start) * 1e3)
        del session
    return samples


def report(
    machine: str, rows: list[Latency], cold: list[ColdStart], args: argparse.Namespace
) -> str:
    lines = [
        "## HTTP benchmark: MLP 64-256-64 FP32, one row per request",
        "",
        f"- {machine}",
        f"- {args.duration:g} s per load level; model `intra_op_threads = 1`; "
        f"batching {'server default' if args.batching else 'off (max_batch_size = 1)'}",
        "",
        "| measurement | p50 ms | p99 ms | requests/s | errors |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r.label} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.per_s:,.0f} | {r.errors} |"
        for r in rows
    ]
    http_c1 = rows[0]
    in_proc = rows[-1]
    lines += [
        "",
        f"Per-request cost of the daemon at c1 (HTTP p50 - in-process p50): "
        f"{http_c1.p50_ms - in_proc.p50_ms:.3f} ms.",
        "",
        f"### Cold start ({len(cold[0].samples_ms)} repetitions, unloaded between them)",
        "",
        "| measurement | median ms | min ms | max ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {c.label} | {c.median_ms:.2f} | {min(c.samples_ms):.2f} | {max(c.samples_ms):.2f} |"
        for c in cold
    ]
    overhead = cold[0].median_ms - cold[1].median_ms
    http_c64 = rows[1]
    lines += [
        "",
        f"Coordination overhead of a cold start (difference of medians): {overhead:.2f} ms.",
        "",
        "### Against the aims of issue 2",
        "",
        "| aim | ours | met |",
        "| --- | ---: | --- |",
        f"| p50 at c1 <= {AIM_P50_C1_MS} ms | {http_c1.p50_ms:.3f} ms "
        f"| {_yes(http_c1.p50_ms <= AIM_P50_C1_MS)} |",
        f"| >= {AIM_RPS_C64:,} req/s at c64 | {http_c64.per_s:,.0f} "
        f"| {_yes(http_c64.per_s >= AIM_RPS_C64)} |",
        f"| cold-start coordination <= {AIM_COLD_MS} ms | {overhead:.2f} ms "
        f"| {_yes(overhead <= AIM_COLD_MS)} |",
        "",
    ]
    return "\n".join(lines)


def _yes(met: bool) -> str:
    return "yes" if met else "**no**"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load level (10)")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--cold-reps", type=int, default=10, help="cold-start repetitions (10)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the daemon")
    parser.add_argument(
        "--no-batching",
        dest="batching",
        action="store_false",
        help="write [models.batching] max_batch_size = 1 (needs a daemon that knows that key)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk not found; run: bash bench/setup.sh", file=sys.stderr)
        return 2
    machine = machine_line()
    model_input = random_rows(1, WIDTH)
    with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
        workdir = Path(tmp)
        config = write_config(workdir, args.batching)
        body_file = workdir / "body.json"
        body = write_body(body_file, model_input)
        reference = new_session(workdir / "mlp.onnx")
        expected = reference.run(None, {"x": model_input})[0]

        daemon = Daemon(args.python, config)
        try:
            base = daemon.base_url
            print(f"daemon up: http={daemon.http_port} grpc={daemon.grpc_port}", file=sys.stderr)
            with httpx.Client(base_url=base, timeout=60.0) as client:
                wait_ready(client, "/health/ready")
                wait_loaded(client, HOT_MODEL)  # preloaded: no load inside the timings
                check_infer(client, HOT_MODEL, model_input, expected)
                for _ in range(200):
                    client.post(f"/v2/models/{HOT_MODEL}/infer", json=body)

                url = f"{base}/v2/models/{HOT_MODEL}/infer"
                rows: list[Latency] = []
                for threads, connections in ((1, 1), (2, 64)):
                    warm_up_s = min(2.0, args.duration)
                    run_wrk(url, body_file, threads, connections, warm_up_s)
                    result = run_wrk(url, body_file, threads, connections, args.duration)
                    label = f"HTTP infer, wrk -t{threads} -c{connections}"
                    rows.append(wrk_row(label, result))
                    print(f"{label}: {json.dumps(result)}", file=sys.stderr)
                check_infer(client, HOT_MODEL, model_input, expected)  # still right after load

                feeds = {"x": model_input}
                time_calls(lambda: reference.run(None, feeds), min(1.0, args.duration))  # warm-up
                in_proc = time_calls(lambda: reference.run(None, feeds), args.duration)
                rows.append(
                    Latency(
                        "in-process session.run, 1 thread",
                        in_proc.p50_ms,
                        in_proc.p99_ms,
                        in_proc.per_s,
                    )
                )

                check_infer(client, COLD_MODEL, model_input, expected)  # first load, untimed
                cold = [
                    ColdStart(
                        "HTTP: first request to an unloaded model (load + infer)",
                        cold_http(client, base, COLD_MODEL, body, args.cold_reps),
                    ),
                    ColdStart(
                        "in-process: InferenceSession(path) + one run",
                        cold_in_process(workdir / "mlp_cold.onnx", model_input, args.cold_reps),
                    ),
                ]
        except BaseException:
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
            raise
        finally:
            daemon.stop_and_warn()

    markdown = report(machine, rows, cold, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
