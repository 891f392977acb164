"""gRPC inference next to its floor and next to HTTP (issue 19, part 4).

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_grpc_floor.py [--rounds 3] [--duration 4] [--out FILE]

The floor is an empty grpc.aio servicer in its own process: ``ModelInfer`` answers every call
with the same pre-built FP32 [1, 64] response, decoding nothing and running nothing, on uvloop
like the daemon. The daemon serves ``null-64`` (one Relu, preloaded). Each round, in an order
reversed every other round: ``grpc_load.py`` (one grpc.aio channel, c calls in flight, its own
process) against the floor and against the daemon, and wrk with ``post.lua`` (JSON) against the
daemon, at c1 and c64; 1 s warm-up, ``--duration`` s measured. Prints a markdown table of
medians and the daemon's ratio to the floor in each round.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
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

BENCH = Path(__file__).resolve().parent
SERVICER = '''
import asyncio, sys
import grpc, numpy as np, uvloop
from snoozeml.proto import inference_pb2 as pb, inference_pb2_grpc as pb_grpc

ANSWER = pb.ModelInferResponse(model_name="null-64", model_version="1")
out = ANSWER.outputs.add(name="y", datatype="FP32")
out.shape.extend([1, 64])
ANSWER.raw_output_contents.append(np.full((1, 64), 0.5, np.float32).tobytes())

class Empty(pb_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):
        return ANSWER

async def main():
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Empty(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()

uvloop.run(main())
'''


def grpc_run(target: str, concurrency: int, seconds: float) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, str(BENCH / "grpc_load.py"), target, "null-64", "64", str(concurrency),
         str(seconds), "--warm-up", "1"], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for code, count in result["error_codes"].items():
        print(f"{target}: c{concurrency}: {count} call(s) ended {code}", file=sys.stderr)
    return {"rps": float(result["requests_per_s"]), "p50": float(result["p50_ms"]),
            "errors": float(result["errors"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cases = ("empty grpc.aio servicer", "daemon, gRPC", "daemon, JSON HTTP")
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = write_null64_daemon(folder)
        body = folder / "body.json"
        write_body(body, random_rows(1, 64))
        (folder / "servicer.py").write_text(SERVICER)
        empty = subprocess.Popen([sys.executable, str(folder / "servicer.py")],
                                 stdout=subprocess.PIPE, text=True)
        daemon = Daemon(sys.executable, config)
        try:
            assert empty.stdout is not None
            floor = f"127.0.0.1:{int(empty.stdout.readline())}"
            with httpx.Client(base_url=daemon.base_url) as client:
                wait_loaded(client, "null-64")
            for index in range(args.rounds):
                order = cases if index % 2 == 0 else cases[::-1]
                for concurrency in (1, 64):
                    for case in order:
                        if case == "daemon, JSON HTTP":
                            run = wrk_point(daemon.base_url + "/v2/models/null-64/infer", body,
                                            concurrency, args.duration)
                        else:
                            target = floor if case.startswith("empty") else daemon.grpc_target
                            run = grpc_run(target, concurrency, args.duration)
                        results.setdefault((case, concurrency), []).append(run)
        finally:
            empty.terminate()
            empty.wait(timeout=20)
            daemon.stop_and_warn()
    table = versus_table(results, cases, "p50", "p50 ÷ floor's")
    rounds_report(args.rounds, args.duration, table, args.out)


if __name__ == "__main__":
    main()
