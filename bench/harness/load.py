"""The load generators: wrk, driven by ``bench/post.lua`` (one body, JSON or binary extension)
or another Lua script that prints the same kind of JSON line, and ``bench/grpc_load.py``, a
grpc.aio client in its own process. Each returns the generator's one-line JSON summary."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent.parent
POST_LUA = BENCH_DIR / "post.lua"
GRPC_LOAD = BENCH_DIR / "grpc_load.py"


def wrk_threads(concurrency: int, chosen: int | None = None) -> int:
    """``chosen``, or the default: ``-t1`` at c1, ``-t2`` above."""
    return chosen if chosen is not None else (1 if concurrency == 1 else 2)


def run_wrk(
    url: str,
    body_file: Path,
    threads: int,
    connections: int,
    duration_s: float,
    header_length: int | None = None,
    extra_headers: Mapping[str, str] | None = None,
    *,
    script: Path = POST_LUA,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """``wrk -tT -cC -dD [-H "Name: value" ...] -s SCRIPT URL -- BODY [HEADER_LENGTH]``;
    returns the script's JSON summary. With ``header_length`` the body is a binary-extension
    body and post.lua sends ``Inference-Header-Content-Length``. ``extra_headers`` go on every
    request (credentials, say); post.lua keeps them."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk not found; run: bash bench/setup.sh")
    cmd = [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration_s))}s"]
    for name, value in (extra_headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]
    cmd += ["--timeout", f"{timeout_s:g}s", "-s", str(script), url, "--", str(body_file)]
    if header_length is not None:
        cmd.append(str(header_length))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    if result["requests"] == 0:
        raise RuntimeError(f"wrk completed no request:\n{done.stdout}\n{done.stderr}")
    result["errors"] = wrk_errors(result)
    return result


def wrk_errors(result: Mapping[str, Any]) -> int:
    """Non-2xx answers plus socket errors: anything but 0 makes a run invalid."""
    return int(result["non_2xx"]) + int(result["socket_errors"])


def wrk_point(url: str, body_file: Path, concurrency: int, duration_s: float,
              extra_headers: Mapping[str, str] | None = None,
              warm_up_s: float = 1.0) -> dict[str, float]:
    """One measured wrk run after ``warm_up_s`` of warm-up (``-t1`` at c1, ``-t2`` above):
    req/s, p50 ms and errors."""
    threads = wrk_threads(concurrency)
    run_wrk(url, body_file, threads, concurrency, warm_up_s, extra_headers=extra_headers)
    return point_of(run_wrk(url, body_file, threads, concurrency, duration_s,
                            extra_headers=extra_headers))


def grpc_load(target: str, model: str, width: int, concurrency: int, duration_s: float,
              warm_up_s: float, python: str = sys.executable) -> dict[str, Any]:
    """``grpc_load.py``: ``concurrency`` one-row ``ModelInfer`` calls in flight for
    ``warm_up_s`` then ``duration_s``; its summary (p50_ms, p99_ms, requests, duration_s,
    requests_per_s, errors, error_codes, client_cpu_s)."""
    cmd = [python, str(GRPC_LOAD), target, model, str(width), str(concurrency),
           str(duration_s), "--warm-up", str(warm_up_s)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"grpc_load failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    for code, count in result["error_codes"].items():
        print(f"{target}: c{concurrency}: {count} call(s) ended {code}", file=sys.stderr)
    return result


def wrk_version() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        return "missing"
    out = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
    first = (out.stdout or out.stderr).splitlines()
    return first[0].split(" Copyright")[0] if first else "unknown"


def point_of(result: Mapping[str, Any]) -> dict[str, float]:
    """A summary as the (req/s, p50, errors) point that :func:`rounds.versus_table` reads."""
    return {"rps": float(result["requests_per_s"]), "p50": float(result["p50_ms"]),
            "errors": float(result["errors"])}


