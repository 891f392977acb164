"""HTTP servers for the inference path, measured side by side (issue 19, part 3).

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_http_servers.py [--rounds 3] [--duration 4] [--out FILE]

Installs ``granian`` into the running interpreter's environment if it is missing (it is a
benchmark-only dependency). Three servers answer the same request, a one-row FP32 [1, 64] JSON
inference body, with the same 64-float JSON answer, one process each, on loopback:

  ``uvicorn``     a minimal ASGI app (read the body, parse it with orjson, answer a constant
                  JSON) under uvicorn with httptools and uvloop, as the daemon runs uvicorn
  ``granian``     the same ASGI app under granian (Rust HTTP/1.1, one worker, uvloop)
  ``daemon``      the daemon itself, ``null-64`` preloaded: its own protocol answers inference
                  without an ASGI cycle, and the request really goes through the engine

plus the daemon again with ``Connection: close`` on every request (``daemon, no keep-alive``):
what a new TCP connection per request costs. Each round runs every server at c1 (wrk -t1) and
c64 (wrk -t2), in an order rotated every round, 1 s warm-up then ``--duration`` s measured.
Prints a markdown table of medians (req/s, p50) and each server's ratio to uvicorn in the same
round.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from harness import (
    Daemon,
    random_rows,
    rounds_report,
    versus_table,
    wait_loaded,
    write_body,
    wrk_point,
)
from models import write_null64_daemon

GRANIAN = "granian==2.8.7"
APP = '''
import orjson
ANSWER = orjson.dumps({"model_name": "null-64", "model_version": "1", "outputs": [
    {"name": "y", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]})
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    orjson.loads(body)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})
'''
PATH = "/v2/models/null-64/infer"


def ensure_granian() -> None:
    if importlib.util.find_spec("granian") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", GRANIAN], check=True)


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.post(url, content=b"{}", timeout=2)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_asgi(kind: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if kind == "uvicorn":
        cmd = [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port",
               str(port), "--http", "httptools", "--loop", "uvloop", "--no-access-log",
               "--log-level", "warning"]
    else:
        cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1", "--loop", "uvloop", "--no-access-log",
               "--log-level", "warning", "app:app"]
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}{PATH}"
    wait_http(url)
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ensure_granian()
    servers = ("uvicorn", "granian", "daemon", "daemon, no keep-alive")
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "app.py").write_text(APP)
        config = write_null64_daemon(folder)
        body = folder / "body.json"
        write_body(body, random_rows(1, 64))
        daemon = Daemon(sys.executable, config)
        processes: dict[str, subprocess.Popen[bytes]] = {}
        try:
            with httpx.Client(base_url=daemon.base_url) as client:
                wait_loaded(client, "null-64")
            urls = {"daemon": daemon.base_url + PATH}
            for kind in ("uvicorn", "granian"):
                processes[kind], urls[kind] = start_asgi(kind, folder)
            for index in range(args.rounds):
                order = servers[index % 4:] + servers[:index % 4]
                for concurrency in (1, 64):
                    for server in order:
                        close = server.endswith("no keep-alive")
                        url = urls["daemon" if close else server]
                        results.setdefault((server, concurrency), []).append(wrk_point(
                            url, body, concurrency, args.duration,
                            {"Connection": "close"} if close else None))
        finally:
            for proc in processes.values():
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=20)
            daemon.stop_and_warn()
    table = versus_table(results, servers, "rps", "req/s ÷ uvicorn")
    rounds_report(args.rounds, args.duration, table, args.out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
