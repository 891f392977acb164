"""HTTP servers for the inference path, measured side by side (issue 19, part 3).

Installs ``granian`` into the running interpreter's environment if it is missing (a
benchmark-only dependency). Three servers answer the same request, a one-row FP32 [1, 64] JSON
inference body, with the same 64-float JSON answer, one process each, on loopback: ``uvicorn``
(a minimal ASGI app: read the body, parse it with orjson, answer a constant, under uvicorn with
httptools and uvloop, as the daemon runs uvicorn), ``granian`` (the same app, one worker,
uvloop) and ``daemon`` (``null-64`` preloaded: its own protocol answers inference without an
ASGI cycle, and the request really goes through the engine); plus the daemon with
``Connection: close`` on every request (``daemon, no keep-alive``). Each round runs every server
at each ``--concurrency`` (wrk ``-t1`` at c1, ``-t2`` above) in an order rotated every round,
``--warm-up`` then ``--duration`` seconds. The table gives medians and each server's ratio to
uvicorn in the same round.
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from harness.cli import Bench
from harness.daemon import free_port
from harness.load import wrk_point
from harness.oip import random_rows, write_body
from harness.report import Outcome
from harness.rounds import rotate, versus_table
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
SERVERS = ("uvicorn", "granian", "daemon", "daemon, no keep-alive")


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.post(url, content=b"{}", timeout=2)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # polling for the server to bind


@contextlib.contextmanager
def asgi(kind: str, folder: Path) -> Iterator[str]:
    """``app.py`` under uvicorn or granian on a free port; its inference URL."""
    port = free_port()
    common = ["--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop",
              "--no-access-log", "--log-level", "warning"]
    if kind == "uvicorn":
        cmd = [sys.executable, "-m", "uvicorn", "app:app", *common, "--http", "httptools"]
    else:
        cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--workers", "1",
               *common, "app:app"]
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}{PATH}"
        wait_http(url)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def run(bench: Bench) -> Outcome:
    args, folder = bench.args, bench.workdir
    if importlib.util.find_spec("granian") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", GRANIAN], check=True)
    (folder / "app.py").write_text(APP)
    body = folder / "body.json"
    write_body(body, random_rows(1, 64))
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        daemon = stack.enter_context(bench.serve(write_null64_daemon(folder), ["null-64"]))
        urls = {"daemon": daemon.base_url + PATH,
                **{kind: stack.enter_context(asgi(kind, folder))
                   for kind in ("uvicorn", "granian")}}
        for index in range(args.rounds):
            for concurrency in args.concurrency:
                for server in rotate(SERVERS, index):
                    close = server.endswith("no keep-alive")
                    results.setdefault((server, concurrency), []).append(wrk_point(
                        urls["daemon" if close else server], body, concurrency, args.duration,
                        {"Connection": "close"} if close else None, args.warm_up))
    table = versus_table(results, SERVERS, "rps", "req/s ÷ uvicorn")
    lines = bench.header("## HTTP servers: one JSON inference under uvicorn, granian and the "
                         "daemon",
                         f"{args.rounds} round(s), {args.duration:g} s measured per run, after "
                         f"{args.warm_up:g} s")
    return Outcome("\n".join(lines + table) + "\n", {"results": {
        f"{case} c{c}": runs for (case, c), runs in results.items()}})
