"""Shared pieces of the benchmark scripts (``run_http.py``, ``run_batching.py``,
``run_torch.py``, ``run_protocols.py``, ``run_memory.py``, ``run_compare.py``,
``run_replicas.py``, ``run_auth.py``, ``run_metrics.py``, ``run_coldstart.py``).

- :class:`Daemon`: ``python -m snoozeml serve`` as a child process on ephemeral ports; every log
  line can also go to a callback (for scripts that count log events).
- HTTP helpers: wait for readiness, read a model's state, check one inference against
  onnxruntime, read ``/admin/status``.
- The three ways to send one OIP inference: JSON HTTP, binary HTTP (the binary tensor data
  extension) and gRPC (``raw_input_contents``), as pre-encoded requests and their decoders.
- wrk: run ``post.lua`` against a URL (JSON or binary-extension body, optionally with extra
  headers such as credentials) and parse its one-line JSON summary.
- In-process timing of onnxruntime calls and of any call, a process's memory lines (VmRSS,
  VmHWM and resetting it), a one-line machine description and the command line for reports.

Plain functions and small dataclasses; the scripts import them with ``from harness import …``
(the script's own folder is first on ``sys.path`` when it runs).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import psutil

BENCH_DIR = Path(__file__).resolve().parent
POST_LUA = BENCH_DIR / "post.lua"
STARTED = re.compile(r"\bserver_started\b.*?\bhttp_port=(\d+)(?:.*?\bgrpc_port=(\d+))?")


@dataclass(frozen=True)
class Latency:
    """One row of a latency table; times in milliseconds."""

    label: str
    p50_ms: float
    p99_ms: float
    per_s: float
    errors: int = 0


class Daemon:
    """``python -m snoozeml serve`` as a child process; ports parsed from its log."""

    def __init__(
        self,
        python: str,
        config: Path,
        start_timeout_s: float = 60.0,
        on_line: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._on_line = on_line  # called with every log line, on the reader thread
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
            env=env,
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

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.log.append(line.rstrip("\n"))
            if self._on_line is not None:
                self._on_line(line.rstrip("\n"))
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

    def stop_and_warn(self) -> None:
        """Stop; print the log tail to stderr if the exit was not a clean SIGTERM exit."""
        code = self.stop()
        if code not in (0, -signal.SIGTERM):
            print(f"warning: daemon exited with {code}:\n{self.tail()}", file=sys.stderr)


# --- inputs and in-process onnxruntime ---------------------------------------------------


def random_rows(rows: int, width: int, seed: int = 7) -> np.ndarray:
    """A fixed-seed FP32 [rows, width] input in [-1, 1], rounded to 4 decimals (so its JSON
    text is short and parses back to the same float32 values)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, size=(rows, width)).round(4).astype(np.float32)


def infer_body(model_input: np.ndarray, name: str = "x") -> dict[str, Any]:
    """An OIP JSON infer request with one FP32 input."""
    data = [float(v) for v in model_input.reshape(-1)]
    return {
        "inputs": [
            {"name": name, "shape": list(model_input.shape), "datatype": "FP32", "data": data}
        ]
    }


def write_body(path: Path, model_input: np.ndarray) -> dict[str, Any]:
    """Write the infer body for ``model_input`` to ``path`` (for wrk) and return it."""
    body = infer_body(model_input)
    path.write_text(json.dumps(body), encoding="utf-8")
    return body


def session_options(intra_op_threads: int = 1) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return opts


def new_session(path: Path, intra_op_threads: int = 1) -> ort.InferenceSession:
    return ort.InferenceSession(
        str(path), session_options(intra_op_threads), providers=["CPUExecutionProvider"]
    )


def summarize(label: str, samples_ns: Sequence[int], elapsed_s: float, errors: int = 0) -> Latency:
    """p50/p99 of ``samples_ns`` (nanoseconds) in ms; ``per_s`` is samples per second of
    ``elapsed_s``."""
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p99 = np.percentile(ms, [50, 99]) if len(ms) else (float("nan"), float("nan"))
    return Latency(label, float(p50), float(p99), len(ms) / elapsed_s, errors)


