"""Start-up time and idle memory: the daemon next to a bare Starlette app serving the same models.

Two small ONNX models (the HTTP benchmark's MLP 64 -> 256 -> 64, two seeds). Then, alternately
for ``--rounds`` rounds, so that drift hits both alike: the **daemon** (``python -m snoozeml
serve`` with the two models and the defaults otherwise: lazy loads, one intra-op thread, a
weights cache folder of its own) and **starlette** (uvicorn + Starlette + onnxruntime, the two
models loaded into ``InferenceSession`` s before the app serves, a ``/health/ready`` route and
a ``POST /infer/NAME`` route per model taking the daemon's JSON body). For each: the time from
spawn to the first 200 from ``GET /health/ready`` (polled every 5 ms), then one inference per
model, then the process's VmRSS once it has settled (read every 50 ms until 10 readings in a
row stay within 64 KiB of each other, at most 10 s). The table gives the medians and the ratios
daemon / starlette.

Every contender starts once, untimed, before the rounds: the daemon writes its weights cache
entries then, and Python its bytecode. Bytecode goes to a cache folder in the scratch folder
(``PYTHONPYCACHEPREFIX``, with ``PYTHONDONTWRITEBYTECODE`` unset), so that the daemon run from
a source tree starts as an installed one does; ``--no-bytecode-cache`` keeps the environment's
setting instead. ``--python`` chooses the interpreter; ``PYTHONPATH`` passes through.
``--label`` names the daemon's row, and ``--pythonpath-base DIR`` adds a second daemon row run
from DIR/src (an older worktree) in the same alternation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from harness.cli import Bench
from harness.config import write_config
from harness.cpu import status_bytes
from harness.daemon import STARTED
from harness.report import Outcome, table
from models import BENCH_MLP_DIMS, write_bench_mlp

MODELS = ("mlp-a", "mlp-b")

STARLETTE_APP = textwrap.dedent('''
    """A bare Starlette app: the same models in InferenceSessions, one route per model."""
    import socket
    import sys

    import numpy as np
    import onnxruntime as ort
    import orjson
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    sessions = {}
    for arg in sys.argv[1:]:
        name, _, path = arg.partition("=")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        sessions[name] = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    async def ready(request: Request) -> Response:
        return Response(b'{"ready":true}', media_type="application/json")

    async def infer(request: Request) -> Response:
        session = sessions[request.path_params["name"]]
        doc = orjson.loads(await request.body())
        tensor = doc["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        (y,) = session.run(None, {"x": x})
        body = {"model_name": request.path_params["name"], "outputs": [
            {"name": "y", "datatype": "FP32", "shape": list(y.shape), "data": y.ravel()}]}
        return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
                        media_type="application/json")

    app = Starlette(routes=[Route("/health/ready", ready),
                            Route("/infer/{name}", infer, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    print(f"server_started http_port={sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])
''')


@dataclass(frozen=True)
class Sample:
    ready_s: float
    rss_bytes: int


@dataclass(frozen=True)
class Contender:
    label: str
    command: list[str]
    env: dict[str, str]
    infer_path: str  # formatted with the model's name


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--label", default="daemon", help="the daemon's row (daemon)")
    parser.add_argument("--pythonpath-base", type=Path, default=None,
                        help="also run the daemon from DIR/src (an older worktree)")
    parser.add_argument("--no-bytecode-cache", dest="bytecode_cache", action="store_false",
                        help="keep the environment's PYTHONDONTWRITEBYTECODE")


def infer_body() -> bytes:
    width = BENCH_MLP_DIMS[0]
    data = np.linspace(-1.0, 1.0, width, dtype=np.float32).tolist()
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, width],
                                   "data": data}]}).encode()


def settled_rss(pid: int, window: int = 10, tolerance: int = 64 * 1024,
                timeout_s: float = 10.0) -> int:
    """VmRSS once ``window`` readings 50 ms apart stay within ``tolerance`` of each other."""
    readings: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        readings.append(status_bytes("VmRSS", pid) or 0)
        recent = readings[-window:]
        if len(recent) == window and max(recent) - min(recent) <= tolerance:
            return recent[-1]
        if time.monotonic() > deadline:
            return recent[-1]
        time.sleep(0.05)  # a sampling interval, not a synchronisation


def started_port(proc: subprocess.Popen[str], label: str,
                 timeout_s: float) -> tuple[int, list[str]]:
    """The port of the process's ``server_started`` line, read on a thread; and its log."""
    port: list[int] = []
    found = threading.Event()
    log: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            match = STARTED.search(line)
            if match and not port:
                port.append(int(match.group(1)))
                found.set()
        found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(timeout_s) or not port:
        raise RuntimeError(f"{label}: no server_started line:\n{''.join(log)}")
    return port[0], log


