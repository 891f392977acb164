"""Start-up time and idle memory: the daemon next to a bare Starlette app serving the same models.

Usage (from the repository root)::

    .venv/bin/python bench/startup.py [--rounds 5] [--python PYTHON] [--out FILE]

Two small ONNX models (the HTTP benchmark's MLP 64 -> 256 -> 64, two seeds) are written into a
temporary folder. Then, alternately for ``--rounds`` rounds, so that drift hits both alike:

- **daemon**: ``python -m snoozeml serve -c models.toml --http-port 0 --grpc-port 0`` (the two
  models, the defaults otherwise: lazy loads, one intra-op thread, a weights cache folder of
  its own in the temporary folder). The HTTP port comes from its ``server_started`` log line.
- **starlette**: uvicorn + Starlette + onnxruntime, the two models loaded into
  ``InferenceSession`` s (one intra-op thread) before the app serves, a ``/health/ready`` route and
  a ``POST /infer/NAME`` route per model taking the daemon's JSON body. It prints the same kind of
  ``server_started http_port=N`` line once bound.

For each: the time from spawn to the first 200 from ``GET /health/ready`` (polled every 5 ms),
then one inference per model, then the process's VmRSS once it has settled (read every 50 ms
until 10 readings in a row stay within 64 KiB of each other, at most 10 s). Prints the medians
and the ratios daemon / starlette as markdown; ``--out FILE`` writes it there too.

Every contender starts once, untimed, before the rounds: the daemon writes its weights cache
entries then, and Python its bytecode. Bytecode goes to a cache folder in the temporary folder
(``PYTHONPYCACHEPREFIX``, with ``PYTHONDONTWRITEBYTECODE`` unset), so that the daemon run from
a source tree starts as an installed one does, its modules compiled once, as the libraries both
contenders import are. ``--no-bytecode-cache`` keeps the environment's setting instead: with
``PYTHONDONTWRITEBYTECODE=1`` and a source tree, the daemon compiles its modules at every start.

``--python`` chooses the interpreter (default: this one); ``PYTHONPATH`` passes through, so a
worktree of an older commit is measured with ``PYTHONPATH=/tmp/base/src``. ``--label`` names the
daemon's row, and ``--pythonpath-base DIR`` adds a second daemon row run from DIR/src (an older
tree) in the same alternation.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import BENCH_MLP_DIMS, write_bench_mlp

MODELS = ("mlp-a", "mlp-b")
STARTED = re.compile(r"\bserver_started\b.*?\bhttp_port=(\d+)")

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


def write_models(folder: Path) -> Path:
    """The two models and a models.toml serving them; returns the config's path."""
    entries = []
    for seed, name in enumerate(MODELS):
        write_bench_mlp(folder / f"{name}.onnx", seed=seed)
        entries.append(f'[[models]]\nname = "{name}"\npath = "{name}.onnx"\n')
    config = folder / "models.toml"
    config.write_text('[server]\ncache_dir = "cache"\n\n' + "\n".join(entries), encoding="utf-8")
    return config


def infer_body() -> bytes:
    width = BENCH_MLP_DIMS[0]
    data = np.linspace(-1.0, 1.0, width, dtype=np.float32).tolist()
    import json

    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, width],
                                   "data": data}]}).encode()


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def settled_rss(pid: int, window: int = 10, tolerance: int = 64 * 1024,
                timeout_s: float = 10.0) -> int:
    """VmRSS once `window` readings 50 ms apart stay within `tolerance` of each other."""
    readings: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        readings.append(vm_rss(pid))
        recent = readings[-window:]
        if len(recent) == window and max(recent) - min(recent) <= tolerance:
            return recent[-1]
        if time.monotonic() > deadline:
            return recent[-1]
        time.sleep(0.05)  # a sampling interval, not a synchronisation


def measure(contender: Contender, body: bytes, timeout_s: float = 60.0) -> Sample:
    start = time.perf_counter()
    proc = subprocess.Popen(contender.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=contender.env)
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
    try:
        if not found.wait(timeout_s) or not port:
            raise RuntimeError(f"{contender.label}: no server_started line:\n{''.join(log)}")
        url = f"http://127.0.0.1:{port[0]}"
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
                answer = client.post(url + contender.infer_path.format(name=name), content=body,
                                     headers={"content-type": "application/json"})
                answer.raise_for_status()
        return Sample(ready_s, settled_rss(proc.pid))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def contenders(python: str, folder: Path, config: Path, label: str,
               base: Path | None, bytecode_cache: bool) -> list[Contender]:
    app = folder / "bare_starlette.py"
    app.write_text(STARLETTE_APP, encoding="utf-8")
    serve = [python, "-m", "snoozeml", "serve", "-c", str(config), "--host", "127.0.0.1",
             "--http-port", "0", "--grpc-port", "0"]
    env = dict(os.environ)
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    result = [Contender(label, serve, env, "/v2/models/{name}/infer")]
    if base is not None:
        base_env = {**env, "PYTHONPATH": str(base / "src")}
        result.append(Contender(f"daemon @ {base.name}", serve, base_env,
                                "/v2/models/{name}/infer"))
    result.append(Contender(
        "starlette", [python, str(app), *(f"{n}={folder / n}.onnx" for n in MODELS)], env,
        "/infer/{name}"))
    return result


def report(samples: dict[str, list[Sample]], rounds: int, bytecode_cache: bool) -> str:
    bare = samples["starlette"]
    bare_ready = statistics.median(s.ready_s for s in bare)
    bare_rss = statistics.median(s.rss_bytes for s in bare)
    lines = [
        f"Start-up and idle RSS, {rounds} rounds alternated, medians "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; bytecode "
        f"{'cached' if bytecode_cache else 'as the environment says'})",
        "",
        "| | health ready (s) | idle RSS (MiB) | ready ÷ starlette | RSS ÷ starlette |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, rows in samples.items():
        ready = statistics.median(s.ready_s for s in rows)
        rss = statistics.median(s.rss_bytes for s in rows)
        lines.append(f"| {label} | {ready:.3f} | {rss / 2**20:.1f} | {ready / bare_ready:.2f} | "
                     f"{rss / bare_rss:.2f} |")
    lines += ["", "Every round (ready s / RSS MiB):", ""]
    for label, rows in samples.items():
        lines.append(f"- {label}: " + ", ".join(
            f"{s.ready_s:.3f}/{s.rss_bytes / 2**20:.1f}" for s in rows))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--label", default="daemon")
    parser.add_argument("--pythonpath-base", type=Path, default=None,
                        help="also run the daemon from DIR/src (an older worktree)")
    parser.add_argument("--no-bytecode-cache", dest="bytecode_cache", action="store_false",
                        help="keep the environment's PYTHONDONTWRITEBYTECODE")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    body = infer_body()
    with tempfile.TemporaryDirectory(prefix="snooze-startup-") as tmp:
        folder = Path(tmp)
        config = write_models(folder)
        runners = contenders(args.python, folder, config, args.label, args.pythonpath_base,
                             args.bytecode_cache)
        samples: dict[str, list[Sample]] = {c.label: [] for c in runners}
        for contender in runners:  # weights cache entries and bytecode written, untimed
            measure(contender, body)
        for _ in range(args.rounds):
            for contender in runners:
                samples[contender.label].append(measure(contender, body))
    text = report(samples, args.rounds, args.bytecode_cache)
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