def time_calls(call: Callable[[], object], duration_s: float) -> Latency:
    """p50/p99 of ``call`` over ``duration_s`` seconds of back-to-back calls; ``per_s`` is
    calls per second."""
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
    return summarize("", samples, (time.perf_counter_ns() - start) / 1e9)


def time_count(call: Callable[[], object], count: int, label: str = "") -> Latency:
    """p50/p99 of ``count`` back-to-back calls of ``call``; ``per_s`` is calls per second."""
    samples: list[int] = []
    start = time.perf_counter_ns()
    for _ in range(count):
        before = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - before)
    return summarize(label, samples, (time.perf_counter_ns() - start) / 1e9)


# --- HTTP --------------------------------------------------------------------------------


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


def model_state(client: httpx.Client, name: str) -> str:
    """The model's repository-index state (READY, UNLOADED, LOADING, ...).

    Not ``/v2/models/{name}/ready``: SnoozeML reports a cold model as ready, since the next
    request loads it.
    """
    response = client.post("/v2/repository/index", json={})
    response.raise_for_status()
    for entry in response.json():
        if entry["name"] == name:
            return str(entry["state"])
    raise RuntimeError(f"{name} is not in the repository index")


def wait_loaded(client: httpx.Client, name: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (state := model_state(client, name)) != "READY":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not loaded after {timeout_s}s (state {state})")
        time.sleep(0.05)


def check_infer(
    client: httpx.Client,
    name: str,
    model_input: np.ndarray,
    expected: np.ndarray,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> None:
    """One request, checked against in-process onnxruntime, so wrk never times wrong answers."""
    response = client.post(f"/v2/models/{name}/infer", json=infer_body(model_input))
    if response.status_code != 200:
        raise RuntimeError(f"infer {name}: {response.status_code} {response.text[:500]}")
    outputs = {out["name"]: out for out in response.json()["outputs"]}
    got = np.asarray(outputs["y"]["data"], dtype=np.float32).reshape(outputs["y"]["shape"])
    check_output(f"infer {name}", got, expected, rtol, atol)


def model_status(client: httpx.Client, name: str) -> dict[str, Any]:
    """The model's entry in ``GET /admin/status``."""
    response = client.get("/admin/status")
    response.raise_for_status()
    for entry in response.json()["models"]:
        if entry["name"] == name:
            return dict(entry)
    raise RuntimeError(f"{name} is not in /admin/status")


def wait_idle(client: httpx.Client, name: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Poll ``/admin/status`` until the model has nothing in flight or queued; return the
    entry (so counters read after a wrk run include the requests wrk left in flight)."""
    deadline = time.monotonic() + timeout_s
    while True:
        entry = model_status(client, name)
        if not entry.get("in_flight") and not entry.get("queued"):
            return entry
        if time.monotonic() > deadline:
            print(f"warning: {name} still busy after {timeout_s}s: {entry}", file=sys.stderr)
            return entry
        time.sleep(0.02)


# --- OIP requests: JSON HTTP, binary HTTP, gRPC -------------------------------------------
# Each request is encoded once by the caller and sent many times; each decoder turns a response
# back into the numpy array of one output, which is what a client needs from it.

OIP_DATATYPES: dict[np.dtype[Any], str] = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.int64): "INT64",
}
NUMPY_DATATYPES: dict[str, np.dtype[Any]] = {oip: dtype for dtype, oip in OIP_DATATYPES.items()}


def _tensor_header(name: str, model_input: np.ndarray) -> dict[str, Any]:
    return {
        "name": name,
        "shape": list(model_input.shape),
        "datatype": OIP_DATATYPES[model_input.dtype],
    }


def json_request(model_input: np.ndarray, name: str = "x") -> bytes:
    """A JSON infer body for one input. orjson writes each value in its shortest form
    (``-0.1234``, not ``-0.12340000271797180``), so this is the smallest JSON body a client
    could send."""
    tensor = {**_tensor_header(name, model_input), "data": np.ascontiguousarray(model_input)}
    return orjson.dumps({"inputs": [tensor]}, option=orjson.OPT_SERIALIZE_NUMPY)


def binary_request(
    model_input: np.ndarray, name: str = "x", output: str = "y"
) -> tuple[bytes, int]:
    """A binary-extension infer body (JSON header, then the raw input) asking for ``output``
    in binary; returns the body and the value of ``Inference-Header-Content-Length``."""
    raw = np.ascontiguousarray(model_input).astype(model_input.dtype.newbyteorder("<")).tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {**_tensor_header(name, model_input), "parameters": {"binary_data_size": len(raw)}}
            ],
            "outputs": [{"name": output, "parameters": {"binary_data": True}}],
        }
    )
    return header + raw, len(header)


def http_output(body: bytes, header_length: str | None, output: str = "y") -> np.ndarray:
    """One output of an HTTP infer response, JSON or binary (``header_length`` is the
    response's ``Inference-Header-Content-Length``, None for plain JSON)."""
    if header_length is None:
        doc, binary = orjson.loads(body), memoryview(b"")
    else:
        split = int(header_length)
        doc, binary = orjson.loads(body[:split]), memoryview(body)[split:]
    offset = 0
    for tensor in doc["outputs"]:
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if tensor["name"] == output:
            dtype = NUMPY_DATATYPES[tensor["datatype"]]
            if size is None:
                decoded: np.ndarray = np.asarray(tensor["data"], dtype=dtype)
                return decoded.reshape(tensor["shape"])
            data = np.frombuffer(binary[offset : offset + size], dtype=dtype.newbyteorder("<"))
            return data.reshape(tensor["shape"])
        offset += size or 0
    raise RuntimeError(f"response has no output {output!r}: {list(doc)}")


def grpc_request(model: str, model_input: np.ndarray, name: str = "x") -> Any:
    """A ``ModelInferRequest`` carrying the input in ``raw_input_contents``."""
    from snoozeml.proto import inference_pb2 as pb

    raw = np.ascontiguousarray(model_input).astype(model_input.dtype.newbyteorder("<")).tobytes()
    tensor = pb.ModelInferRequest.InferInputTensor(**_tensor_header(name, model_input))
    return pb.ModelInferRequest(model_name=model, inputs=[tensor], raw_input_contents=[raw])


def grpc_output(response: Any, output: str = "y") -> np.ndarray:
    """One output of a ``ModelInferResponse`` (from ``raw_output_contents``)."""
    for index, tensor in enumerate(response.outputs):
        if tensor.name == output:
            dtype = NUMPY_DATATYPES[tensor.datatype].newbyteorder("<")
            data = np.frombuffer(response.raw_output_contents[index], dtype=dtype)
            return data.reshape(tuple(tensor.shape))
    raise RuntimeError(f"response has no output {output!r}")


def grpc_channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def check_output(
    label: str, got: np.ndarray, expected: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5
) -> None:
    """Raise unless ``got`` matches onnxruntime's ``expected`` (so nothing wrong is timed)."""
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=rtol, atol=atol):
        diff = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else None
        raise RuntimeError(
            f"{label}: output differs from onnxruntime in-process "
            f"(shape {got.shape} vs {expected.shape}, max abs diff {diff})"
        )


# --- wrk ---------------------------------------------------------------------------------


def run_wrk(
    url: str,
    body_file: Path,
    threads: int,
    connections: int,
    duration_s: float,
    header_length: int | None = None,
    extra_headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``wrk -tT -cC -dD [-H "Name: value" ...] -s post.lua URL -- BODY [HEADER_LENGTH]``;
    returns post.lua's JSON summary. With ``header_length`` the body is a binary-extension body
    (see :func:`binary_request`) and post.lua sends ``Inference-Header-Content-Length``.
    ``extra_headers`` go on every request (credentials, say); post.lua keeps them."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk not found; run: bash bench/setup.sh")
    cmd = [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration_s))}s"]
    for name, value in (extra_headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]
    cmd += ["--timeout", "10s", "-s", str(POST_LUA), url, "--", str(body_file)]
    if header_length is not None:
        cmd.append(str(header_length))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    if result["requests"] == 0:
        raise RuntimeError(f"wrk completed no request:\n{done.stdout}\n{done.stderr}")
    return result


def wrk_point(url: str, body_file: Path, concurrency: int, duration_s: float,
              extra_headers: Mapping[str, str] | None = None) -> dict[str, float]:
    """One measured wrk run after 1 s of warm-up (``-t1`` at c1, ``-t2`` above): req/s, p50 ms
    and errors."""
    threads = 1 if concurrency == 1 else 2
    run_wrk(url, body_file, threads, concurrency, 1, extra_headers=extra_headers)
    result = run_wrk(url, body_file, threads, concurrency, duration_s,
                     extra_headers=extra_headers)
    return {"rps": float(result["requests_per_s"]), "p50": float(result["p50_ms"]),
            "errors": float(wrk_errors(result))}


def versus_table(results: Mapping[tuple[str, int], Sequence[Mapping[str, float]]],
                 cases: Sequence[str], metric: str, label: str) -> list[str]:
    """Markdown rows of `wrk_point`-shaped runs per (case, concurrency): median req/s and
    p50, each round's `metric` ("rps" or "p50") over the first case's, and errors."""
    table = [f"| case | c | req/s (median) | p50 ms (median) | {label}, per round | errors |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    for concurrency in sorted({c for _, c in results}):
        first = results[(cases[0], concurrency)]
        for case in cases:
            runs = results[(case, concurrency)]
            ratios = ", ".join(f"{r[metric] / f[metric]:.2f}"
                               for r, f in zip(runs, first, strict=True))
            table.append(
                f"| {case} | {concurrency} | {statistics.median(r['rps'] for r in runs):,.0f} | "
                f"{statistics.median(r['p50'] for r in runs):.3f} | {ratios} | "
                f"{int(sum(r['errors'] for r in runs))} |")
    return table


def rounds_report(rounds: int, duration_s: float, table: list[str], out: Path | None) -> None:
    """Print a report: the machine and command lines, the rounds, then `table`'s lines; also
    write it to `out` when given."""
    lines = [f"- {machine_line()}", f"- command: `{command_line()}`",
             f"- {rounds} round(s), {duration_s:g} s measured per run, after 1 s", "", *table]
    report = "\n".join(lines)
    print(report)
    if out is not None:
        out.write_text(report + "\n")


def wrk_errors(result: dict[str, Any]) -> int:
    return int(result["non_2xx"]) + int(result["socket_errors"])


def wrk_row(label: str, result: dict[str, Any]) -> Latency:
    return Latency(
        label, result["p50_ms"], result["p99_ms"], result["requests_per_s"], wrk_errors(result)
    )


def wrk_version() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        return "missing"
    out = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
    first = (out.stdout or out.stderr).splitlines()
    return first[0].split(" Copyright")[0] if first else "unknown"


# --- processes ---------------------------------------------------------------------------


def median_or_nan(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float], fmt: str) -> str:
    """`median (min to max)` in `fmt`; an em dash for no values."""
    if not values:
        return "—"
    middle = median_or_nan(values)
    return f"{middle:{fmt}} ({min(values):{fmt}} to {max(values):{fmt}})"


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process has used so far."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def status_bytes(key: str, pid: int | str = "self") -> int | None:
    """A memory line of `/proc/PID/status` (VmRSS, VmHWM) in bytes; None without one."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return None


def reset_peak(pid: int | str = "self") -> None:
    """Reset the process's VmHWM to its RSS now (Linux), so VmHWM then reads the peak since."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


# --- report header -----------------------------------------------------------------------


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or "unknown CPU"
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def command_line() -> str:
    """How this script was started, for the report (the interpreter relative to the current
    folder when it lies inside it)."""
    python = sys.executable
    relative = os.path.relpath(python)
    return shlex.join([python if relative.startswith("..") else relative, *sys.argv])


def machine_line() -> str:
    """Date, platform, CPUs, CPU model, Python, onnxruntime and wrk versions, load average."""
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.platform()}; "
        f"{os.cpu_count()} CPUs ({cpu_model()}); Python {platform.python_version()}; "
        f"onnxruntime {ort.__version__}; {wrk_version()}; load average at start {load}"
    )
