"""A gRPC load generator in its own process, so the daemon's measurement doesn't share an
interpreter (or a GIL) with it; ``harness.load.grpc_load`` runs it (the ``throughput`` and
``grpc_floor`` scenarios).

Usage (from the repository root)::

    .venv/bin/python bench/grpc_load.py TARGET MODEL WIDTH CONCURRENCY DURATION [--warm-up S]

Keeps CONCURRENCY ``ModelInfer`` calls in flight on one grpc.aio channel (one HTTP/2
connection), each a pre-encoded one-row FP32 [1, WIDTH] request in ``raw_input_contents``, for
``--warm-up`` then DURATION seconds. Prints one JSON line like post.lua's: ``requests``,
``duration_s``, ``requests_per_s``, ``p50_ms``, ``p99_ms``, ``errors`` (calls that didn't end
OK, by status code in ``error_codes``), and ``client_cpu_s``, this process's CPU time (user +
system) over the measured window: when it is close to ``duration_s``, the client saturates a
core and its rate is a floor of what the daemon can serve.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np
from harness.oip import grpc_request, grpc_stub, random_rows


async def drive(
    stub: Any, request: Any, concurrency: int, duration_s: float
) -> tuple[list[int], collections.Counter[str], float]:
    """CONCURRENCY callers back to back for ``duration_s``: latencies (ns), error codes and
    the elapsed seconds."""
    samples: list[int] = []
    errors: collections.Counter[str] = collections.Counter()
    start = time.perf_counter_ns()
    stop = start + int(duration_s * 1e9)

    async def caller() -> None:
        while time.perf_counter_ns() < stop:
            before = time.perf_counter_ns()
            try:
                await stub.ModelInfer(request, timeout=30.0)
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] += 1
                continue
            samples.append(time.perf_counter_ns() - before)

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return samples, errors, (time.perf_counter_ns() - start) / 1e9


async def run(args: argparse.Namespace) -> dict[str, Any]:
    request = grpc_request(args.model, random_rows(1, args.width))
    async with grpc.aio.insecure_channel(args.target) as channel:
        stub = grpc_stub(channel)
        if args.warm_up > 0:
            await drive(stub, request, args.concurrency, args.warm_up)
        cpu_before = time.process_time()
        samples, errors, elapsed_s = await drive(stub, request, args.concurrency, args.duration)
        cpu_s = time.process_time() - cpu_before
    ms = np.asarray(samples, dtype=np.float64) / 1e6
    p50, p99 = np.percentile(ms, [50, 99]) if len(ms) else (float("nan"), float("nan"))
    return {
        "p50_ms": round(float(p50), 4),
        "p99_ms": round(float(p99), 4),
        "requests": len(samples),
        "duration_s": round(elapsed_s, 3),
        "requests_per_s": round(len(samples) / elapsed_s, 2),
        "errors": sum(errors.values()),
        "error_codes": dict(errors),
        "client_cpu_s": round(cpu_s, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", help="host:port of the daemon's gRPC server")
    parser.add_argument("model")
    parser.add_argument("width", type=int, help="FP32 values in the one-row input")
    parser.add_argument("concurrency", type=int, help="calls kept in flight")
    parser.add_argument("duration", type=float, help="measured seconds")
    parser.add_argument("--warm-up", type=float, default=1.0, help="seconds before (1)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
