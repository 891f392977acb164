"""gRPC inference next to its floor and next to HTTP (issue 19, part 4).

The floor is an empty grpc.aio servicer in its own process: ``ModelInfer`` answers every call
with the same pre-built FP32 [1, 64] response, decoding nothing and running nothing, on uvloop
like the daemon. The daemon serves ``null-64`` (one Relu, preloaded). Each round, in an order
reversed every other round: ``grpc_load.py`` (one grpc.aio channel, c calls in flight, its own
process) against the floor and against the daemon, and wrk with ``post.lua`` (JSON) against the
daemon, at each ``--concurrency``; ``--warm-up`` then ``--duration`` seconds. The table gives
medians and the daemon's ratio to the floor in each round.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from harness.cli import Bench
from harness.load import grpc_load, point_of, wrk_point
from harness.oip import random_rows, write_body
from harness.report import Outcome
from harness.rounds import alternate, versus_table
from models import write_null64_daemon

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
CASES = ("empty grpc.aio servicer", "daemon, gRPC", "daemon, JSON HTTP")


@contextlib.contextmanager
def empty_servicer(folder: Path) -> Iterator[str]:
    """The floor in its own process; its gRPC target."""
    (folder / "servicer.py").write_text(SERVICER)
    proc = subprocess.Popen([sys.executable, str(folder / "servicer.py")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield f"127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def run(bench: Bench) -> Outcome:
    args, folder = bench.args, bench.workdir
    body = folder / "body.json"
    write_body(body, random_rows(1, 64))
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with empty_servicer(folder) as floor, \
            bench.serve(write_null64_daemon(folder), ["null-64"]) as daemon:
        for index in range(args.rounds):
            for concurrency in args.concurrency:
                for case in alternate(CASES, index):
                    if case == "daemon, JSON HTTP":
                        point = wrk_point(daemon.infer_url("null-64"), body, concurrency,
                                          args.duration, warm_up_s=args.warm_up)
                    else:
                        target = floor if case.startswith("empty") else daemon.grpc_target
                        point = point_of(grpc_load(target, "null-64", 64, concurrency,
                                                   args.duration, args.warm_up))
                    results.setdefault((case, concurrency), []).append(point)
    table = versus_table(results, CASES, "p50", "p50 ÷ floor's")
    lines = bench.header("## gRPC next to its floor and next to HTTP",
                         f"{args.rounds} round(s), {args.duration:g} s measured per run, after "
                         f"{args.warm_up:g} s")
    return Outcome("\n".join(lines + table) + "\n", {"results": {
        f"{case} c{c}": runs for (case, c), runs in results.items()}})
