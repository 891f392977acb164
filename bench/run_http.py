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
import collections
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np
import onnxruntime as ort
from models import write_bench_mlp

BENCH_DIR = Path(__file__).resolve().parent
POST_LUA = BENCH_DIR / "post.lua"
HOT_MODEL = "mlp"
COLD_MODEL = "mlp-cold"
STARTED = re.compile(r"\bserver_started\b.*?\bhttp_port=(\d+)(?:.*?\bgrpc_port=(\d+))?")


@dataclass(frozen=True)
class Latency:
    """One row of the latency table; times in milliseconds."""

    label: str
    p50_ms: float
    p99_ms: float
    per_s: float
    errors: int = 0


@dataclass(frozen=True)
class ColdStart:
    label: str
    samples_ms: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)


class Daemon:
    """``python -m snoozeml serve`` as a child process; ports parsed from its log."""

    def __init__(self, python: str, config: Path, start_timeout_s: float = 60.0) -> None:
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._started = threading.Event()
        self.http_port = 0
        self.grpc_port = 0
        cmd = [python, "-m", "snoozeml", "serve", "-c", str(config)]
        cmd += ["--http-port", "0", "--grpc-port", "0"]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # the started line is on stderr; read both in one pipe
            text=True,
            bufsize=1,
        )
        assert self.proc.stdout is not None
        # The reader also keeps draining the pipe, so a chatty daemon never blocks on it.
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._started.wait(0.1):
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"no server_started line in {start_timeout_s}s:\n{self.tail()}")

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.log.append(line.rstrip("\n"))
            if not self._started.is_set() and (match := STARTED.search(line)):
                self.http_port = int(match.group(1))
                self.grpc_port = int(match.group(2) or 0)
                self._started.set()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(list(self.log)[-lines:])

    def stop(self, timeout_s: float = 20.0) -> int:
        """Graceful stop (SIGTERM, then SIGKILL after ``timeout_s``); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                print("daemon ignored SIGTERM; killing it", file=sys.stderr)
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode


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


def one_row() -> np.ndarray:
    return np.random.default_rng(7).uniform(-1, 1, size=(1, 64)).round(4).astype(np.float32)


def infer_body(model_input: np.ndarray) -> dict[str, Any]:
    data = [float(v) for v in model_input.reshape(-1)]
    return {
        "inputs": [
            {"name": "x", "shape": list(model_input.shape), "datatype": "FP32", "data": data}
        ]
    }


def session_options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return opts


def new_session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])


def wait_ready(client: httpx.Client, path: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            response = client.get(path)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.05)
    raise RuntimeError(f"GET {path} not 200 after {timeout_s}s (last: {last})")


def model_is_ready(client: httpx.Client, name: str) -> bool:
    response = client.get(f"/v2/models/{name}/ready")
    if response.status_code != 200:
        return False
    try:
        return bool(response.json().get("ready", True))
    except ValueError:
        return True


def check_infer(
    client: httpx.Client, name: str, model_input: np.ndarray, expected: np.ndarray
) -> None:
    """One request, checked against in-process onnxruntime, so wrk never times wrong answers."""
    response = client.post(f"/v2/models/{name}/infer", json=infer_body(model_input))
    if response.status_code != 200:
        raise RuntimeError(f"infer {name}: {response.status_code} {response.text[:500]}")
    outputs = {out["name"]: out for out in response.json()["outputs"]}
    got = np.asarray(outputs["y"]["data"], dtype=np.float32).reshape(outputs["y"]["shape"])
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
        raise RuntimeError(f"infer {name}: output differs from onnxruntime in-process")


def run_wrk(
    url: str, body_file: Path, threads: int, connections: int, duration_s: float
) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk not found; run: bash bench/setup.sh")
    cmd = [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration_s))}s"]
    cmd += ["--timeout", "10s", "-s", str(POST_LUA), url, "--", str(body_file)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    if result["requests"] == 0:
        raise RuntimeError(f"wrk completed no request:\n{done.stdout}\n{done.stderr}")
    return result


def wrk_row(label: str, result: dict[str, Any]) -> Latency:
    errors = int(result["non_2xx"]) + int(result["socket_errors"])
    return Latency(label, result["p50_ms"], result["p99_ms"], result["requests_per_s"], errors)


def time_calls(call: Callable[[], object], duration_s: float) -> Latency:
    """p50/p99 of ``call`` over ``duration_s`` seconds of back-to-back calls."""
    samples: list[int] = []
    start = time.perf_counter_ns()
    stop = start + int(duration_s * 1e9)
    while True:
        before = time.perf_counter_ns()
        call()
        after = time.perf_counter_ns()
        samples.append(after - before)
        if after >= stop:
            break
    elapsed_s = (time.perf_counter_ns() - start) / 1e9
    ms = np.asarray(samples, dtype=np.float64) / 1e6
    p50, p99 = np.percentile(ms, [50, 99])
    return Latency("", float(p50), float(p99), len(samples) / elapsed_s)


def cold_http(client: httpx.Client, name: str, body: dict[str, Any], reps: int) -> list[float]:
    samples: list[float] = []
    for rep in range(reps):
        unload = client.post(f"/v2/repository/models/{name}/unload")
        if unload.status_code != 200:
            print(
                f"warning: unload {name} (rep {rep}) -> {unload.status_code} {unload.text[:200]}",
                file=sys.stderr,
            )
        if model_is_ready(client, name):
            raise RuntimeError(f"{name} still ready after unload; cold start cannot be measured")
        client.get("/health/live")  # keep the connection warm, so only the model is cold
        start = time.perf_counter()
        response = client.post(f"/v2/models/{name}/infer", json=body)
        samples.append((time.perf_counter() - start) * 1e3)
        if response.status_code != 200:
            raise RuntimeError(f"cold infer {name}: {response.status_code} {response.text[:500]}")
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


def wrk_version() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        return "missing"
    out = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
    first = (out.stdout or out.stderr).splitlines()
    return first[0].split(" Copyright")[0] if first else "unknown"


def report(rows: list[Latency], cold: list[ColdStart], args: argparse.Namespace) -> str:
    lines = [
        "## HTTP benchmark: MLP 64-256-64 FP32, one row per request",
        "",
        f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.platform()}; "
        f"{os.cpu_count()} CPUs; Python {platform.python_version()}; "
        f"onnxruntime {ort.__version__}; {wrk_version()}",
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
    lines += [
        "",
        f"Coordination overhead of a cold start (difference of medians): {overhead:.2f} ms.",
        "",
    ]
    return "\n".join(lines)


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
        help="serve with max_batch_size = 1 instead of the server default",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk not found; run: bash bench/setup.sh", file=sys.stderr)
        return 2
    model_input = one_row()
    with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
        workdir = Path(tmp)
        config = write_config(workdir, args.batching)
        body = infer_body(model_input)
        body_file = workdir / "body.json"
        body_file.write_text(json.dumps(body), encoding="utf-8")
        reference = new_session(workdir / "mlp.onnx")
        expected = reference.run(None, {"x": model_input})[0]

        daemon = Daemon(args.python, config)
        try:
            base = f"http://127.0.0.1:{daemon.http_port}"
            print(f"daemon up: http={daemon.http_port} grpc={daemon.grpc_port}", file=sys.stderr)
            with httpx.Client(base_url=base, timeout=60.0) as client:
                wait_ready(client, "/health/ready")
                wait_ready(client, f"/v2/models/{HOT_MODEL}/ready")
                check_infer(client, HOT_MODEL, model_input, expected)
                for _ in range(200):
                    client.post(f"/v2/models/{HOT_MODEL}/infer", json=body)

                url = f"{base}/v2/models/{HOT_MODEL}/infer"
                rows: list[Latency] = []
                for threads, connections in ((1, 1), (2, 64)):
                    run_wrk(
                        url, body_file, threads, connections, min(2.0, args.duration)
                    )  # warm-up
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
                        cold_http(client, COLD_MODEL, body, args.cold_reps),
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
            code = daemon.stop()
            if code not in (0, -signal.SIGTERM):
                print(f"warning: daemon exited with {code}:\n{daemon.tail()}", file=sys.stderr)

    markdown = report(rows, cold, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