def measure(contender: Contender, body: bytes, timeout_s: float = 60.0) -> Sample:
    start = time.perf_counter()
    proc = subprocess.Popen(contender.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=contender.env)
    try:
        port, log = started_port(proc, contender.label, timeout_s)
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=30.0) as client:
            while True:
                try:
                    if client.get(f"{url}/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.perf_counter() - start > timeout_s:
                    raise RuntimeError(f"{contender.label}: never ready:\n{''.join(log)}")
                time.sleep(0.005)  # polling interval
            ready_s = time.perf_counter() - start
            for name in MODELS:
                client.post(url + contender.infer_path.format(name=name), content=body,
                            headers={"content-type": "application/json"}).raise_for_status()
        return Sample(ready_s, settled_rss(proc.pid))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def contenders(bench: Bench, config: Path) -> list[Contender]:
    args, folder = bench.args, bench.workdir
    app = folder / "bare_starlette.py"
    app.write_text(STARLETTE_APP, encoding="utf-8")
    serve = [args.python, "-m", "snoozeml", "serve", "-c", str(config), "--host", "127.0.0.1",
             "--http-port", "0", "--grpc-port", "0"]
    env = dict(os.environ)
    if args.bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    result = [Contender(args.label, serve, env, "/v2/models/{name}/infer")]
    if (base := args.pythonpath_base) is not None:
        result.append(Contender(f"daemon @ {base.name}", serve,
                                {**env, "PYTHONPATH": str(base / "src")},
                                "/v2/models/{name}/infer"))
    result.append(Contender(
        "starlette", [args.python, str(app), *(f"{n}={folder / n}.onnx" for n in MODELS)], env,
        "/infer/{name}"))
    return result


def run(bench: Bench) -> Outcome:
    args, folder = bench.args, bench.workdir
    for seed, name in enumerate(MODELS):
        write_bench_mlp(folder / f"{name}.onnx", seed=seed)
    config = write_config(folder / "models.toml", [{"name": n, "path": f"{n}.onnx"}
                                                   for n in MODELS], server={"cache_dir": "cache"})
    body = infer_body()
    runners = contenders(bench, config)
    samples: dict[str, list[Sample]] = {c.label: [] for c in runners}
    for contender in runners:  # weights cache entries and bytecode written, untimed
        measure(contender, body)
    for _ in range(args.rounds):
        for contender in runners:
            samples[contender.label].append(measure(contender, body))
    bare_ready = statistics.median(s.ready_s for s in samples["starlette"])
    bare_rss = statistics.median(s.rss_bytes for s in samples["starlette"])
    rows = []
    for label, got in samples.items():
        ready = statistics.median(s.ready_s for s in got)
        rss = statistics.median(s.rss_bytes for s in got)
        rows.append((label, f"{ready:.3f}", f"{rss / 2**20:.1f}", f"{ready / bare_ready:.2f}",
                     f"{rss / bare_rss:.2f}"))
    lines = bench.header(
        f"## Start-up and idle RSS, {args.rounds} rounds alternated, medians "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; bytecode "
        f"{'cached' if args.bytecode_cache else 'as the environment says'})")
    lines += table(["", "health ready (s)", "idle RSS (MiB)", "ready ÷ starlette",
                    "RSS ÷ starlette"], rows)
    lines += ["", "Every round (ready s / RSS MiB):", ""]
    lines += [f"- {label}: " + ", ".join(f"{s.ready_s:.3f}/{s.rss_bytes / 2**20:.1f}"
                                         for s in got) for label, got in samples.items()]
    return Outcome("\n".join(lines) + "\n", {"samples": samples})
